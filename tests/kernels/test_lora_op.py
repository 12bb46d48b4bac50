"""The lora op's implementations against a float64 loop over tokens, at edges the numerics matrix does not reach.

Odd widths (in 72, out 40), ranks 1 / 8 / 16 with a zero-padded smaller adapter in slot 0, one or three slots,
tokens 0 / 1 / 7 / 67 mixing slots and -1 either scattered (a decode batch) or in runs (prefill chunks: the CPU
path's sliced branch), and out a column slice of a wider tensor whose other columns and adapter-less rows must
stay bit for bit. Tolerances against float64: fp32 1e-5 (fp32 sums in another order); bf16 one step (2^-7
relative: the single rounding into out, or a truncation under Triton's interpreter) plus 1e-5 for the fp32 sums.
The Triton kernels run under the interpreter on CPU (compiled with -m gpu), with a rank past one rank block and
out past one column block too. cpu_cpp (csrc/lora.cpp) also runs past its vector widths (ranks past one 32-column
transpose, in past its 32-wide dot products, out past its 16-row blocks, slots past 4 and 8 tokens), on
block-diagonal B whose zero blocks it skips, in fp16, over the wrapper's hand-off to cpu_grouped, and built for
AVX-512 without BF16 and for AVX2 (plain loops) too (slow: two builds).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rapid_llm.ops.cpp import cpu_lora, jit
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.multi_lora import LoRAIndices, lora_indices
from rapid_llm.ops.registry import REGISTRY, NoImplementationError

IN_FEATURES, OUT_FEATURES, LEFT, RIGHT = 72, 40, 5, 3  # out is columns LEFT .. LEFT + OUT_FEATURES of a wider tensor
TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5},
              torch.float16: {"rtol": 2**-10, "atol": 1e-5}}
CPU_BACKENDS = ["torch_ref", "cpu_grouped", "cpu_cpp"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _slots(num_tokens: int, num_slots: int, layout: str, generator: torch.Generator) -> torch.Tensor:
    """"scattered": every slot and -1 in a shuffled order; "runs": three contiguous runs, the middle one -1."""
    if layout == "runs":
        run_slots = (0, -1, num_slots - 1)
        return torch.tensor([run_slots[token * 3 // num_tokens] for token in range(num_tokens)], dtype=torch.int64)
    cycle = torch.arange(num_tokens) % (num_slots + 1) - 1
    return cycle[torch.randperm(num_tokens, generator=generator)]


def _inputs(num_tokens: int, rank: int, num_slots: int, dtype: torch.dtype, layout: str, device: torch.device,
            out_features: int = OUT_FEATURES, in_features: int = IN_FEATURES) -> tuple[torch.Tensor, ...]:
    """(x, lora_a, lora_b, token_slots, wide): values about 1, so the tolerances are relative to 1."""
    generator = torch.Generator().manual_seed(num_tokens * 100 + rank * 10 + num_slots)
    x = torch.randn(num_tokens, in_features, generator=generator)
    lora_a = torch.randn(num_slots, rank, in_features, generator=generator) * in_features**-0.5
    lora_b = torch.randn(num_slots, out_features, rank, generator=generator) * rank**-0.5
    lora_a[0, rank // 2 + 1:] = 0  # a smaller adapter, zero-padded to the slots' rank
    lora_b[0, :, rank // 2 + 1:] = 0
    wide = torch.randn(num_tokens, LEFT + out_features + RIGHT, generator=generator)
    slots = _slots(num_tokens, num_slots, layout, generator)
    return (*(tensor.to(device, dtype) for tensor in (x, lora_a, lora_b)), slots.to(device), wide.to(device, dtype))


def _expected(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slots: torch.Tensor,
              out: torch.Tensor) -> torch.Tensor:
    """out + each token's delta, token by token in float64."""
    expected = out.double().clone()
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[token] += lora_b[slot].double() @ (lora_a[slot].double() @ x[token].double())
    return expected


