"""The top_k_top_p_filter op: torch_topk keeps exactly the reference's set (ties, mixed rows, fallback) and
the sampler draws the same seeded tokens through either implementation."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from rapid_llm.layers import sampler as sampler_module
from rapid_llm.layers.sampler import Sampler
from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.ops.top_k_top_p import TOP_P_CANDIDATES
from rapid_llm.sampling.params import SamplingParams

OP = "top_k_top_p_filter"
INF = float("inf")
Filter = Callable[..., torch.Tensor]


def implementation(backend: str) -> Filter:
    return REGISTRY.implementation(OP, backend, "cpu", "fp32").fn


REFERENCE, TOPK = implementation("torch_ref"), implementation("torch_topk")


@pytest.fixture(autouse=True)
def no_overrides() -> None:
    yield
    REGISTRY.set_overrides({})


def filter_args(logits: torch.Tensor, top_k: list[int], top_p: list[float] | None) -> tuple:
    """The op's arguments as SamplingBatch.build makes them: k = V and p = inf where off."""
    vocab_size = logits.shape[-1]
    ks = [vocab_size if k <= 0 else min(k, vocab_size) for k in top_k]
    ps = None if top_p is None else torch.tensor([INF if p >= 1.0 else p for p in top_p])
    return logits, torch.tensor(ks), ps, max((k for k in ks if k < vocab_size), default=0)


def assert_same_set(*args: object) -> torch.Tensor:
    expected, actual = REFERENCE(*args), TOPK(*args)
    assert torch.equal(torch.isfinite(actual), torch.isfinite(expected))
    assert torch.equal(actual, expected)  # kept logits are untouched, the rest are -inf
    return expected


# Rows: k off, p off (no filter); k=1; p tiny; p=1 (off); k and p together; k large; p only.
ROW_PARAMS = [(0, 1.0), (1, 1.0), (0, 1e-4), (5, 1.0), (40, 0.9), (0, 0.95), (700, 0.5), (0, 0.3)]


@pytest.mark.parametrize("vocab_size", [97, 1000, 32003])
@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # flat (nucleus beyond the candidates) to sharp
@pytest.mark.parametrize("seed", range(3))
def test_mixed_rows_keep_the_reference_set(vocab_size: int, scale: float, seed: int) -> None:
    torch.manual_seed(seed)
    logits = torch.randn(len(ROW_PARAMS), vocab_size) * scale
    top_k, top_p = zip(*ROW_PARAMS)
    kept = assert_same_set(*filter_args(logits, list(top_k), list(top_p)))
    assert torch.isfinite(kept[0]).all()  # the unfiltered row keeps everything
    assert torch.isfinite(kept[1]).sum() == 1
    assert_same_set(*filter_args(logits, list(top_k), None))  # top-k alone


def test_every_row_beyond_the_candidates_falls_back_to_the_reference() -> None:
    torch.manual_seed(3)
    logits = torch.randn(4, 5000) * 0.1  # nearly uniform: a 0.9 nucleus holds ~4500 tokens
    kept = assert_same_set(*filter_args(logits, [0] * 4, [0.9] * 4))
    assert (torch.isfinite(kept).sum(dim=-1) > TOP_P_CANDIDATES).all()


def test_no_filter_returns_the_logits() -> None:
    logits = torch.randn(2, 50)
    assert TOPK(*filter_args(logits, [0, 0], None)) is logits


@pytest.mark.parametrize("backend", ["torch_ref", "torch_topk"])
def test_ties_at_the_cutoff_are_all_kept(backend: str) -> None:
    fn = implementation(backend)
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 2.0, 0.0]])
    assert torch.isfinite(fn(*filter_args(logits, [2], None))).tolist() == [[True, True, True, False, True, False]]
    # 1000 tied tokens (mass 0.475) before 3000 tied zeros: the 256 candidates and k=5 cut inside the block.
    tied = torch.cat([torch.full((1, 1000), 1.0), torch.zeros(1, 3000)], dim=1)
    assert torch.isfinite(fn(*filter_args(tied, [5], None))).sum() == 1000
    assert torch.isfinite(fn(*filter_args(tied, [0], [0.3]))).sum() == 1000
    assert torch.isfinite(fn(*filter_args(tied, [1500], None))).sum() == 4000  # the 1500th is a tied zero


def test_top_k_one_row_beside_wide_rows() -> None:
    torch.manual_seed(4)
    logits = torch.randn(3, 151936)
    assert_same_set(*filter_args(logits, [1, 0, 50], [0.9, 0.9, 1.0]))


def test_the_sampler_calls_the_op_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def spy(*args: object) -> torch.Tensor:
        calls.append(args)
        return REFERENCE(*args)

    monkeypatch.setattr(sampler_module.ops, OP, spy)
    params = [SamplingParams(top_k=3, seed=1), SamplingParams(top_p=0.5, seed=2), SamplingParams(seed=3)]
    batch = SamplingBatch.build([SamplingRequest(p, (), (), ()) for p in params], 20, torch.device("cpu"))
    Sampler()(torch.randn(3, 20), batch)
    (_, top_k, top_p, max_top_k), = calls
    assert top_k.tolist() == [3, 20, 20] and max_top_k == 3
    assert top_p.tolist() == [INF, 0.5, INF]


def seeded_tokens(backend: str, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    REGISTRY.set_overrides({OP: backend})
    requests = [SamplingRequest(p, (), range(i), ()) for i, p in enumerate(params)]
    return Sampler()(logits, SamplingBatch.build(requests, logits.shape[-1], torch.device("cpu"))).token_ids


@pytest.mark.parametrize("vocab_size", [1000, 32000])
def test_seeded_samples_are_the_same_through_both_backends(vocab_size: int) -> None:
    torch.manual_seed(5)
    logits = torch.randn(16, vocab_size) * 4
    params = [SamplingParams(seed=row, top_k=[0, 1, 20, 300][row % 4], top_p=[1.0, 0.9, 0.5, 1e-3][row // 4 % 4],
                             temperature=0.8) for row in range(16)]
    reference = seeded_tokens("torch_ref", logits, params)
    assert torch.equal(seeded_tokens("torch_topk", logits, params), reference)
    assert len(set(reference.tolist())) > 4
