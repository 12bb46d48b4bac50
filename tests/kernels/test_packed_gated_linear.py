"""The MLP's gate_up GEMM with silu_and_mul in its epilogue (the gated form of the `cpu_amx` and `cpu_avx512`
linears) on/off: bit-identical to the linear followed by the `cpu_cpp` silu_and_mul at odd shapes (one row, few
rows, 32-row blocks with a padded tail, 6-row passes; odd numbers of gate blocks; bias), the same through
GatedMLP, and the same greedy tokens and log-probabilities from the trained demo model. Each kernel skips where
the CPU or OS does not run its code (AMX-BF16, AVX512-BF16)."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.mlp import GatedMLP
from rapid_llm.ops.amx_linear import AMX_LINEAR, PackedLinear, amx_missing
from rapid_llm.ops.avx512_linear import AVX512_LINEAR, avx512_missing
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import DEMO_ROOT
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.paged_generation import generate
from tests.op_pins import pinned_backends

KERNELS = [pytest.param((AMX_LINEAR, "cpu_amx"), id="cpu_amx", marks=pytest.mark.skipif(
               amx_missing("cpu", "bfloat16") is not None, reason=f"cpu_amx: {amx_missing('cpu', 'bfloat16')}")),
           pytest.param((AVX512_LINEAR, "cpu_avx512"), id="cpu_avx512", marks=pytest.mark.skipif(
               avx512_missing("cpu", "bfloat16") is not None,
               reason=f"cpu_avx512: {avx512_missing('cpu', 'bfloat16')}"))]


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> tuple[PackedLinear, str]:
    """The kernel and its linear backend's name."""
    return request.param


def _unfused(linear: PackedLinear, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return CPU_OPS.load().silu_and_mul(linear(x, packed, bias))


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 32, 33, 300])
@pytest.mark.parametrize(("in_features", "intermediate", "bias"),
                         [(32, 16, False), (64, 48, True), (256, 80, False), (96, 1024, True)])
def test_gated_form_equals_linear_then_silu_and_mul(kernel: tuple[PackedLinear, str], rows: int, in_features: int,
                                                     intermediate: int, bias: bool) -> None:
    linear, _ = kernel
    generator = torch.Generator().manual_seed(rows + in_features + intermediate)
    x = (torch.randn(rows, in_features, generator=generator) * 2).bfloat16()
    weight = torch.randn(2 * intermediate, in_features, generator=generator).bfloat16()
    b = torch.randn(2 * intermediate, generator=generator).bfloat16() if bias else None
    packed = linear.prepare(weight)
    got = linear.silu_and_mul_linear(x, packed, b)
    assert got.shape == (rows, intermediate)
    torch.testing.assert_close(got, _unfused(linear, x, packed, b), rtol=0, atol=0)
    leading = linear.silu_and_mul_linear(x.view(1, rows, in_features), packed, b)
    torch.testing.assert_close(leading.view(rows, intermediate), got, rtol=0, atol=0)


def test_gated_mlp_takes_the_gated_form_with_the_same_result(kernel: tuple[PackedLinear, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    linear, backend = kernel
    torch.manual_seed(0)
    mlp = GatedMLP(64, 96).to(torch.bfloat16)
    for parameter in mlp.parameters():
        parameter.data.normal_()
    with pinned_backends({"linear": backend}):
        mlp.gate_up_proj.prepare_weights()
        mlp.down_proj.prepare_weights()
    assert mlp.gate_up_proj.kernel is linear
    x = torch.randn(7, 64).bfloat16()
    calls = _count_gated_calls(linear, monkeypatch)
    fused = mlp(x)
    assert calls == [1]
    monkeypatch.setattr(PackedLinear, "fuses_silu_and_mul", lambda self, weight: False)
    torch.testing.assert_close(fused, mlp(x), rtol=0, atol=0)
    assert calls == [1]


def _count_gated_calls(linear: PackedLinear, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    gated = linear.silu_and_mul_linear
    monkeypatch.setattr(linear, "silu_and_mul_linear", lambda *args: calls.append(1) or gated(*args))
    return calls


def _greedy(linear: PackedLinear, backend: str, fused: bool,
            monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], list]]:
    calls = _count_gated_calls(linear, monkeypatch)
    if not fused:
        monkeypatch.setattr(PackedLinear, "fuses_silu_and_mul", lambda self, weight: False)
    with pinned_backends({}):  # the runner's pin ends with this test
        runner = ModelRunner(ModelConfig.from_pretrained(str(DEMO_ROOT / "target"), dtype="bfloat16"),
                             CacheConfig(block_size=16, num_blocks=64), DeviceConfig("cpu"), max_num_seqs=4,
                             op_backends={"linear": backend})
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(10, 2000, (length,), generator=generator).tolist() for length in (60, 17, 130)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    sequences = generate(runner, prompts, params, chunk_size=64, stagger=2)
    assert bool(calls) == fused
    return [(sequence.output, sequence.logprobs) for sequence in sequences]


def test_demo_model_greedy_tokens_and_logprobs_equal_on_and_off(kernel: tuple[PackedLinear, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    linear, backend = kernel
    fused = _greedy(linear, backend, True, monkeypatch)
    assert all(len(tokens) == 12 for tokens, _ in fused)
    assert fused == _greedy(linear, backend, False, monkeypatch)
