"""Two-batch overlap on CPU gloo ranks: big steps run as two micro-batches cut at the token midpoint
(worker_proc/micro_batches.py) whose collectives are issued asynchronously and interleaved with the other's compute
(distributed/micro_batch_overlap.py). With every step of two or more tokens split and 16-token chunks: greedy tokens
and logprobs equal transformers' (within 1e-4) offline on fp32 Qwen3-MoE with EP=2 and dense Llama with TP=2; greedy
tokens equal transformers' through the real server (async scheduling, four concurrent requests) on Qwen3-MoE with EP=2
and DeepSeek-V3 (MLA) with TP=2; n-gram drafts and an fp8 KV cache keep the tokens of the overlap off; what it cannot
serve is refused at start (quantized linears among them: TP refuses them)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from rapid_llm.distributed.micro_batch_overlap import run_collective, run_two
from rapid_llm.distributed.timeline import start_timeline, stop_timeline
from rapid_llm.server_args import ServerArgs
from rapid_llm.worker_proc.micro_batches import split_micro_batches
from tests.distributed.golden import assert_matches_transformers, generate, random_prompts
from tests.distributed.test_pp_server import NEW_TOKENS, complete
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

# Every step of two or more tokens splits: decodes of two requests, and every prefill chunk.
SPLIT_ALL = {"enable_two_batch_overlap": True, "dbo_decode_token_threshold": 2, "dbo_prefill_token_threshold": 2}
LAYOUTS = [("Qwen3MoeForCausalLM", ("--enable-expert-parallel",)), ("DeepseekV3ForCausalLM", ())]
IDS = ["qwen3moe-ep2", "dsv3-tp2"]


def test_two_batch_overlap_matches_transformers(tiny_checkpoint) -> None:
    """Qwen3-MoE at EP=2 (DeepSeek-V3's MLA is checked offline with AFD, test_afd_golden, and through the server)."""
    assert_matches_transformers(tiny_checkpoint("Qwen3MoeForCausalLM"), 2, "qwen3moe ep2 tbo",
                                max_num_batched_tokens=16, enable_expert_parallel=True, **SPLIT_ALL)


@pytest.mark.parametrize("architecture,flags", LAYOUTS, ids=IDS)
def test_two_batch_overlap_server_equals_transformers(tiny_checkpoint, architecture: str,
                                                      flags: tuple[str, ...]) -> None:
    checkpoint = tiny_checkpoint(architecture)
    prompts = random_prompts((40, 45, 37, 42), seed=11)
    expected = hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    server = ServerProcess("--model", str(checkpoint), "--tp", "2", *flags, "--enable-two-batch-overlap",
                           "--dbo-decode-token-threshold", "2", "--dbo-prefill-token-threshold", "2",
                           "--max-num-batched-tokens", "16", "--max-model-len", "128")
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(lambda prompt: complete(server, prompt), prompts)) == expected
        info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
        assert info["two_batch_overlap"] == {"decode_token_threshold": 2, "prefill_token_threshold": 2}
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=5).text
        split_steps = [line for line in metrics.splitlines() if line.startswith("rapid_llm:two_batch_overlap_steps")]
        assert split_steps and float(split_steps[0].split()[-1]) > 0, split_steps
    finally:
        server.stop()


def test_two_batch_overlap_on_dense_tensor_parallel_matches_transformers(tiny_checkpoint) -> None:
    assert_matches_transformers(tiny_checkpoint("LlamaForCausalLM"), 2, "llama tp2 tbo", max_num_batched_tokens=16,
                                **SPLIT_ALL)


@pytest.mark.parametrize("feature", [
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                            "prompt_lookup_max": 3}},
    {"kv_cache_dtype": "fp8"}], ids=["ngram", "fp8-kv"])
def test_two_batch_overlap_keeps_greedy_tokens_with(tiny_checkpoint, feature: dict) -> None:
    """EP=2 with n-gram drafts (verify steps split like any others) or an fp8 KV cache: the same tokens with the
    overlap on as off."""
    checkpoint = tiny_checkpoint("Qwen3MoeForCausalLM")
    prompts = [[5, 6, 7, 8] * 6, [40, 41, 40, 41, 40, 41, 40], *random_prompts((21,), seed=9)]
    on = generate(checkpoint, prompts, 2, enable_expert_parallel=True, **feature, **SPLIT_ALL)
    off = generate(checkpoint, prompts, 2, enable_expert_parallel=True, **feature)
    assert [output.token_ids for output in on] == [output.token_ids for output in off]


