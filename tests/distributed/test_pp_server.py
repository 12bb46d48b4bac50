"""The real server with `--pp 2` and `--tp 2 --pp 2` (two pipeline stages of one or two ranks, gloo on CPU):
concurrent greedy completions equal transformers' tokens with chunked prefill (16-token steps), prefix caching
(every prompt sent twice, the second time over cached blocks), async scheduling and preemption (a KV cache of 12
blocks for four requests of five blocks each); /server_info records the layout; flags pipeline stages cannot run
with are refused at start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest

from rapid_llm.server_args import ServerArgs
from tests.distributed.golden import random_prompts
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", num_hidden_layers=3)


@pytest.fixture(scope="module", params=[1, 2], ids=["pp2", "tp2-pp2"])
def served(request, checkpoint) -> Iterator[tuple[ServerProcess, int]]:
    """(the server, its tensor-parallel size)."""
    process = ServerProcess("--model", str(checkpoint), "--tp", str(request.param), "--pp", "2", "--num-kv-blocks",
                            "12", "--max-num-batched-tokens", "16", "--max-model-len", "128", "--log-level", "info")
    yield process, request.param
    process.stop()


def complete(server: ServerProcess, prompt: list[int]) -> list[int]:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "temperature": 0.0,
            "return_token_ids": True}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120).raise_for_status()
    return response.json()["choices"][0]["token_ids"]


def test_pp2_server_equals_transformers_under_preemption(served, checkpoint) -> None:
    server, tensor_parallel_size = served
    prompts = random_prompts((40, 45, 37, 42), seed=11)
    expected = hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    for _ in range(2):  # the second round starts from the first's cached blocks
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(lambda prompt: complete(server, prompt), prompts)) == expected
    info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
    assert (info["pipeline_parallel_size"], info["tensor_parallel_size"]) == (2, tensor_parallel_size)
    log = server.log()
    assert "pipeline stage 1 of 2: decoder layers 1-2" in log and "preempt" in log


def test_what_stages_cannot_run_with_is_refused(checkpoint, tiny_checkpoint) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    hybrid = str(tiny_checkpoint("Lfm2ForCausalLM"))
    for model, args, message in [
            (checkpoint, {"speculative_config": spec}, "--speculative-config"),
            (checkpoint, {"enable_lora": True}, "--enable-lora"),
            (checkpoint, {"pp_layer_partition": "2,2"}, "summing to the model's 3 decoder layers"),
            (checkpoint, {"pipeline_parallel_size": 4}, "fewer than the stages"),
            (hybrid, {}, "Lfm2ForCausalLM is not split into pipeline stages")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=str(model), **{"pipeline_parallel_size": 2, **args}).engine_config(str(model))
