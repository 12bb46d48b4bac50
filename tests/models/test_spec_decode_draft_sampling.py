"""Sampling with draft-model speculation is lossless: χ² tests (p > 0.05) that each of the first four emitted
tokens follows the target's own distribution, over 102,400 sampled tokens (25,600 seeded requests, a
16-token vocabulary, temperature 0.8, k = 2), against exact marginals from transformers; and the measured
acceptance of a first draft equals E[Σ min(p, q)], the rate of min(1, p/q) acceptance -- not E[Σ p q], what
one-hot matching of sampled drafts would give. Method and raw counts: docs/spec_decode/README.md."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_model
from tests.unit.test_rejection_sampler import p_value
from tests.unit.worker_engine import Engine

VOCAB = 16
TEMPERATURE = 0.8
PROMPT = [3, 5, 7, 9]
NUM_TOKENS = 4
BATCHES, BATCH = 25, 1024
FIRST_SEED = 1_000_000  # seed sets and their p-values: docs/spec_decode/README.md


def _distributions(model, contexts: list[list[int]]) -> torch.Tensor:
    """[len(contexts), V] next-token probabilities at the fixed temperature."""
    with torch.inference_mode():
        return (model(torch.tensor(contexts)).logits[:, -1].float() / TEMPERATURE).softmax(dim=-1).double()


def _exact_marginals(model) -> list[torch.Tensor]:
    """P(token i = x) for i < NUM_TOKENS, summing over every earlier continuation (16^3 contexts at most)."""
    marginals, joint = [], torch.ones(1, dtype=torch.float64)  # joint over the continuations so far
    continuations: list[tuple[int, ...]] = [()]
    for _ in range(NUM_TOKENS):
        step = _distributions(model, [PROMPT + list(c) for c in continuations])  # [C, V]
        marginals.append((joint.unsqueeze(1) * step).sum(dim=0))
        joint = (joint.unsqueeze(1) * step).reshape(-1)
        continuations = [c + (x,) for c in continuations for x in range(VOCAB)]
    return marginals


def _pooled_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's χ² with the cells expected below 5 pooled into one."""
    small = probs * counts.sum() < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().unsqueeze(0)])
        probs = torch.cat([probs[~small], probs[small].sum().unsqueeze(0)])
    return p_value(counts, probs)


def _serve(runner: ModelRunner, speculative: SpeculativeConfig, num_batches: int, max_tokens: int):
    engine = Engine(runner, max_num_batched_tokens=4096, max_num_seqs=BATCH, speculative=speculative)
    tokens = []
    for batch in range(num_batches):
        params = [SamplingParams(temperature=TEMPERATURE, seed=FIRST_SEED + batch * BATCH + i, max_tokens=max_tokens,
                                 ignore_eos=True) for i in range(BATCH)]
        requests = [GenerateRequest(f"r{batch}-{i}", PROMPT, p) for i, p in enumerate(params)]
        tokens += [outcome["token_ids"] for outcome in engine.serve(requests, depth=1).values()]
    assert engine.scheduler.stats().kv_blocks_used == 0
    return torch.tensor(tokens), engine.scheduler.stats()


@pytest.mark.slow  # 102,400 sampled tokens: 30-120 s on a busy 2-core machine
def test_sampled_tokens_with_the_draft_model_follow_the_target(tiny_checkpoint) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM", vocab_size=VOCAB))
    draft = str(tiny_checkpoint("LlamaForCausalLM", vocab_size=VOCAB, num_hidden_layers=1, hidden_size=32))
    speculative = SpeculativeConfig(method="draft_model", model=draft, num_speculative_tokens=2)
    config = ModelConfig.from_pretrained(target, dtype="float32", max_model_len=32)
    runner = ModelRunner(config, CacheConfig(block_size=4, num_blocks=4000), DeviceConfig("cpu"), max_num_seqs=BATCH,
                         speculative=speculative)
    target_model, draft_model = hf_model(target), hf_model(draft)

    tokens, stats = _serve(runner, speculative, BATCHES, NUM_TOKENS)
    assert tokens.numel() == BATCHES * BATCH * NUM_TOKENS >= 100_000
    assert stats.spec_decode_num_accepted_tokens > 0
    for position, probs in enumerate(_exact_marginals(target_model)):
        counts = torch.bincount(tokens[:, position], minlength=VOCAB)
        assert _pooled_p_value(counts, probs) > 0.05, (position, counts.tolist())

    # max_tokens 3: exactly one verification per request, of one draft after the first token.
    _, stats = _serve(runner, speculative, 4, 3)
    assert stats.spec_decode_num_draft_tokens == stats.spec_decode_num_drafts == 4 * BATCH
    contexts = [PROMPT + [x] for x in range(VOCAB)]
    first = _distributions(target_model, [PROMPT])[0]
    p, q = _distributions(target_model, contexts), _distributions(draft_model, contexts)
    exact = float((first * torch.minimum(p, q).sum(dim=1)).sum())
    one_hot = float((first * (p * q).sum(dim=1)).sum())
    error = (exact * (1 - exact) / (4 * BATCH)) ** 0.5
    assert abs(exact - one_hot) > 8 * error  # the check below tells the two rules apart
    assert abs(stats.spec_decode_num_accepted_tokens / (4 * BATCH) - exact) < 4 * error
