"""One request through the real server started with `--tp 2` (gloo on CPU): the greedy completion is
transformers' and /server_info records the tensor-parallel size."""

from __future__ import annotations

import httpx
import openai
import torch
import transformers

from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 32


def test_tp2_server_answers_like_transformers(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    prompt = torch.randint(10, 500, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    server = ServerProcess("--model", str(checkpoint), "--tp", "2", "--num-kv-blocks", "64", "--log-level",
                           "warning")
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
        answer = client.completions.create(model=str(checkpoint), prompt=prompt, max_tokens=NEW_TOKENS,
                                           temperature=0, extra_body={"min_tokens": NEW_TOKENS})
    finally:
        server.stop()
    assert info["tensor_parallel_size"] == 2
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    assert answer.choices[0].text == tokenizer.decode(hf_greedy(hf_model(checkpoint), [prompt], NEW_TOKENS)[0])
