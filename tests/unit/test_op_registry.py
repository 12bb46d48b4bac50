"""The op registry: conditions, priority, the no-implementation error, overrides, caching, and numerics
of every registered implementation against the torch reference."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from rapid_llm import ops
from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.ops.cpu_half import MIN_FP32_ROWS, cpu_lacks_half_kernels, fp32_pays_off
from rapid_llm.ops.cpu_half import linear as cpu_fp32_linear
from rapid_llm.ops.norm import rms_norm as reference_rms_norm
from rapid_llm.ops.registry import OP_BACKEND_ENV, REGISTRY, NoImplementationError, OpRegistry, parse_op_backends
from rapid_llm.server_args import ServerArgs

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


def test_available_condition_is_asked_once_and_only_when_the_rest_holds() -> None:
    calls = []

    def available() -> str | None:
        calls.append(1)
        return "C++ extension demo failed to build: boom"

    registry = two_implementations({"device": "cpu", "available": available})
    assert registry.select("demo", "cuda", "fp32").backend == "ref"
    assert calls == []  # the device condition failed first: nothing was built
    selection = registry.select("demo", "cpu", "fp32")
    assert selection.backend == "ref" and "skipped fast: C++ extension demo failed to build: boom" in selection.reason
    registry.select("demo", "cpu", "bf16")
    assert calls == [1]


def test_available_condition_by_name() -> None:
    # sys.getprofile() is None (no profiler): a "module:function" answering None means available.
    assert two_implementations({"available": "sys:getprofile"}).select("demo", "cpu", "fp32").backend == "fast"
    with pytest.raises(ValueError, match="must be a callable or 'module:function'"):
        two_implementations({"available": "nope"})


def test_shape_predicate() -> None:
    demo = two_implementations({"predicate": lambda x: x.shape[0] <= 4}).op("demo")
    assert demo(FakeTensor(shape=(1, 8))) == "fast"
    assert demo(FakeTensor(shape=(5, 8))) == "ref"
    assert demo(FakeTensor(shape=(4, 8))) == "fast"


def test_no_implementation_lists_every_skip_reason() -> None:
    registry = OpRegistry(capability=lambda _: (8, 0))
    registry.register(name="demo", backend="gpu", fn=lambda x: x, priority=3, conditions={"device": "cuda"})
    registry.register(name="demo", backend="lib", fn=lambda x: x, priority=2, conditions={"lib": MISSING_LIB})
    registry.register(name="demo", backend="half", fn=lambda x: x, priority=1, conditions={"dtype": "bf16"})
    registry.register(name="demo", backend="small", fn=lambda x: x, conditions={"predicate": lambda x: False})
    with pytest.raises(NoImplementationError) as error:
        registry.op("demo")(FakeTensor())
    message = str(error.value)
    assert message.startswith("no implementation of op 'demo' for device cpu, dtype float32: ")
    for expected in ("gpu (priority 3): needs device cuda, the call is on cpu",
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
    with pytest.raises(ValueError, match="already has a backend 'ref'"):
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
    monkeypatch.setenv(OP_BACKEND_ENV, "rms_norm=fast")
    with pytest.raises(ValueError, match=f"^{OP_BACKEND_ENV}: op 'rms_norm' has no backend 'fast'"):
        ServerArgs().op_backends()


def test_server_flag_errors_are_one_line(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="^--op-backend: unknown op 'flash_attn'; ops: attention, "):
        ServerArgs(op_backend="flash_attn=torch_ref").engine_config(str(tiny_checkpoint()))
    with pytest.raises(ValueError, match="^--op-backend: 'rms_norm' is not OP=BACKEND"):
        ServerArgs(op_backend="rms_norm").op_backends()


def test_attention_backend_is_an_alias() -> None:
    assert ServerArgs(attention_backend="torch_ref").op_backends() == {"attention": "torch_ref"}
    assert ServerArgs(attention_backend="torch_ref", op_backend="attention=torch_ref").op_backends() == {
        "attention": "torch_ref"}
    assert parse_op_backends(" attention = torch_ref ,, ") == {"attention": "torch_ref"}


def test_the_launcher_checks_names_without_importing_torch() -> None:
    code = ("import sys; from rapid_llm.server_args import ServerArgs; "
            "assert ServerArgs(op_backend='attention=torch_ref').op_backends(); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layers_dispatch_through_the_registry() -> None:
    norm, x = RMSNorm(32), torch.randn(3, 32)
    norm.weight.data.normal_()
    expected = reference_rms_norm(x, norm.weight, norm.eps)
    REGISTRY.set_overrides({"rms_norm": "torch_fused"})
    torch.testing.assert_close(norm(x), expected)
    bf16 = dtype_from_name("bf16")
    with pytest.raises(NoImplementationError, match="pins it to 'torch_fused'.*needs dtype float32"):
        norm.to(bf16)(x.to(bf16))


def _rotary_args(tokens: int, dtype: torch.dtype) -> tuple[Any, ...]:
    head_dim, rotary_dim = 16, 8  # partial rotary: the trailing dims pass through
    angles = torch.rand(tokens, 1, rotary_dim // 2) * 6
    return (torch.randn(tokens, 4 * head_dim, dtype=dtype), torch.randn(tokens, 2 * head_dim, dtype=dtype),
            angles.cos().to(dtype), angles.sin().to(dtype), head_dim, rotary_dim)


def _kv_store_args(tokens: int, dtype: torch.dtype) -> tuple[Any, ...]:
    block_size, blocks, heads, head_dim = 16, 8, 2, 8
    slots = torch.randperm(blocks * block_size)[:tokens]
    return (torch.randn(tokens, heads, head_dim, dtype=dtype), torch.randn(tokens, heads, head_dim, dtype=dtype),
            torch.zeros(2, blocks, block_size, heads, head_dim, dtype=dtype), slots)


# op -> the arguments of one call with `tokens` tokens; attention is tested against naive attention in
# tests/kernels/test_attention_torch_ref.py (its implementations are backends, not functions).
OP_INPUTS: dict[str, Callable[[int, torch.dtype], tuple[Any, ...]]] = {
    "rms_norm": lambda t, d: (torch.randn(t, 96, dtype=d), torch.randn(96, dtype=d), 1e-6),
    "fused_add_rms_norm": lambda t, d: (torch.randn(t, 96, dtype=d), torch.randn(t, 96, dtype=d),
                                        torch.randn(96, dtype=d), 1e-6),
    "silu_and_mul": lambda t, d: (torch.randn(t, 2 * 40, dtype=d),),
    "rotary_embedding": _rotary_args,
    "linear": lambda t, d: (torch.randn(t, 48, dtype=d), torch.randn(24, 48, dtype=d), torch.randn(24, dtype=d)),
    "kv_cache_store": _kv_store_args,
    "fused_moe": lambda t, d: (torch.randn(t, 32, dtype=d), torch.randn(t, 4, dtype=d),
                               torch.randn(4, 2 * 16, 32, dtype=d), torch.randn(4, 32, 16, dtype=d), 2, True),
}
IMPLEMENTATIONS = [(op, backend) for op, backends in REGISTRY.backends().items() if op != "attention"
                   for backend in backends]


def test_every_op_has_numerics_inputs() -> None:
    assert {op for op, _ in IMPLEMENTATIONS} == set(OP_INPUTS)


def _pinned(op: str, backend: str, dtype: str) -> Callable[..., Any]:
    REGISTRY.set_overrides({op: backend})
    try:
        return REGISTRY.select(op, "cpu", dtype).fn
    except NoImplementationError as error:
        pytest.skip(str(error))


def _outputs(result: Any, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """What a call produced: its results and its (possibly written in place) tensor arguments."""
    results = list(result) if isinstance(result, tuple) else [] if result is None else [result]
    return results + [arg for arg in args if isinstance(arg, torch.Tensor)]


@pytest.mark.parametrize("tokens", [1, 7, 33])  # one token; lengths unaligned to the 16-token block
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("op", "backend"), IMPLEMENTATIONS)
def test_implementation_matches_torch_ref(op: str, backend: str, dtype: str, tokens: int) -> None:
    implementation, reference = _pinned(op, backend, dtype), _pinned(op, "torch_ref", dtype)
    torch.manual_seed(tokens)
    args = OP_INPUTS[op](tokens, dtype_from_name(dtype))
    copies = tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)
    expected = _outputs(reference(*copies), copies)
    actual = _outputs(implementation(*args), args)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 3, 4, 33])
def test_cpu_fp32_linear_is_chosen_for_enough_rows_where_half_kernels_are_missing(dtype: str, tokens: int) -> None:
    """Dispatch picks it exactly when fp32 pays off; its result is the half GEMM's (half inputs, fp32
    accumulation, one rounding) up to summation order."""
    half = dtype_from_name(dtype)
    torch.manual_seed(tokens)
    x, weight, bias = OP_INPUTS["linear"](tokens, half)
    expected = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(half)
    torch.testing.assert_close(ops.linear(x, weight, bias), expected)
    wanted = tokens >= MIN_FP32_ROWS and cpu_lacks_half_kernels(half)
    assert fp32_pays_off(x) is wanted
    assert REGISTRY.select("linear", "cpu", dtype, {"cpu_fp32": wanted}).backend == ("cpu_fp32" if wanted else
                                                                                    "torch_ref")
    torch.testing.assert_close(cpu_fp32_linear(x, weight, bias), expected, rtol=0, atol=0)
