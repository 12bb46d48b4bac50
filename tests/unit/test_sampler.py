"""Tests for the batched sampler: filtering sets, seeding, penalties, min_tokens and logprobs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from rapid_llm.layers.penalties import apply_penalties
from rapid_llm.layers.sampler import Sampler, _splitmix64
from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest
from rapid_llm.sampling.params import SamplingParams

CPU = torch.device("cpu")
PROBS = [0.5, 0.3, 0.15, 0.05]


def request(
    params: SamplingParams,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    eos: Sequence[int] = (),
) -> SamplingRequest:
    return SamplingRequest(params, prompt, output, eos)


def sample(
    logits: torch.Tensor, requests: list[SamplingRequest], device: torch.device = CPU
) -> torch.Tensor:
    batch = SamplingBatch.build(requests, logits.shape[-1], device)
    return Sampler()(logits.to(device), batch).token_ids.cpu()


def seeded_draws(probs: list[float], params: SamplingParams, n: int = 2000) -> Counter[int]:
    """n samples of one seeded request, one per step (output length 0..n-1), taken as one batch."""
    logits = torch.tensor(probs).log().expand(n, -1)
    requests = [request(params, output=range(step)) for step in range(n)]
    return Counter(sample(logits, requests).tolist())


def test_splitmix64_matches_reference() -> None:
    # Reference outputs of splitmix64 (unsigned) for states 0 and 1234567, as signed int64.
    expected = [0xE220A8397B1DCDAF, 0x599ED017FB08FC85]
    got = _splitmix64(torch.tensor([0, 1234567])).tolist()
    assert [v & ((1 << 64) - 1) for v in got] == expected


def test_top_k_one_is_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    params = [SamplingParams(temperature=0.7, top_k=1, seed=i if i % 2 else None) for i in range(8)]
    assert torch.equal(sample(logits, [request(p) for p in params]), logits.argmax(dim=-1))


def test_greedy_is_argmax_in_any_dtype() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 100, dtype=torch.bfloat16)
    tokens = sample(logits, [request(SamplingParams(temperature=0.0))] * 4)
    assert torch.equal(tokens, logits.float().argmax(dim=-1))


def test_greedy_applies_penalties() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.5, 0.0]])
    plain = request(SamplingParams(temperature=0.0), prompt=[1])
    penalised = request(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[1])
    assert sample(logits, [plain]).item() == 1
    assert sample(logits, [penalised]).item() == 2


def test_greedy_rows_stay_greedy_beside_sampled_rows() -> None:
    torch.manual_seed(2)
    logits = torch.tensor([0.0, 0.1, 0.0, 0.05]).expand(400, -1)
    requests = [request(SamplingParams(temperature=0.0 if i % 2 else 1.0)) for i in range(400)]
    tokens = sample(logits, requests)
    assert set(tokens[1::2].tolist()) == {1}
    assert len(set(tokens[0::2].tolist())) == 4


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(top_p=0.8, seed=5), {0, 1}),  # cumulative hits top_p exactly at token 1
        (SamplingParams(top_p=0.81, seed=5), {0, 1, 2}),
        (SamplingParams(top_p=0.4, seed=5), {0}),  # the top token always survives
        (SamplingParams(top_k=2, seed=5), {0, 1}),
        (SamplingParams(top_k=2, top_p=0.6, seed=5), {0}),  # top-p sees [0.625, 0.375] after top-k
        (SamplingParams(min_p=0.5, seed=5), {0, 1}),  # floor 0.25
        (SamplingParams(min_p=0.2, seed=5), {0, 1, 2}),  # floor 0.10
        (SamplingParams(top_k=3, min_p=0.7, seed=5), {0}),  # floor 0.35: min-p still applies after top-k
        (SamplingParams(seed=5), {0, 1, 2, 3}),
    ],
)
def test_filters_keep_the_right_set(params: SamplingParams, expected: set[int]) -> None:
    assert set(seeded_draws(PROBS, params)) == expected


@pytest.mark.parametrize(("top_p", "expected"), [(0.6, {0}), (0.87, {0, 1})])
def test_top_p_boundary_survives_float_rounding(top_p: float, expected: set[int]) -> None:
    # In float32 the cumulative sums here land one ulp below 0.6 and 0.87.
    assert set(seeded_draws([0.6, 0.27, 0.13], SamplingParams(top_p=top_p, seed=8))) == expected


def test_seeded_samples_follow_the_distribution() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    counts = seeded_draws(probs, SamplingParams(seed=42), n=4000)
    for token, p in enumerate(probs):
        assert abs(counts[token] / 4000 - p) < 0.03


def test_unseeded_samples_follow_the_distribution() -> None:
    torch.manual_seed(3)
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = torch.tensor(probs).log().expand(4000, -1)
    counts = Counter(sample(logits, [request(SamplingParams())] * 4000).tolist())
    for token, p in enumerate(probs):
        assert abs(counts[token] / 4000 - p) < 0.03


def test_temperature_sharpens() -> None:
    cold = seeded_draws(PROBS, SamplingParams(temperature=0.25, seed=9))
    assert cold[0] / 2000 > 0.85  # p^4 renormalised puts ~0.92 on token 0


def _steps_of_seed(seed: int, logits: torch.Tensor, row: int, others: list[SamplingParams]) -> list[int]:
    """Tokens of a request with `seed` at batch position `row` over 10 steps, beside `others`."""
    tokens = []
    for step in range(10):
        params = list(others)
        params.insert(row, SamplingParams(seed=seed, top_p=0.95))
        batch_logits = torch.randn(len(params), logits.shape[-1])
        batch_logits[row] = logits
        tokens.append(sample(batch_logits, [request(p, output=range(step)) for p in params])[row].item())
    return tokens


def test_seed_reproduces_across_batch_compositions() -> None:
    torch.manual_seed(4)
    logits = torch.randn(200) * 0.5
    alone = _steps_of_seed(123, logits, 0, [])
    others = [SamplingParams(), SamplingParams(seed=7), SamplingParams(temperature=0.0), SamplingParams(top_k=5)]
    assert _steps_of_seed(123, logits, 2, others) == alone
    assert _steps_of_seed(123, logits, 4, others) == alone
    assert _steps_of_seed(123, logits, 0, others[1:2]) == alone
    assert len(set(alone)) > 1  # the steps really draw different tokens
    assert _steps_of_seed(124, logits, 0, []) != alone


def test_all_seeded_batch_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    requests = [request(SamplingParams(seed=2**70 + 3)), request(SamplingParams(seed=-5))]
    assert sample(torch.zeros(2, 10), requests).shape == (2,)
    assert torch.equal(torch.get_rng_state(), state)


def test_penalties_change_exactly_the_right_tokens() -> None:
    base = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0])
    prompt, output = [0, 1], [2, 3, 3]
    params = [
        SamplingParams(repetition_penalty=2.0),
        SamplingParams(frequency_penalty=0.5),
        SamplingParams(presence_penalty=0.5),
        SamplingParams(),
    ]
    batch = SamplingBatch.build([request(p, prompt, output) for p in params], 8, CPU)
    got = apply_penalties(base.expand(4, -1), batch)
    tail = [0.5, -0.5, 3.0, -3.0]  # tokens 4..7 are neither in the prompt nor in the output
    assert got[0].tolist() == [1.0, -4.0, 0.5, -2.0, *tail]
    assert got[1].tolist() == [2.0, -2.0, 0.5, -2.0, *tail]
    assert got[2].tolist() == [2.0, -2.0, 0.5, -1.5, *tail]
    assert got[3].tolist() == base.tolist()


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 9.0, 8.0]])  # 5 = EOS, 6 = stop id
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[6])
    assert sample(logits, [request(params, output=[1, 1], eos=[5])]).item() == 1
    assert sample(logits, [request(params, output=[1, 1, 1], eos=[5])]).item() == 5
    ignoring = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[6], ignore_eos=True)
    assert sample(logits, [request(ignoring, output=[1, 1], eos=[5])]).item() == 5
    stop_first = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 8.0, 9.0]])
    assert sample(stop_first, [request(ignoring, output=[1, 1], eos=[5])]).item() == 5


def test_logprobs_are_raw_log_softmax() -> None:
    torch.manual_seed(5)
    logits = torch.randn(3, 40, dtype=torch.bfloat16)
    params = [
        SamplingParams(logprobs=3, temperature=0.5, repetition_penalty=1.5),
        SamplingParams(logprobs=0, seed=1),
        SamplingParams(temperature=0.0, presence_penalty=1.0),
    ]
    batch = SamplingBatch.build([request(p, prompt=[0, 1, 2], output=[3]) for p in params], 40, CPU)
    out = Sampler()(logits, batch)
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert out.logprobs is not None and out.top_token_ids is not None and out.top_logprobs is not None
    assert out.logprobs.dtype == torch.float32 and out.top_logprobs.shape == (3, 3)
    assert torch.equal(out.logprobs, expected.gather(1, out.token_ids.unsqueeze(1)).squeeze(1))
    top = expected.topk(3, dim=-1)
    assert torch.equal(out.top_token_ids[0], top.indices[0])
    assert torch.equal(out.top_logprobs[0], top.values[0])


def test_no_logprobs_unless_asked() -> None:
    out = Sampler()(torch.randn(2, 10), SamplingBatch.build([request(SamplingParams())] * 2, 10, CPU))
    assert out.logprobs is None and out.top_token_ids is None and out.top_logprobs is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seeded_tokens_match_between_cpu_and_cuda() -> None:
    torch.manual_seed(6)
    logits = torch.randn(64, 1000)
    requests = [request(SamplingParams(seed=i, top_p=0.9), output=range(i)) for i in range(64)]
    assert torch.equal(sample(logits, requests), sample(logits, requests, torch.device("cuda")))
