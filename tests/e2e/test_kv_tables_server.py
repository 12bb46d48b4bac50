"""A model mixing sliding-window and full-attention layers, served by the real server with two KV tables.

A tiny Qwen3 whose last two of four layers attend through an 8-token window gets a byte budget that holds 20
blocks of all four layers (80 tokens, less than its 96-token max_model_len: tests/models/test_kv_tables.py shows
the same model without windows refused it). With a table per window its block ids cost two layers each, so the
server starts with 41 blocks and serves a batch of ~85-token requests with chunked prefill, async scheduling,
prefix caching (a repeated prompt hits) and preemption, with transformers' greedy tokens; beam search is refused.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import torch
import transformers

from rapid_llm.ops.attention.kv_cache_spec import FullAttentionSpec
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

WINDOW, BLOCK_SIZE, MAX_LEN, NEW_TOKENS, FULL_BLOCKS = 8, 4, 96, 12, 20


def test_a_mixed_window_model_serves_beyond_the_full_attention_budget(tmp_path: Path) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "qwen3", "Qwen3ForCausalLM", num_hidden_layers=4,
                                       max_position_embeddings=MAX_LEN, use_sliding_window=True,
                                       sliding_window=WINDOW, max_window_layers=2)
    hf = transformers.AutoConfig.from_pretrained(checkpoint)
    layer_bytes = FullAttentionSpec(torch.float32, hf.num_key_value_heads, hf.head_dim).bytes_per_block(BLOCK_SIZE)
    budget = (FULL_BLOCKS + 1) * hf.num_hidden_layers * layer_bytes
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, hf.vocab_size, (n,), generator=generator).tolist() for n in (72, 76, 70)]
    prompts.append(prompts[0][:40] + prompts[2][:34])  # shares ten blocks with the first
    expected = hf_greedy(hf_model(checkpoint, torch.float32), prompts, NEW_TOKENS)
    server = ServerProcess("--model", str(checkpoint), "--block-size", str(BLOCK_SIZE), "--kv-cache-memory",
                           str(budget), "--max-num-batched-tokens", "8", "--max-num-seqs", "4", "--dtype", "float32")
    try:
        info = httpx.get(f"{server.base_url}/server_info", timeout=10).raise_for_status().json()
        assert info["num_kv_blocks"] == 2 * (FULL_BLOCKS + 1) - 1, info
        model = str(checkpoint)
        assert server.greedy_token_ids(model, prompts, NEW_TOKENS) == expected
        assert server.greedy_token_ids(model, prompts[1:2], NEW_TOKENS, timeout=60) == expected[1:2]
        metrics = server.metrics()
        assert metrics["rapid_llm:prefix_cache_hits_total"] > 0
        assert sum(value for name, value in metrics.items() if "preemption" in name) > 0, metrics
        beams = server.beam_search(model, prompts[0])
        assert beams.status_code == 400 and "block tables" in beams.text, beams.text
    finally:
        server.stop()
