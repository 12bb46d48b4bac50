"""Attention-FFN disaggregation on CPU gloo ranks: the TP (attention) ranks hand every MoE layer to FFN ranks of their
own (distributed/ffn_exchange.py, worker_proc/ffn_worker.py). Greedy tokens and logprobs equal transformers'
(within 1e-4) on fp32 Qwen3-MoE (1 attention rank, 2 FFN ranks with the experts partitioned; with and without two-batch
overlap's ping-pong) and DeepSeek-V3 (MLA, dense first layer: TP=2 attention ranks, 1 FFN rank; with it), with chunked
prefill; offline and through the real server; what it does not serve is refused at start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rapid_llm.server_args import ServerArgs
from tests.distributed.golden import assert_matches_transformers, random_prompts
from tests.distributed.test_pp_server import NEW_TOKENS, complete
from tests.distributed.test_two_batch_overlap import SPLIT_ALL
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

LAYOUTS = {"qwen3moe-1a2f-ep": ("Qwen3MoeForCausalLM", 1, {"afd_config": {"num_ffn_ranks": 2},
                                                            "enable_expert_parallel": True}),
           "dsv3-2a1f": ("DeepseekV3ForCausalLM", 2, {"afd_config": {"num_ffn_ranks": 1}})}


@pytest.mark.parametrize("layout,overlap", [("qwen3moe-1a2f-ep", False), ("qwen3moe-1a2f-ep", True),
                                            ("dsv3-2a1f", True)], ids=["qwen3moe-1a2f-ep", "qwen3moe-1a2f-ep-tbo",
                                                                     "dsv3-2a1f-tbo"])
def test_afd_matches_transformers(tiny_checkpoint, layout: str, overlap: bool) -> None:
    architecture, attention_ranks, flags = LAYOUTS[layout]
    assert_matches_transformers(tiny_checkpoint(architecture), attention_ranks, f"{layout} afd",
                                max_num_batched_tokens=16, **flags, **(SPLIT_ALL if overlap else {}))


@pytest.mark.parametrize("architecture,ffn_ranks,flags", [("Qwen3MoeForCausalLM", 2, ("--enable-expert-parallel",)),
                                                          ("DeepseekV3ForCausalLM", 1, ("--tp", "2"))],
                         ids=["qwen3moe-1a2f-ep", "dsv3-2a1f"])
def test_afd_server_equals_transformers(tiny_checkpoint, architecture: str, ffn_ranks: int,
                                        flags: tuple[str, ...]) -> None:
    """The real server with 1 attention rank and 2 FFN ranks (experts partitioned) or, for MLA, 2 attention ranks (TP)
    and 1 FFN rank; two-batch overlap splitting every step, four concurrent requests; stopping it leaves no FFN rank
    behind."""
    checkpoint = tiny_checkpoint(architecture)
    prompts = random_prompts((40, 45, 37, 42), seed=11)
    expected = hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    server = ServerProcess("--model", str(checkpoint), "--afd-config", f'{{"num_ffn_ranks": {ffn_ranks}}}', *flags,
                           "--enable-two-batch-overlap",
                           "--dbo-decode-token-threshold", "2", "--dbo-prefill-token-threshold", "2",
                           "--max-num-batched-tokens", "16", "--max-model-len", "128", "--log-level", "info")
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(lambda prompt: complete(server, prompt), prompts)) == expected
        assert httpx.get(f"{server.base_url}/server_info", timeout=5).json()["afd_ffn_ranks"] == ffn_ranks
    finally:
        server.stop()
    assert not any(title.startswith(b"rapid_llm::ffn") for title in _process_titles())


def _process_titles() -> list[bytes]:
    titles = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            titles.append(path.read_bytes())
        except OSError:  # the process ended while listed
            continue
    return titles


def test_layouts_afd_cannot_serve_are_refused(tiny_checkpoint) -> None:
    llama = str(tiny_checkpoint("LlamaForCausalLM"))
    moe = str(tiny_checkpoint("Qwen3MoeForCausalLM"))
    afd = {"afd_config": '{"num_ffn_ranks": 1}'}
    for model, args, message in [
            (llama, afd, "LlamaForCausalLM is not disaggregated"),
            (moe, {"afd_config": '{"num_ffn_ranks": 0}'}, "num_ffn_ranks must be at least 1"),
            (moe, {"afd_config": '{"ffn": 1}'}, "unknown field"),
            (moe, {**afd, "pipeline_parallel_size": 2}, "--pipeline-parallel-size > 1"),
            (moe, {**afd, "data_parallel_size": 2}, "--data-parallel-size > 1"),
            (moe, {**afd, "speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'},
             "--speculative-config"),
            (moe, {**afd, "quantization": "fp8"}, "quantization")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=model, **args).engine_config(model)
