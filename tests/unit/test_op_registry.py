"""The op registry: conditions, priority, the no-implementation error, overrides, caching and dispatch of the
cpu_fp32 linear (numerics of every implementation against torch_ref: tests/kernels/test_op_numerics.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.entrypoints.engine_processes import op_backends_line
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import LinearBase
from rapid_llm.ops.linear_kernel import LinearKernel
from rapid_llm.ops.cpu_half import CPU_FP32_LINEAR, MIN_FP32_ROWS, cpu_lacks_half_kernels
from rapid_llm.ops.norm import rms_norm as reference_rms_norm
from rapid_llm.ops.conditions import library_available
from rapid_llm.ops.op_case_inputs import SHAPES, CaseConfig
from rapid_llm.ops.op_cases import OP_CASES
from rapid_llm.ops.registry import OP_BACKEND_ENV, REGISTRY, NoImplementationError, OpRegistry, parse_op_backends
from rapid_llm.server_args import ServerArgs
from rapid_llm.utils.lazy_import import import_target

MISSING_LIB = "rapid_llm_stand_in_library_that_does_not_exist"


@dataclass
class FakeTensor:
    """What dispatch reads from a call's first argument; device and dtype may be any a test fakes."""

    device: str = "cpu"
    dtype: str = "float32"
    shape: tuple[int, ...] = (4, 8)


def two_implementations(conditions: dict[str, Any], registry: OpRegistry | None = None) -> OpRegistry:
    """A stand-in op "demo": backend "fast" (priority 10, under `conditions`) over an unconditional "ref"."""
    registry = registry or OpRegistry()
    registry.register(name="demo", backend="ref", fn=lambda x: "ref")
    registry.register(name="demo", backend="fast", fn=lambda x: "fast", priority=10, conditions=conditions)
    return registry


@pytest.fixture(autouse=True)
def no_overrides() -> None:
    yield
    REGISTRY.set_overrides({})


def test_device_condition() -> None:
    demo = two_implementations({"device": "cuda"}).op("demo")
    assert demo(FakeTensor(device="cuda")) == "fast"
    assert demo(FakeTensor(device="cpu")) == "ref"


@pytest.mark.parametrize(("device", "capability", "chosen"), [("cuda", (9, 0), "fast"), ("cuda", (8, 9), "ref"),
                                                             ("cpu", (9, 0), "ref")])
def test_sm_condition(device: str, capability: tuple[int, int], chosen: str) -> None:
    registry = two_implementations({"sm": ">=9.0"}, OpRegistry(capability=lambda _: capability))
    assert registry.op("demo")(FakeTensor(device=device)) == chosen


def test_sm_skip_reasons_name_the_capability() -> None:
    registry = two_implementations({"sm": ">=9.0"}, OpRegistry(capability=lambda _: (8, 0)))
    assert "needs sm >=9.0, the device is sm 8.0" in registry.select("demo", "cuda", "bf16").reason
    assert "sm >=9.0 needs a CUDA device, the call is on cpu" in registry.select("demo", "cpu", "bf16").reason


def test_dtype_condition() -> None:
    demo = two_implementations({"dtype": ["bf16", "fp16"]}).op("demo")
    assert demo(FakeTensor(dtype="bfloat16")) == "fast"
    assert demo(FakeTensor(dtype="float16")) == "fast"
    assert demo(FakeTensor(dtype="float32")) == "ref"


@pytest.mark.parametrize(("lib", "chosen"), [(MISSING_LIB, "ref"), (f"{MISSING_LIB}.sub", "ref"), ("json", "fast")])
def test_lib_condition_a_missing_library_is_a_skip(lib: str, chosen: str) -> None:
    assert two_implementations({"lib": lib}).op("demo")(FakeTensor()) == chosen


def holds(device_type: str, dtype: str) -> str | None:
    return None


def refuses(device_type: str, dtype: str) -> str | None:
    return f"the probe says no on {device_type} for {dtype}"


