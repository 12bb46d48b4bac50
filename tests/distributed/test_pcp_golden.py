"""Prefill context parallelism on CPU gloo ranks: with `--pcp 2` two whole-model replicas split every step's tokens
(zig-zag pieces of each prompt, decodes spread; distributed/prefill_context.py), all-gather K/V and each keep every
token's KV (ops/attention/pcp_backend.py). Greedy tokens and logprobs equal transformers' (within 1e-4) on Llama,
Qwen3-MoE and DeepSeek-V3 (MLA) with chunked prefill, prefix caching, preemption and async scheduling; TP=2 x PCP=2
too; the real server under preemption with PCP and with DCP (test_dcp_golden.py has DCP's other tests);
combinations it cannot serve are refused at start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from rapid_llm.distributed.prefill_context import split_step
from rapid_llm.server_args import ServerArgs
from tests.distributed.golden import assert_matches_transformers, random_prompts
from tests.distributed.test_pp_server import complete
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"])
def test_pcp2_matches_transformers(tiny_checkpoint, architecture: str) -> None:
    assert_matches_transformers(tiny_checkpoint(architecture), 1, f"{architecture} pcp=2",
                                prefill_context_parallel_size=2, max_num_batched_tokens=16)


def test_tp2_pcp2_matches_transformers(tiny_checkpoint) -> None:
    assert_matches_transformers(tiny_checkpoint("LlamaForCausalLM"), 2, "tp=2 pcp=2", prefill_context_parallel_size=2)


# 12 blocks of 16 tokens either way (DCP: 8 per rank). DCP's pinned attention backend returns no log-sum-exp, so
# it is skipped with the reason.
@pytest.mark.parametrize("layout", [("--pcp", "2"), ("--tp", "2", "--dcp", "2", "--block-size", "8",
                                                    "--op-backend", "attention=torch_ref")], ids=["pcp2", "tp2-dcp2"])
def test_context_parallel_server_equals_transformers_under_preemption(tiny_checkpoint, layout: tuple[str, ...]) -> None:
    """The real server (`--pcp 2`, and `--tp 2 --dcp 2` over one KV head), four concurrent requests twice (the
    second round over cached blocks) in a KV cache too small for all four at once, 16-token steps."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=1)
    prompts = random_prompts((40, 45, 37, 42), seed=11)
    expected = hf_greedy(hf_model(checkpoint), prompts, 32)
    server = ServerProcess("--model", str(checkpoint), *layout, "--num-kv-blocks", "12", "--max-num-batched-tokens",
                           "16", "--max-model-len", "128", "--log-level", "info")
    try:
        for _ in range(2):
            with ThreadPoolExecutor(len(prompts)) as pool:
                assert list(pool.map(lambda prompt: complete(server, prompt), prompts)) == expected
        info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
        size_key = "prefill_context_parallel_size" if "--pcp" in layout else "decode_context_parallel_size"
        assert info[size_key] == 2 and "preempt" in server.log()
        if "--dcp" in layout:
            choice = info["ops"]["attention"]
            assert choice["backend"] == "decode_context_parallel" and "no log-sum-exp" in choice["reason"]
    finally:
        server.stop()


def test_zigzag_split_balances_and_covers_every_token() -> None:
    """A 64-token prompt over 2 ranks: pieces 0 and 3 / 1 and 2 of 16 tokens (equal causal work); three decodes
    spread; every token is owned once and the gather rows put the step back in order."""
    query_lens, seq_lens = np.array([64, 1, 1, 1]), np.array([64, 10, 11, 12])
    splits = [split_step(query_lens, seq_lens, rank, 2, torch.device("cpu")) for rank in range(2)]
    assert splits[0].piece_query_lens[:2] == [16, 16] and splits[0].piece_ends[:2] == [16, 64]
    assert splits[1].piece_query_lens[:2] == [16, 16] and splits[1].piece_ends[:2] == [32, 48]
    assert sorted(len(split.mine) for split in splits) == [33, 34]
    owned = sorted(token for split in splits for token in split.mine.tolist())
    assert owned == list(range(67))
    rows = np.concatenate([np.arange(len(split.mine)) + rank * splits[0].width for rank, split in enumerate(splits)])
    order = np.concatenate([split.mine.numpy() for split in splits])
    assert (splits[0].gather_rows.numpy()[order] == rows).all()
    assert split_step(np.array([1]), np.array([5]), 0, 2, torch.device("cpu")) is None  # one token: the step runs whole


def test_layouts_pcp_cannot_serve_are_refused(tiny_checkpoint) -> None:
    llama = str(tiny_checkpoint("LlamaForCausalLM"))
    lfm2 = str(tiny_checkpoint("Lfm2ForCausalLM"))
    for model, args, message in [(lfm2, {}, "Lfm2ForCausalLM is not served with context parallelism"),
                                 (llama, {"pipeline_parallel_size": 2}, "not combined yet"),
                                 (llama, {"kv_cache_dtype": "fp8"}, "--kv-cache-dtype"),
                                 (llama, {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'},
                                  "--speculative-config")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=model, prefill_context_parallel_size=2, **args).engine_config(model)
