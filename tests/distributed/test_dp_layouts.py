"""Data parallelism crossed with the other engine features (the mixed-layout cells of docs/parallelism.md):
greedy tokens equal transformers' for dp2 with chunked prefill, lock-step scheduling and prefix caching under
the cache_aware router (the shared-prefix prompts hit the cache of the replica they were routed to), and
(slow) for tp2 x dp2 with chunked prefill, async scheduling and prefix caching: two replicas of two gloo
ranks each."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.entrypoints.llm import LLM
from rapid_llm.sampling import SamplingParams
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 8


def shared_prefix_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(21)
    prefix = torch.randint(10, 500, (48,), generator=generator).tolist()  # 3 blocks of 16
    return [prefix + torch.randint(10, 500, (3 + i,), generator=generator).tolist() for i in range(4)]


def generate_in_waves(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """The first prompt alone (so its blocks are cached), then the rest together."""
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    first = llm.generate(prompts[:1], params)
    return [output.token_ids for output in first + llm.generate(prompts[1:], params)]


def test_dp2_chunked_lockstep_cache_aware(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    prompts = shared_prefix_prompts()
    with LLM(str(checkpoint), num_kv_blocks=64, data_parallel_size=2, load_balance_method="cache_aware",
             max_num_batched_tokens=16, disable_async_scheduling=True) as llm:
        tokens = generate_in_waves(llm, prompts)
        cache_routed = [load.cache_routed for load in llm._router.loads]
    assert tokens == hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    # Prompts 2-4 share the first one's 3 blocks; within the balance threshold they follow it to its replica.
    assert sorted(cache_routed) == [0, 3]


@pytest.mark.slow
def test_tp2_dp2(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    prompts = shared_prefix_prompts()
    # Async scheduling and prefix caching are on by default; a 16-token budget chunks every 51-54-token prompt.
    with LLM(str(checkpoint), num_kv_blocks=64, tensor_parallel_size=2, data_parallel_size=2,
             max_num_batched_tokens=16) as llm:
        tokens = generate_in_waves(llm, prompts)
        routed = [load.routed for load in llm._router.loads]
    assert tokens == hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    assert routed == [2, 2]