def test_split_cuts_at_the_token_midpoint() -> None:
    """A 5-token prompt and two decodes: the prompt's first 3 tokens, then its last 2 (a continuation chunk) and the
    decodes; a cut on a chunk boundary splits no chunk; decodes halve."""
    first, second = split_micro_batches(np.array([5, 1, 1]), np.array([9, 20, 30]))
    assert (first.rows, first.query_lens.tolist(), first.seq_lens.tolist()) == (slice(0, 1), [3], [7])
    assert (second.rows, second.query_lens.tolist(), second.seq_lens.tolist()) == (slice(0, 3), [2, 1, 1], [9, 20, 30])
    first, second = split_micro_batches(np.array([2, 2]), np.array([2, 6]))
    assert (first.rows, first.query_lens.tolist(), second.rows, second.query_lens.tolist()) == (
        slice(0, 1), [2], slice(1, 2), [2])
    first, second = split_micro_batches(np.ones(5, dtype=np.int64), np.arange(5) + 3)
    assert (first.query_lens.sum(), second.query_lens.sum(), second.seq_lens.tolist()) == (2, 3, [5, 6, 7])
    with pytest.raises(ValueError, match="cannot be split"):
        split_micro_batches(np.array([1]), np.array([4]))


def test_layouts_two_batch_overlap_cannot_serve_are_refused(tiny_checkpoint) -> None:
    llama = str(tiny_checkpoint("LlamaForCausalLM"))
    lfm2 = str(tiny_checkpoint("Lfm2ForCausalLM"))
    two = {"enable_two_batch_overlap": True, "tensor_parallel_size": 2}
    for model, args, message in [
            (llama, {"enable_two_batch_overlap": True}, "--tensor-parallel-size of at least 2"),
            (lfm2, two, "not split by tokens"),
            (llama, {**two, "pipeline_parallel_size": 2}, "--pipeline-parallel-size"),
            (llama, {**two, "prefill_context_parallel_size": 2}, "context parallelism"),
            (llama, {**two, "speculative_config": '{"method": "draft_model", "model": "' + llama + '", '
                                                  '"num_speculative_tokens": 2}'}, "hidden states"),
            (llama, {**two, "dbo_prefill_token_threshold": 1}, "at least 2"),
            (llama, {**two, "quantization": "fp8"}, "quantized linear layers")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=model, **args).engine_config(model)


def test_micro_batches_interleave_at_collectives_in_a_fixed_order() -> None:
    """Each micro-batch issues its collective asynchronously and waits for it only after the other's compute; outside
    `run_two` a collective blocks; an error in one micro-batch reaches the caller after the other finishes."""
    cpu, events = torch.device("cpu"), []

    class Work:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait(self) -> None:
            events.append(f"wait {self.name}")

    def start(name: str, async_op: bool) -> Work:
        events.append(f"start {name}" + ("" if async_op else " blocking"))
        return Work(name)

    def forward(name: str, fail: bool = False):
        def run() -> torch.Tensor:
            for layer in range(2):
                events.append(f"compute {name}{layer}")
                run_collective(cpu, "fake", lambda async_op: start(f"{name}{layer}", async_op))
            if fail:
                raise RuntimeError(f"{name} failed")
            return torch.tensor([len(name)])
        return run

    start_timeline()
    assert [t.item() for t in run_two([forward("A"), forward("BB")], cpu)] == [1, 2]
    spans = stop_timeline()
    # Each micro-batch's turns end where it hands the baton over: after each issue, and at its end.
    assert [(span.kind, span.name) for span in spans if span.kind == "turn"] == [
        ("turn", f"micro-batch {index}") for index in (0, 1, 0, 1, 0, 1)]
    assert sum(span.kind == "issue" for span in spans) == 4 and sum(span.kind == "wait" for span in spans) == 4
    assert events == ["compute A0", "start A0", "compute BB0", "start BB0", "wait A0", "compute A1", "start A1",
                      "wait BB0", "compute BB1", "start BB1", "wait A1", "wait BB1"]
    events.clear()
    run_collective(cpu, "fake", lambda async_op: start("alone", async_op))
    assert events == ["start alone blocking"]
    events.clear()
    with pytest.raises(RuntimeError, match="BB failed"):
        run_two([forward("A"), forward("BB", fail=True)], cpu)
    assert events[-1] == "wait BB1"