@pytest.mark.parametrize(("check", "chosen"), [(f"{__name__}:holds", "fast"), (f"{__name__}:refuses", "ref")])
def test_available_condition_by_name_runs_a_probe(check: str, chosen: str) -> None:
    registry = two_implementations({"available": check})
    assert registry.op("demo")(FakeTensor()) == chosen
    if chosen == "ref":
        assert "the probe says no on cpu for float32" in registry.select("demo", "cpu", "fp32").reason
    with pytest.raises(ValueError, match="must be a callable or 'module:function'"):
        two_implementations({"available": "nope"})


def test_a_failing_availability_probe_is_a_skip_reason() -> None:
    calls = []

    def broken(device_type: str, dtype: str) -> str | None:
        calls.append(dtype)
        raise RuntimeError("no such op")

    registry = two_implementations({"available": broken})
    for _ in range(2):
        selection = registry.select("demo", "cpu", "fp32")
        assert selection.backend == "ref" and "availability check failed: RuntimeError: no such op" in selection.reason
    assert calls == ["float32"]


def test_available_condition_is_asked_once_per_key_and_only_when_the_rest_holds() -> None:
    calls = []

    def available(device_type: str, dtype: str) -> str | None:
        calls.append((device_type, dtype))
        return "C++ extension demo failed to build: boom"

    registry = two_implementations({"device": "cpu", "available": available})
    assert registry.select("demo", "cuda", "fp32").backend == "ref"
    assert calls == []  # the device condition failed first: nothing was built
    selection = registry.select("demo", "cpu", "fp32")
    assert selection.backend == "ref" and "skipped fast: C++ extension demo failed to build: boom" in selection.reason
    registry.select("demo", "cpu", "fp32")
    registry.select("demo", "cpu", "bf16")
    assert calls == [("cpu", "float32"), ("cpu", "bfloat16")]


def test_shape_predicate() -> None:
    demo = two_implementations({"predicate": lambda x: x.shape[0] <= 4}).op("demo")
    assert demo(FakeTensor(shape=(1, 8))) == "fast"
    assert demo(FakeTensor(shape=(5, 8))) == "ref"
    assert demo(FakeTensor(shape=(4, 8))) == "fast"


# Per condition kind: conditions that fail for a float32 CPU call of shape (5, 8).
FAILING_CONDITIONS = {"device": {"device": "cuda"}, "sm": {"sm": ">=9.0"}, "dtype": {"dtype": "bf16"},
                      "lib": {"lib": MISSING_LIB}, "predicate": {"predicate": lambda x: x.shape[0] <= 4}}


@pytest.mark.parametrize("kind", FAILING_CONDITIONS)
def test_a_failing_condition_skips_to_the_next_priority(kind: str) -> None:
    """Not straight to the reference: the next one down whose conditions hold."""
    registry = OpRegistry(capability=lambda _: (8, 0))
    registry.register(name="demo", backend="ref", fn=lambda x: "ref", priority=-5)
    registry.register(name="demo", backend="middle", fn=lambda x: "middle", priority=5)
    registry.register(name="demo", backend="top", fn=lambda x: "top", priority=10, conditions=FAILING_CONDITIONS[kind])
    assert registry.op("demo")(FakeTensor(shape=(5, 8))) == "middle"
    assert "; skipped top: " in registry.select("demo", "cpu", "fp32", {"top": False}).reason


