"""Rejection sampler: greedy accept/correct/bonus rules on hand-made grids, padding of ragged drafts, and
distribution equality by a chi-squared test at p > 0.05 (200k samples, 6-token vocabulary): the first emitted
token follows the target p whatever the draft, and the bonus token the next position's, for the draft-free
(n-gram, through the real Sampler) and the draft-probability path; a sampler that always accepts the draft is
rejected by the same test. Seeds are fixed, so a pass is stable (p-values over other seeds look uniform: at
2M samples no bias shows)."""

from __future__ import annotations

import torch

from rapid_llm.layers.sampler import Sampler
from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.spec_decode.rejection_sampler import accept_one_hot, rejection_sample

NUM_SAMPLES = 200_000
P = torch.tensor([[0.35, 0.25, 0.2, 0.1, 0.07, 0.03], [0.05, 0.1, 0.15, 0.2, 0.2, 0.3]])


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-squared test of observed counts against probabilities (survival function via gammaincc)."""
    expected = probs.double() * counts.sum()
    statistic = ((counts.double() - expected) ** 2 / expected).sum()
    degrees = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


def test_greedy_accepts_while_equal_then_takes_the_target_token() -> None:
    targets = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [4, 9, -2, -2]])
    drafts = torch.tensor([[5, 6, 9], [5, 6, 7], [1, 6, 7], [4, -1, -1]])
    num_accepted, tokens = accept_one_hot(targets, drafts)
    # Partial (correction at the first mismatch), all (bonus), none, and a row with one draft of three columns.
    assert num_accepted.tolist() == [2, 3, 0, 1]
    assert tokens.tolist() == [7, 8, 5, 9]


def test_rows_without_drafts_keep_their_one_sample() -> None:
    num_accepted, tokens = accept_one_hot(torch.tensor([[3, -2], [8, 2]]), torch.tensor([[-1], [2]]))
    assert num_accepted.tolist() == [0, 0] and tokens.tolist() == [3, 8]


def _sample_positions(draft: int, generator_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NUM_SAMPLES trials of one draft verified at two positions through the Sampler (temperature 1)."""
    torch.manual_seed(generator_seed)
    logits = P.log().repeat(NUM_SAMPLES, 1)  # rows: trial 0 position 0, trial 0 position 1, ...
    params = SamplingParams(temperature=1.0)
    batch = SamplingBatch.build([SamplingRequest(params, [1], [], [])] * logits.shape[0], 6, torch.device("cpu"))
    targets = Sampler()(logits, batch).token_ids.view(NUM_SAMPLES, 2)
    return accept_one_hot(targets, torch.full((NUM_SAMPLES, 1), draft))


def test_draft_free_path_samples_the_target_distribution() -> None:
    for draft in (0, 5):  # the target's most and least likely token
        num_accepted, tokens = _sample_positions(draft, generator_seed=3)
        first = torch.where(num_accepted == 1, torch.tensor(draft), tokens)
        assert p_value(torch.bincount(first, minlength=6), P[0]) > 0.05
        # After an accepted draft, the bonus token comes from the next position's distribution.
        assert p_value(torch.bincount(tokens[num_accepted == 1], minlength=6), P[1]) > 0.05
        # The acceptance rate is p(draft).
        assert abs(float(num_accepted.double().mean()) - float(P[0, draft])) < 0.005


def test_the_test_rejects_a_sampler_that_always_accepts() -> None:
    num_accepted, tokens = _sample_positions(5, generator_seed=1)
    biased = torch.where(num_accepted >= 0, torch.tensor(5), tokens)
    assert p_value(torch.bincount(biased, minlength=6), P[0]) < 1e-6


def test_draft_probability_path_samples_the_target_distribution() -> None:
    generator = torch.Generator().manual_seed(4)
    q = torch.tensor([0.05, 0.05, 0.1, 0.3, 0.3, 0.2])  # a poor draft model
    drafts = torch.multinomial(q, NUM_SAMPLES, replacement=True, generator=generator).unsqueeze(1)
    uniform = torch.rand(NUM_SAMPLES, 1, generator=generator)
    noise = torch.rand(NUM_SAMPLES, 6, generator=generator).log().neg().log()
    num_accepted, tokens = rejection_sample(P.unsqueeze(0).expand(NUM_SAMPLES, 2, 6), drafts,
                                            q.view(1, 1, 6).expand(NUM_SAMPLES, 1, 6), uniform, noise)
    first = torch.where(num_accepted == 1, drafts[:, 0], tokens)
    assert p_value(torch.bincount(first, minlength=6), P[0]) > 0.05
    assert p_value(torch.bincount(tokens[num_accepted == 1], minlength=6), P[1]) > 0.05
    # Acceptance is sum(min(p, q)).
    assert abs(float(num_accepted.double().mean()) - float(torch.minimum(P[0], q).sum())) < 0.005


def test_draft_probability_path_with_padding_draws_the_bonus_from_the_row_end() -> None:
    target = torch.zeros(1, 3, 4)
    target[0, 0, 2] = target[0, 1, 3] = target[0, 2, 0] = 1.0
    draft_probs = torch.full((1, 2, 4), 0.25)
    num_accepted, tokens = rejection_sample(target, torch.tensor([[2, -1]]), draft_probs, torch.zeros(1, 2),
                                            torch.zeros(1, 4))
    # The one real draft matches p's certain token; position 1 is the bonus, p puts all its mass on 3.
    assert num_accepted.tolist() == [1] and tokens.tolist() == [3]


def test_draft_probability_path_without_drafts_samples_the_bonus() -> None:
    target = torch.tensor([[[0.0, 1.0, 0.0]]])
    num_accepted, tokens = rejection_sample(target, torch.zeros(1, 0, dtype=torch.int64), torch.zeros(1, 0, 3),
                                            torch.zeros(1, 0), torch.zeros(1, 3))
    assert num_accepted.tolist() == [0] and tokens.tolist() == [1]
