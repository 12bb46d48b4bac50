"""KV tables: a model mixing sliding-window and full-attention layers keeps only the window of its windowed layers.

The split (ops/attention/kv_tables.py) is checked on specs; then a tiny Qwen3 whose last two of four layers attend
through an 8-token window serves three requests of ~70 tokens under a byte budget in which the same model without
windows cannot hold one max_model_len request, through the scheduler and the worker in one process (chunked
prefill, async scheduling, a prefix-cache hit, preemption), with the greedy tokens of transformers.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.ops.attention.kv_cache_spec import FullAttentionSpec, MLALatentSpec
from rapid_llm.ops.attention.kv_tables import kv_tables
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.unit.worker_engine import Engine

WINDOW, BLOCK_SIZE, MAX_LEN, NEW_TOKENS = 8, 4, 96, 12
# The byte budget: this many blocks (plus the padding block) of all four layers.
FULL_BLOCKS = 20


def spec(window: int | None, heads: int = 2) -> FullAttentionSpec:
    return FullAttentionSpec(torch.float32, heads, 16, window)


def test_layers_split_into_equal_tables_by_window_sharing_tensors() -> None:
    tables = kv_tables([spec(None), spec(8), spec(None), spec(8), spec(8), spec(8)])
    assert tables.windows == (None, 8, 8)  # 2 full, 4 windowed: tables of gcd(2, 4) = 2 layers
    assert tables.table_of == (0, 1, 0, 1, 2, 2)
    assert tables.tensor_of == (0, 0, 1, 1, 0, 1)
    odd = kv_tables([spec(4), spec(None), spec(4), spec(4)])
    assert odd.windows == (None, 4, 4, 4) and odd.num_tensors == 1


@pytest.mark.parametrize("specs, window", [
    ([spec(8), spec(8)], 8),  # windows agree: one table, freed behind the window
    ([spec(8), spec(16, heads=4)], 16),  # pages differ, every layer windowed: the longest window
    ([spec(None), spec(8, heads=4)], None),  # pages differ: one table reading the whole context
    ([spec(None), MLALatentSpec(torch.float32, 16, 8)], None),
], ids=["same-window", "windows-pages-differ", "full-pages-differ", "mla"])
def test_one_table_when_windows_agree_or_pages_differ(specs, window) -> None:
    tables = kv_tables(specs)
    assert tables.windows == (window,) and tables.tensor_of == tuple(range(len(specs)))


def qwen3(tiny_checkpoint, windowed: bool):
    return tiny_checkpoint("Qwen3ForCausalLM", num_hidden_layers=4, max_position_embeddings=MAX_LEN,
                           use_sliding_window=windowed, sliding_window=WINDOW, max_window_layers=2)


def runner_for(checkpoint) -> ModelRunner:
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32")
    hf = transformers.AutoConfig.from_pretrained(checkpoint)
    layer_bytes = FullAttentionSpec(torch.float32, hf.num_key_value_heads, hf.head_dim).bytes_per_block(BLOCK_SIZE)
    budget = (FULL_BLOCKS + 1) * hf.num_hidden_layers * layer_bytes
    return ModelRunner(model, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory_bytes=budget), DeviceConfig("cpu"),
                       max_num_seqs=4)


def test_the_model_without_windows_is_refused_the_budget(tiny_checkpoint) -> None:
    runner = runner_for(qwen3(tiny_checkpoint, windowed=False))
    assert runner.kv_cache.windows == (None,) and runner.num_blocks == FULL_BLOCKS
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        Engine(runner, max_num_batched_tokens=8)


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_mixed_window_requests_beyond_the_full_budget_match_transformers(tiny_checkpoint, depth: int) -> None:
    checkpoint = qwen3(tiny_checkpoint, windowed=True)
    runner = runner_for(checkpoint)
    assert runner.kv_cache.windows == (None, WINDOW)
    layers = runner.kv_cache.layers
    assert layers[0].kv_cache is layers[2].kv_cache and layers[1].kv_cache is layers[3].kv_cache
    assert runner.num_blocks == 2 * (FULL_BLOCKS + 1) - 1  # a block id costs two layers' pages, not four
    generator = torch.Generator().manual_seed(5)
    vocab_size = runner.model_config.vocab_size
    prompts = [torch.randint(10, vocab_size, (n,), generator=generator).tolist() for n in (72, 76)]
    prompts.append(prompts[0][:32] + prompts[1][:42])  # shares a cached prefix with the first
    assert min(len(p) for p in prompts) + NEW_TOKENS > FULL_BLOCKS * BLOCK_SIZE
    engine = Engine(runner, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=depth)
    assert [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))] == \
        hf_greedy(hf_model(checkpoint, torch.float32), prompts, NEW_TOKENS)
    stats = engine.scheduler.stats()
    assert stats.num_preemptions > 0, "the three requests should not fit at once"
    assert stats.prefix_cache_hits > 0