def test_no_implementation_lists_every_skip_reason() -> None:
    registry = OpRegistry(capability=lambda _: (8, 0))
    registry.register(name="demo", backend="gpu", fn=lambda x: x, priority=3, conditions={"device": "cuda"})
    registry.register(name="demo", backend="lib", fn=lambda x: x, priority=2, conditions={"lib": MISSING_LIB})
    registry.register(name="demo", backend="half", fn=lambda x: x, priority=1, conditions={"dtype": "bf16"})
    registry.register(name="demo", backend="small", fn=lambda x: x, conditions={"predicate": lambda x: False})
    registry.register(name="demo", backend="hopper", fn=lambda x: x, priority=-1, conditions={"sm": ">=9.0"})
    with pytest.raises(NoImplementationError) as error:
        registry.op("demo")(FakeTensor())
    message = str(error.value)
    assert message.startswith("no implementation of op 'demo' for device cpu, dtype float32: ")
    for expected in ("hopper (priority -1): sm >=9.0 needs a CUDA device, the call is on cpu",
                     "gpu (priority 3): needs device cuda, the call is on cpu",
                     f"lib (priority 2): optional library {MISSING_LIB!r} is not installed",
                     "half (priority 1): needs dtype bfloat16, the call is float32",
                     "small (priority 0): its predicate is false for this call"):
        assert expected in message


def test_second_call_with_the_same_key_does_not_re_evaluate_conditions() -> None:
    counts = {"capability": 0, "predicate": 0}

    def capability(_: Any) -> tuple[int, int]:
        counts["capability"] += 1
        return (9, 0)

    def predicate(x: FakeTensor) -> bool:
        counts["predicate"] += 1
        return x.shape[0] <= 4

    registry = two_implementations({"sm": ">=9.0", "predicate": predicate}, OpRegistry(capability=capability))
    demo = registry.op("demo")
    assert [demo(FakeTensor(device="cuda")) for _ in range(3)] == ["fast"] * 3
    # The predicate defines the shape class (part of the key), so it runs once per call and only then.
    assert counts == {"capability": 1, "predicate": 3}
    assert demo(FakeTensor(device="cuda", shape=(9, 8))) == "ref"  # a new shape class: a new selection
    assert counts == {"capability": 2, "predicate": 4}


def test_implementation_pins_one_backend_whatever_the_overrides() -> None:
    registry = two_implementations({"dtype": "bf16"})
    registry.set_overrides({"demo": "fast"})
    selection = registry.implementation("demo", "ref", "cpu", "fp32")
    assert (selection.backend, selection.reason) == ("ref", "pinned by the caller")
    with pytest.raises(NoImplementationError, match=r"\(the caller pins it to 'fast'\): fast .*needs dtype bfloat16"):
        registry.implementation("demo", "fast", "cpu", "fp32")
    with pytest.raises(ValueError, match="^implementation: op 'demo' has no backend 'nope'"):
        registry.implementation("demo", "nope", "cpu", "fp32")


def test_call_shape_is_each_predicate_on_the_call() -> None:
    registry = two_implementations({"predicate": lambda x: x.shape[0] <= 4})
    assert registry.call_shape("demo", FakeTensor(shape=(9, 8))) == {"fast": False}
    assert registry.select("demo", "cpu", "fp32", registry.call_shape("demo", FakeTensor())).backend == "fast"