def _check(run: object, num_tokens: int, rank: int, num_slots: int, dtype: torch.dtype, layout: str,
           device: torch.device, out_features: int = OUT_FEATURES, in_features: int = IN_FEATURES,
           lora_b_mask: torch.Tensor | None = None) -> None:
    """`lora_b_mask` [out, rank] (bool) zeroes B outside it, as -0.0 for the negative values."""
    x, lora_a, lora_b, slots, wide = _inputs(num_tokens, rank, num_slots, dtype, layout, device, out_features,
                                             in_features)
    if lora_b_mask is not None:
        lora_b = lora_b * lora_b_mask.to(device)
    before = wide.clone()
    out = wide[:, LEFT:LEFT + out_features]
    expected = _expected(x, lora_a, lora_b, slots, out)
    assert run(x, lora_a, lora_b, lora_indices(slots, num_slots), out) is None
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])
    assert torch.equal(wide[:, :LEFT], before[:, :LEFT]) and torch.equal(wide[:, LEFT + out_features:],
                                                                         before[:, LEFT + out_features:])
    untouched = slots < 0
    assert torch.equal(wide[untouched], before[untouched])


def _cpu(backend: str, dtype: torch.dtype) -> object:
    """The backend's function; a skip naming why where its conditions fail (cpu_cpp without the extension)."""
    try:
        return REGISTRY.implementation("lora", backend, "cpu", dtype).fn
    except NoImplementationError as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("layout", ["scattered", "runs"])
@pytest.mark.parametrize("num_slots", [1, 3])
@pytest.mark.parametrize("rank", [1, 8, 16])
@pytest.mark.parametrize("num_tokens", [0, 1, 7, 67])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cpu_implementations_match_float64(backend: str, dtype: torch.dtype, num_tokens: int, rank: int,
                                           num_slots: int, layout: str) -> None:
    _check(_cpu(backend, dtype), num_tokens, rank, num_slots, dtype, layout, torch.device("cpu"))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_wrong_slot_mapping_fails_the_check(backend: str) -> None:
    """The comparison has teeth: the same call with each token's slot moved to the next one does not pass."""
    implementation = _cpu(backend, torch.float32)

    def shifted(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
                out: torch.Tensor) -> None:
        slots = indices.token_slots
        moved = torch.where(slots >= 0, (slots + 1) % lora_a.shape[0], slots)
        implementation(x, lora_a, lora_b, lora_indices(moved, lora_a.shape[0]), out)

    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _check(shifted, 7, 8, 3, torch.float32, "scattered", torch.device("cpu"))


def test_indices_group_tokens_by_slot() -> None:
    indices = lora_indices(torch.tensor([2, -1, 0, 2, -1, 0, 2], dtype=torch.int32), 4)
    assert indices.token_slots.dtype == torch.int64
    assert indices.sorted_tokens.tolist() == [2, 5, 0, 3, 6, 1, 4]
    assert indices.slot_starts.tolist() == [0, 2, 2, 5, 5]  # slots 1 and 3 empty; the -1 tokens after slot 3's


