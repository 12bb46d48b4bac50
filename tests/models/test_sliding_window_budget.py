"""A sliding-window model serves contexts longer than its KV budget: blocks behind every layer's window are freed.

A tiny Mistral with an 8-token window, 4-token blocks and a budget of 10 blocks (40 tokens) serves three requests
of 60-70 tokens each through the scheduler and the worker in one process (chunked prefill, async scheduling,
prefix caching, preemption when the three do not fit at once). A full-attention model is refused that budget; the
windowed one must give the same greedy tokens as transformers.
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.unit.worker_engine import Engine

WINDOW, BLOCK_SIZE, BUDGET_BLOCKS, NEW_TOKENS = 8, 4, 10, 12


def runner_for(checkpoint) -> ModelRunner:
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32")
    return ModelRunner(model, CacheConfig(block_size=BLOCK_SIZE, num_blocks=64), DeviceConfig("cpu"), max_num_seqs=4)


def test_a_full_attention_model_is_refused_the_small_budget(tiny_checkpoint) -> None:
    runner = runner_for(tiny_checkpoint("LlamaForCausalLM"))
    assert runner.kv_cache.windows == (None,)
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        Engine(runner, max_num_batched_tokens=8, num_kv_blocks=BUDGET_BLOCKS)


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_windowed_requests_longer_than_the_budget_match_transformers(tiny_checkpoint, depth: int) -> None:
    checkpoint = tiny_checkpoint("MistralForCausalLM", sliding_window=WINDOW)
    runner = runner_for(checkpoint)
    assert runner.kv_cache.windows == (WINDOW,)
    generator = torch.Generator().manual_seed(11)
    vocab_size = runner.model_config.vocab_size
    prompts = [torch.randint(10, vocab_size, (n,), generator=generator).tolist() for n in (50, 57)]
    prompts.append(prompts[0][:20] + prompts[1][:30])  # shares a cached prefix with the first
    assert min(len(p) for p in prompts) + NEW_TOKENS > BUDGET_BLOCKS * BLOCK_SIZE
    engine = Engine(runner, max_num_batched_tokens=8, num_kv_blocks=BUDGET_BLOCKS)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=depth)
    assert [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))] == \
        hf_greedy(hf_model(checkpoint, torch.float32), prompts, NEW_TOKENS)
    assert engine.scheduler.stats().num_preemptions > 0, "the three requests should not fit at once"