def test_override_pins_a_backend_and_its_conditions_still_apply() -> None:
    registry = two_implementations({"dtype": "bf16"})
    registry.set_overrides({"demo": "ref"})
    assert registry.op("demo")(FakeTensor(dtype="bfloat16")) == "ref"
    assert registry.select("demo", "cpu", "bf16").reason == "pinned by the op-backend override"
    registry.set_overrides({"demo": "fast"})
    with pytest.raises(NoImplementationError, match="pins it to 'fast'.*needs dtype bfloat16"):
        registry.op("demo")(FakeTensor(dtype="float32"))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"nope": "ref"}, "^--op-backend: unknown op 'nope'; ops: demo$"),
    ({"demo": "nope"}, "^--op-backend: op 'demo' has no backend 'nope'; its backends: fast, ref$"),
])
def test_override_of_an_unknown_name_is_refused(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        two_implementations({}).set_overrides(overrides)


def test_registration_is_validated() -> None:
    registry = two_implementations({})
    with pytest.raises(ValueError, match="op backend 'demo=ref' is registered already"):
        registry.register(name="demo", backend="ref", fn=lambda x: x)
    with pytest.raises(ValueError, match=r"unknown condition kind\(s\) \['shape'\]"):
        registry.register(name="demo", backend="other", fn=lambda x: x, conditions={"shape": ">4"})
    with pytest.raises(ValueError, match="not a comparison"):
        registry.register(name="demo", backend="other", fn=lambda x: x, conditions={"sm": "hopper"})


def test_a_string_fn_is_imported_on_first_selection() -> None:
    registry = OpRegistry()
    registry.register(name="demo", backend="json", fn="json:dumps")
    assert registry.select("demo", "cpu", "fp32").fn is json.dumps


def test_flag_wins_over_env_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OP_BACKEND_ENV, "rms_norm=torch_fused, attention=torch_ref")
    assert ServerArgs(op_backend="rms_norm=torch_ref").op_backends() == {"rms_norm": "torch_ref",
                                                                         "attention": "torch_ref"}
    assert ServerArgs().op_backends() == {"rms_norm": "torch_fused", "attention": "torch_ref"}
    # What the worker does with them: the env var's pin reaches dispatch, the flag's pin wins over it.
    REGISTRY.set_overrides(ServerArgs().op_backends())
    assert REGISTRY.describe("cpu", "fp32")["rms_norm"] == {"backend": "torch_fused",
                                                            "reason": "pinned by the op-backend override"}
    assert REGISTRY.describe("cpu", "bf16")["rms_norm"]["backend"] == "none"
    REGISTRY.set_overrides(ServerArgs(op_backend="rms_norm=torch_ref").op_backends())
    assert REGISTRY.describe("cpu", "fp32")["rms_norm"]["backend"] == "torch_ref"
    monkeypatch.setenv(OP_BACKEND_ENV, "rms_norm=fast")
    with pytest.raises(ValueError, match=f"^{OP_BACKEND_ENV}: op 'rms_norm' has no backend 'fast'"):
        ServerArgs().op_backends()


def test_server_flag_errors_are_one_line(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="^--op-backend: unknown op 'flash_attn'; ops: apply_token_bitmask, attention, "):
        ServerArgs(op_backend="flash_attn=torch_ref").engine_config(str(tiny_checkpoint()))
    with pytest.raises(ValueError, match="^--op-backend: 'rms_norm' is not OP=BACKEND"):
        ServerArgs(op_backend="rms_norm").op_backends()


def test_attention_backend_is_an_alias() -> None:
    assert ServerArgs(attention_backend="torch_ref").op_backends() == {"attention": "torch_ref"}
    assert ServerArgs(attention_backend="torch_ref", op_backend="attention=torch_ref").op_backends() == {
        "attention": "torch_ref"}
    assert parse_op_backends(" attention = torch_ref ,, ") == {"attention": "torch_ref"}


def test_the_start_up_log_sums_up_the_op_backends_in_one_line() -> None:
    ops = REGISTRY.describe("cpu", "float32")
    line = op_backends_line(ops)
    prefix, suffix = "op backends: ", " (details: --log-level debug, /server_info)"
    assert line.startswith(prefix) and line.endswith(suffix) and "\n" not in line
    # Every op with its backend, in the registry's order; the reasons stay in the debug log and /server_info.
    assert line[len(prefix):-len(suffix)].split(", ") == [f"{name}={choice['backend']}" for name, choice in ops.items()]


