"""The real server started with `--tp 2 --enable-expert-parallel --enable-eplb --eplb-config ...` (gloo on CPU)
on a tiny DeepSeek-V3 (MLA attention split by heads, routed experts partitioned over the ranks with two
redundant slots, shared experts split by TP): greedy completions are transformers', and the log shows a
rebalanced placement (every 8 steps over a window of 8)."""

from __future__ import annotations

import json

import openai
import pytest
import torch
import transformers

from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 32
EPLB = {"num_redundant_experts": 2, "window_size": 8, "step_interval": 8}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    # One expert group: with the tiny default (2 groups of 2, top-1 group) every token takes both experts of a
    # group, which the initial placement already spreads evenly, so no rebalancing would relieve a rank.
    return tiny_checkpoint("DeepseekV3ForCausalLM", first_k_dense_replace=1, n_shared_experts=1, n_group=1,
                           topk_group=1)


def test_ep_server_answers_like_transformers(checkpoint) -> None:
    server = ServerProcess("--model", str(checkpoint), "--tp", "2", "--enable-expert-parallel", "--enable-eplb",
                           "--eplb-config", json.dumps(EPLB), "--num-kv-blocks", "64")
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        generator = torch.Generator().manual_seed(3)
        prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (9, 17)]
        answers = [client.completions.create(model=str(checkpoint), prompt=prompt, max_tokens=NEW_TOKENS,
                                             temperature=0, extra_body={"min_tokens": NEW_TOKENS})
                   for prompt in prompts]
    finally:
        server.stop()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    expected = hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)
    assert [answer.choices[0].text for answer in answers] == [tokenizer.decode(tokens) for tokens in expected]
    assert "EPLB step" in server.log()