@pytest.mark.parametrize(("slots", "num_slots", "message"), [
    (torch.tensor([0, 3]), 3, r"must lie in \[-1, 3\)"),
    (torch.tensor([-2, 0]), 3, r"must lie in \[-1, 3\)"),
    (torch.tensor([[0]]), 3, "1-D int32/int64"),
    (torch.tensor([0.0]), 3, "1-D int32/int64"),
    (torch.tensor([0]), 0, "num_slots must be at least 1"),
])
def test_indices_refuse_bad_slots(slots: torch.Tensor, num_slots: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lora_indices(slots, num_slots)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_calls_that_do_not_fit_are_refused(backend: str) -> None:
    x, lora_a, lora_b, slots, wide = _inputs(7, 8, 3, torch.float32, "scattered", torch.device("cpu"))
    out, implementation = wide[:, LEFT:LEFT + OUT_FEATURES], _cpu(backend, torch.float32)
    with pytest.raises(ValueError, match="build them with lora_indices"):
        implementation(x, lora_a, lora_b, lora_indices(slots, 4), out)
    with pytest.raises(ValueError, match=r"must be \[T, in\], \[L, R, in\], \[L, out, R\] and \[T, out\]"):
        implementation(x, lora_a, lora_b.transpose(1, 2), lora_indices(slots, 3), out)
    with pytest.raises(ValueError, match="share one dtype"):
        implementation(x, lora_a, lora_b, lora_indices(slots, 3), out.double())


def test_cpu_dispatch_picks_the_cpp_form_where_the_extension_builds() -> None:
    expected = "cpu_grouped" if CPU_OPS.skip_reason() is not None else "cpu_cpp"
    for dtype in ("float32", "bfloat16", "float16"):
        assert REGISTRY.select("lora", "cpu", dtype).backend == expected


@pytest.mark.parametrize(("num_tokens", "rank", "num_slots", "in_features", "out_features"), [
    (5, 37, 4, 100, 150),  # odd rank past one 32-column transpose; in past three dot products; out past 9 blocks
    (33, 48, 3, 33, 17),  # slots of 8-11 tokens: past 4 per shrink tile and 8 per expand tile
    (100, 16, 2, 72, 40),  # past fp32's MAX_TOKENS: cpu_grouped then; the C++ pass in bf16 and fp16
])
@pytest.mark.parametrize("layout", ["scattered", "runs"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cpp_matches_float64_past_its_vector_widths(dtype: torch.dtype, layout: str, num_tokens: int, rank: int,
                                                     num_slots: int, in_features: int, out_features: int) -> None:
    _check(_cpu("cpu_cpp", dtype), num_tokens, rank, num_slots, dtype, layout, torch.device("cpu"), out_features,
           in_features)


def _block_diagonal(out_features: int, pieces: int, rank: int) -> torch.Tensor:
    """A merged projection's B layout (lora/lora_linear.py): piece i's rows use only its block of rank columns."""
    mask = torch.zeros(out_features, pieces * rank, dtype=torch.bool)
    rows = out_features // pieces
    for piece in range(pieces):
        mask[piece * rows:(piece + 1) * rows if piece < pieces - 1 else out_features,
             piece * rank:(piece + 1) * rank] = True
    return mask


@pytest.mark.parametrize(("pieces", "rank", "out_features"), [(3, 16, 96), (2, 16, 70), (3, 8, 61), (2, 24, 40)])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cpp_skips_zero_blocks_of_b_exactly(dtype: torch.dtype, pieces: int, rank: int, out_features: int) -> None:
    """Zero 16-column groups of B (-0.0 included) are skipped; blocks that straddle pieces are not."""
    _check(_cpu("cpu_cpp", dtype), 9, pieces * rank, 3, dtype, "scattered", torch.device("cpu"), out_features,
           lora_b_mask=_block_diagonal(out_features, pieces, rank))


def test_cpp_hands_long_fp32_calls_and_strided_columns_to_the_grouped_form(monkeypatch: pytest.MonkeyPatch) -> None:
    implementation, handed = _cpu("cpu_cpp", torch.float32), []
    monkeypatch.setattr(cpu_lora, "lora_grouped", lambda x, *args: handed.append((x.dtype, x.shape[0])))
    limit = cpu_lora.MAX_TOKENS[torch.float32]
    for dtype, num_tokens in ((torch.float32, limit), (torch.float32, limit + 1), (torch.bfloat16, 300)):
        x, lora_a, lora_b, slots, wide = _inputs(num_tokens, 8, 3, dtype, "scattered", torch.device("cpu"))
        implementation(x, lora_a, lora_b, lora_indices(slots, 3), wide[:, LEFT:LEFT + OUT_FEATURES])
    x, lora_a, lora_b, slots, _ = _inputs(7, 8, 3, torch.float32, "scattered", torch.device("cpu"))
    implementation(x, lora_a, lora_b, lora_indices(slots, 3), torch.zeros(OUT_FEATURES, 7).t())  # column stride 7
    assert handed == [(torch.float32, limit + 1), (torch.float32, 7)]


def test_the_cpp_kernel_is_the_cpus_best() -> None:
    """-march=native builds the AVX-512 code where the CPU has it, with BF16 dot products exactly where the packed
    linear kernel has its AVX-512 BF16 code."""
    if CPU_OPS.skip_reason() is not None:
        pytest.skip(f"C++ extension: {CPU_OPS.skip_reason()}")
    module, flags = CPU_OPS.load(), jit.cpu_features().split()
    if {"avx512f", "avx512bw", "avx512vl"} <= set(flags):
        assert module.lora_kernel() == ("avx512_bf16" if module.avx512_linear_supported() else "avx512")
    else:
        assert module.lora_kernel() == "scalar"


_BINDING = """
#include <torch/csrc/utils/pybind.h>
#include <string>
void lora(const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& lora_b, const at::Tensor& slot_starts,
          const at::Tensor& sorted_tokens, at::Tensor out);
std::string lora_kernel();
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("lora", &lora);
  module.def("lora_kernel", &lora_kernel);
}
"""


@pytest.mark.slow
@pytest.mark.parametrize(("march", "kernel", "needs"), [("x86-64-v4", "avx512", {"avx512f", "avx512bw", "avx512vl"}),
                                                         ("x86-64-v3", "scalar", {"avx2", "fma"})])
def test_cpp_builds_and_matches_without_avx512_bf16(march: str, kernel: str, needs: set[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """lora.cpp alone, built for a CPU without AVX-512 BF16 (AVX-512 F/BW/VL FMAs) and without AVX-512 (plain
    loops), runs the float64 comparisons."""
    missing = needs - set(jit.cpu_features().split())
    if missing or jit.JitExtension("probe", ()).missing_toolchain() is not None:
        pytest.skip(f"this machine cannot build and run -march={march} code (lacks {sorted(missing)} or a compiler)")
    sources = tmp_path / "csrc"
    sources.mkdir()
    shutil.copy(jit.SOURCE_DIR / "lora.cpp", sources / "lora.cpp")
    (sources / "lora_binding.cpp").write_text(_BINDING)
    monkeypatch.setattr(jit, "SOURCE_DIR", sources)
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path / "cache"))
    extension = jit.JitExtension(f"rapid_llm_test_lora_{march.replace('-', '_')}", ("lora_binding.cpp", "lora.cpp"),
                                 cflags=("-O2", f"-march={march}", "-fopenmp"), ldflags=jit.CPU_LDFLAGS)
    module = extension.load()
    assert module.lora_kernel() == kernel

    def run(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
            out: torch.Tensor) -> None:
        module.lora(x, lora_a, lora_b, indices.slot_starts, indices.sorted_tokens, out)

    for dtype in DTYPES.values():
        _check(run, 33, 37, 3, dtype, "scattered", torch.device("cpu"), 150, 100)
        _check(run, 7, 16, 3, dtype, "runs", torch.device("cpu"), lora_b_mask=_block_diagonal(OUT_FEATURES, 2, 8))


@pytest.mark.parametrize(("num_tokens", "rank", "num_slots", "out_features"), [
    (0, 8, 1, OUT_FEATURES), (1, 1, 1, OUT_FEATURES), (7, 8, 3, OUT_FEATURES), (67, 16, 3, OUT_FEATURES),
    (33, 80, 3, 150),  # two rank blocks of the shrink and steps of the expand; three column blocks
])
@pytest.mark.parametrize("layout", ["scattered", "runs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_matches_float64(triton_device: torch.device, dtype: torch.dtype, layout: str, num_tokens: int,
                                rank: int, num_slots: int, out_features: int) -> None:
    pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")
    from rapid_llm.ops.triton.lora import lora

    _check(lora, num_tokens, rank, num_slots, dtype, layout, triton_device, out_features)