def test_the_launcher_checks_names_without_importing_torch() -> None:
    code = ("import sys; from rapid_llm.server_args import ServerArgs; "
            "assert ServerArgs(op_backend='attention=torch_ref').op_backends(); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_triton_is_skipped_on_cpu_with_its_reason_and_never_imported() -> None:
    code = ("import sys; from rapid_llm.ops.registry import REGISTRY; import rapid_llm.ops; "
            "described = [REGISTRY.describe('cpu', dtype) for dtype in ('float32', 'bfloat16', 'float16')]; "
            "reason = REGISTRY.select('attention', 'cpu', 'bfloat16').reason; "
            "assert 'skipped triton: needs device cuda, the call is on cpu' in reason, reason; "
            "assert not [m for m in sys.modules if m == 'triton' or m.startswith('triton.')], 'triton imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not library_available("triton"), reason="triton is not installed")
def test_triton_is_the_default_on_cuda() -> None:
    # In a child: selecting imports the kernel modules, and this process must not import triton before
    # tests/kernels/conftest.py chooses its interpreter mode.
    ops_with_triton = ["rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "kv_cache_store",
                       "attention", "fused_moe", "causal_conv", "gated_delta_rule", "ssd_scan", "lora"]
    code = ("import json; from rapid_llm.ops.registry import REGISTRY; import rapid_llm.ops; "
            f"print(json.dumps([REGISTRY.select(op, 'cuda', 'bfloat16').backend for op in {ops_with_triton!r}]))")
    chosen = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert chosen == ["triton"] * len(ops_with_triton)


def test_layers_dispatch_through_the_registry() -> None:
    norm, x = RMSNorm(32), torch.randn(3, 32)
    norm.weight.data.normal_()
    expected = reference_rms_norm(x, norm.weight, norm.eps)
    REGISTRY.set_overrides({"rms_norm": "torch_fused"})
    torch.testing.assert_close(norm(x), expected)
    bf16 = dtype_from_name("bf16")
    with pytest.raises(NoImplementationError, match="pins it to 'torch_fused'.*needs dtype float32"):
        norm.to(bf16)(x.to(bf16))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 3, 4, 33])
def test_cpu_fp32_linear_computes_enough_rows_in_fp32(dtype: str, tokens: int) -> None:
    """It is selected exactly where half kernels are missing; from MIN_FP32_ROWS rows on its result is the
    half GEMM's (half inputs, fp32 accumulation, one rounding) up to summation order, below it F.linear's."""
    half = dtype_from_name(dtype)
    config = CaseConfig(SHAPES["tiny"], tokens, half, torch.device("cpu"), seed=tokens)
    x, weight, bias = OP_CASES["linear"].build(config, "qkv").args
    in_fp32 = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(half)
    expected = in_fp32 if tokens >= MIN_FP32_ROWS else torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(CPU_FP32_LINEAR(x, weight, bias), expected, rtol=0, atol=0)
    selected = REGISTRY.select("linear", "cpu", dtype).backend
    assert (selected == "cpu_fp32") is cpu_lacks_half_kernels(half)


@pytest.mark.parametrize("backend", REGISTRY.backends()["linear"])
def test_every_linear_backend_is_a_kernel_layers_can_prepare(backend: str) -> None:
    """Layers call `prepare` then the kernel: every registered linear implementation must offer both,
    whether or not its conditions hold here (its module may need a missing library: then skip)."""
    implementation = next(impl for impl in REGISTRY.implementations("linear") if impl.backend == backend)
    try:
        kernel = import_target(implementation.fn)
    except ImportError as error:
        pytest.skip(f"{backend}: {error}")
    assert isinstance(kernel, LinearKernel)


def test_linear_layers_select_their_kernel_after_loading() -> None:
    """A layer computes with the reference until prepare_weights, then with the selected kernel's format."""
    bf16 = dtype_from_name("bf16")
    layer, x = LinearBase(48, 24, bias=False).to(bf16), torch.randn(5, 48, dtype=bf16)
    layer.weight.data.normal_()
    expected = torch.nn.functional.linear(x, layer.weight)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
    layer.prepare_weights()
    assert type(layer.kernel) is type(REGISTRY.select("linear", "cpu", "bf16").fn)
    torch.testing.assert_close(layer(x), expected)
    prepared = layer.weight
    layer.prepare_weights()  # a second call keeps the prepared weight
    assert layer.weight is prepared
