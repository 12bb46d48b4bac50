"""The parity check every MoE model's variant tests run: fp32 prefill logits within 1e-3 of transformers'
and NEW_TOKENS greedy tokens equal to its generate(do_sample=False), with mixed-length prompts, chunked
prefill and staggered arrivals (prefill chunks in the same steps as other requests' decodes); and the
cache checks of models with their own cache layout (MLA, DeepSeek-V4): a request that reuses another's
blocks as prefix-cache hits, and NaN in unassigned blocks that must never reach the output."""

from __future__ import annotations

from pathlib import Path

import torch

from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest
from tests.hf_reference import hf_greedy, hf_logits, hf_model
from tests.models.paged_generation import generate, prefill_logits
from tests.models.test_hf_parity import NEW_TOKENS, _prompts, _runner

LOGIT_TOLERANCE = 1e-3


def assert_matches_transformers(checkpoint: Path, lengths: tuple[int, ...] = (9, 23, 31)) -> float:
    """Run both checks; return the largest absolute fp32 logit difference seen."""
    runner = _runner(checkpoint, block_size=5)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=lengths, seed=5)
    max_diff = max((ours - hf_logits(hf, prompt)).abs().max().item()
                   for ours, prompt in zip(prefill_logits(runner, prompts), prompts))
    assert max_diff <= LOGIT_TOLERANCE
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    sequences = generate(runner, prompts, params, chunk_size=8, stagger=2)
    assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)
    return max_diff


def greedy_from_blocks(runner: ModelRunner, slot: int, prompt: list[int], blocks: list[int], computed: int,
                       free: list[int]) -> list[int]:
    """NEW_TOKENS greedy tokens of one request whose first `computed` tokens are already in `blocks` (prefix-cache
    hits); `blocks` grows from `free` as the request needs more."""
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    runner.add_request(slot, prompt)
    block_size, output = runner.cache_config.block_size, []
    while len(output) < NEW_TOKENS:
        num_tokens = len(prompt) + len(output)
        while len(blocks) * block_size < num_tokens:
            blocks.append(free.pop())
            runner.clear_blocks(blocks[-1:])
        request = ScheduledRequest(str(slot), slot, prompt, list(output), computed, num_tokens - computed,
                                   list(blocks), params)
        output += runner.execute([request]).token_ids
        computed = num_tokens
    return output


def assert_prefix_hit_matches(checkpoint: Path, block_size: int, shared_blocks: int) -> None:
    """A second request that never computes its first shared_blocks * block_size tokens (the first request's
    blocks, as prefix-cache hits give them) still generates what transformers does."""
    runner = _runner(checkpoint, block_size=block_size)
    hf = hf_model(checkpoint, torch.float32)
    first, tail = _prompts(runner.model_config.vocab_size, lengths=(22, 7), seed=6)
    shared = shared_blocks * block_size
    second = first[:shared] + tail
    free = list(range(runner.num_blocks - 1, 0, -1))
    first_blocks: list[int] = []
    assert greedy_from_blocks(runner, 0, first, first_blocks, 0, free) == hf_greedy(hf, [first], NEW_TOKENS)[0]
    assert greedy_from_blocks(runner, 1, second, first_blocks[:shared_blocks], shared, free) == hf_greedy(
        hf, [second], NEW_TOKENS)[0]


def assert_unassigned_blocks_never_leak(checkpoint: Path) -> None:
    """NaN in every block but the padding block (each is zeroed when handed out) must not change greedy tokens."""
    runner = _runner(checkpoint, block_size=4)
    for layer in runner.kv_cache.layers:
        layer.kv_cache[: runner.padding_block].fill_(float("nan"))
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=(6, 13), seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8)
    assert [s.output for s in generate(runner, prompts, params, stagger=1)] == hf_greedy(hf, prompts, 8)
