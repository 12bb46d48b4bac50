"""Models with state layers served by the real server: LFM2 (short conv), Qwen3-Next (Gated DeltaNet, MoE),
Qwen3.5 (Gated DeltaNet, dense) and NemotronH (Mamba2).

A batch of prompts with chunked prefill (an 8-token budget), async scheduling and preemption (24 blocks of 4
tokens hold two of the requests at once) must give transformers' 32 greedy tokens, their logprobs within 1e-3 of
transformers' float32 ones, and a repeated prompt starts from a prefix hit: its KV blocks and the state snapshot at
its last block boundary.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.e2e.server import ServerProcess
from tests.e2e.state_models import check_served_state_model
from tests.hf_reference import hf_greedy, hf_logits, hf_model

NEW_TOKENS = 32
LOGPROB_TOLERANCE = 1e-3


def served_logprobs(server: ServerProcess, model: str, prompts: list[list[int]]) -> list[list[float]]:
    """The logprob of each greedy token, one /v1/completions request for the batch (raw: before EOS masking)."""
    body = {"model": model, "prompt": prompts, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
            "temperature": 0.0, "logprobs": 1}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120).raise_for_status()
    return [choice["logprobs"]["token_logprobs"] for choice in sorted(response.json()["choices"],
                                                                     key=lambda c: c["index"])]


def reference_logprobs(model: torch.nn.Module, prompts: list[list[int]],
                       expected: list[list[int]]) -> list[list[float]]:
    """transformers' float32 logprob of each expected token after its prompt and the tokens before it."""
    result = []
    for prompt, tokens in zip(prompts, expected):
        logits = hf_logits(model, prompt + tokens)[len(prompt) - 1:-1]
        result.append(logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist())
    return result


@pytest.mark.parametrize("architecture", ["Lfm2ForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
                                          "NemotronHForCausalLM"])
def test_a_hybrid_model_is_served_with_chunking_preemption_and_prefix_hits(tmp_path: Path, architecture: str) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "model", architecture)
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (23, 30, 9, 17)]
    prompts.append(prompts[1][:16] + prompts[3][:10])
    reference = hf_model(checkpoint, torch.float32)
    expected = hf_greedy(reference, prompts, NEW_TOKENS)
    server = ServerProcess("--model", str(checkpoint), "--block-size", "4", "--num-kv-blocks", "24",
                           "--max-num-batched-tokens", "8", "--max-num-seqs", "4", "--max-model-len", "64",
                           "--dtype", "float32")
    try:
        info = httpx.get(f"{server.base_url}/server_info", timeout=10).raise_for_status().json()
        # The default keeps a snapshot per --max-num-seqs; the state rows (slots, padding, snapshots) are reported.
        assert info["state_snapshots"] == 4 and info["state_cache_bytes"] > 0, info
        check_served_state_model(server, str(checkpoint), prompts, expected, NEW_TOKENS)
        served = served_logprobs(server, str(checkpoint), prompts)
    finally:
        server.stop()
    wanted = reference_logprobs(reference, prompts, expected)
    error = max(abs(a - b) for got, want in zip(served, wanted) for a, b in zip(got, want, strict=True))
    assert error <= LOGPROB_TOLERANCE, f"served logprobs are {error:.2e} from transformers'"


def test_a_repeated_1000_token_prompt_is_served_from_a_snapshot(tmp_path: Path) -> None:
    """The prompt prefills in one chunk through the chunked delta rule, keeping the state at every 16th block and
    at its last block boundary; the repeat reports those 992 tokens cached and gives transformers' greedy tokens."""
    checkpoint = build_tiny_checkpoint(tmp_path / "model", "Qwen3_5ForCausalLM", max_position_embeddings=1056)
    prompt = torch.randint(10, 500, (1000,), generator=torch.Generator().manual_seed(6)).tolist()
    expected = hf_greedy(hf_model(checkpoint, torch.float32), [prompt], NEW_TOKENS)[0]
    server = ServerProcess("--model", str(checkpoint), "--dtype", "float32")
    body = {"model": str(checkpoint), "prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
            "temperature": 0.0, "return_token_ids": True}
    try:
        answers = [httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120).raise_for_status().json()
                   for _ in range(2)]
    finally:
        server.stop()
    assert [answer["choices"][0]["token_ids"] for answer in answers] == [expected, expected]
    assert [answer["usage"]["prompt_tokens_details"]["cached_tokens"] for answer in answers] == [0, 992]
