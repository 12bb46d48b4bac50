"""The worker's beam-search deltas: `block_copies` copy whole KV blocks in every layer (bf16 and fp8 caches,
bytes and all) before the step's forward, and `last_tokens` overwrite a slot's last known token."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import BlockCopy, LastToken, NewRequest, ScheduledChunk, StepPlan
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from rapid_llm.worker_proc.worker import Worker


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16)


def _runner(checkpoint, cache_dtype: str) -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), max_model_len=32)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=8, cache_dtype=cache_dtype), DeviceConfig("cpu"),
                       max_num_seqs=2)


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_copy_blocks_copies_every_layer(checkpoint, cache_dtype) -> None:
    runner = _runner(checkpoint, cache_dtype)
    cache = runner.kv_cache
    generator = torch.Generator().manual_seed(0)
    for layer in cache.layers:
        raw = layer.kv_cache.view(torch.uint8)
        raw.copy_(torch.randint(0, 120, raw.shape, dtype=torch.uint8, generator=generator))
    before = [layer.kv_cache.view(torch.uint8).clone() for layer in cache.layers]
    cache.copy_blocks([1, 1, 4], [2, 5, 6])
    for layer, spec, old in zip(cache.layers, cache.specs, before):
        new = layer.kv_cache.view(torch.uint8)
        for src, dst in ((1, 2), (1, 5), (4, 6)):
            assert torch.equal(new.select(spec.block_dim, dst), old.select(spec.block_dim, src))
        for untouched in (0, 1, 3, 4, 7):
            assert torch.equal(new.select(spec.block_dim, untouched), old.select(spec.block_dim, untouched))
    assert len(cache.layers) > 1


def test_a_plan_copies_before_the_forward_and_sets_last_tokens(checkpoint) -> None:
    """A forked beam reads its parent's copied partial block: its logits equal the parent's own, computed on the
    same tokens without any copy."""
    runner = _runner(checkpoint, "auto")
    worker = Worker(runner)
    params = SamplingParams(temperature=0.0, logprobs=5)
    prompt = [11, 12, 13, 14, 15, 16]  # one full block and half of a second
    first = worker.execute_plan(StepPlan(0, new_requests=[NewRequest("p", 0, prompt, 6, params)],
                                         scheduled=[ScheduledChunk(0, 0, 6, [0, 1])]))
    # Slot 0 continues with token 40 (not what it sampled); slot 1 forks: shares block 0, copies block 1 into 2.
    fork = StepPlan(1, new_requests=[NewRequest("p", 1, prompt + [40], 6, params)],
                    scheduled=[ScheduledChunk(0, 6, 1), ScheduledChunk(1, 6, 1, [], [0, 2])],
                    last_tokens=[LastToken(0, 40)], block_copies=[BlockCopy(1, 2)])
    result = worker.execute_plan(fork)
    assert first.slots == [0] and result.slots == [0, 1]
    assert result.logprobs[0].top_token_ids == result.logprobs[1].top_token_ids
    assert result.logprobs[0].top_logprobs == pytest.approx(result.logprobs[1].top_logprobs, abs=1e-6)
    assert runner.input_batch.token_pool[0, 6].item() == 40
