"""The real server started with `--tp 2` (gloo on CPU): a greedy completion is transformers', /server_info
records the tensor-parallel size, and a rank that dies mid-request (rank 1, which never replies) brings the
server down with exit code 1, no process left and the launch directory (rendezvous file included) removed.
The tests share one server, in file order: the last one kills it."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import torch
import transformers

from tests.e2e.server import ServerProcess, child_pids, socket_dirs, wait_gone
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 32
# Long enough to be in flight when rank 1 is killed half a second in, however fast the tiny model decodes.
LONG_TOKENS = 4000


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=LONG_TOKENS + 64)


@pytest.fixture(scope="module")
def server(checkpoint) -> Iterator[ServerProcess]:
    blocks = (LONG_TOKENS + 64) // 16 + 1
    process = ServerProcess("--model", str(checkpoint), "--tp", "2", "--num-kv-blocks", str(blocks),
                            "--log-level", "warning")
    yield process
    process.stop()


def test_tp2_server_answers_like_transformers(server, checkpoint) -> None:
    prompt = torch.randint(10, 500, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
    answer = client.completions.create(model=str(checkpoint), prompt=prompt, max_tokens=NEW_TOKENS,
                                       temperature=0, extra_body={"min_tokens": NEW_TOKENS})
    assert info["tensor_parallel_size"] == 2
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    assert answer.choices[0].text == tokenizer.decode(hf_greedy(hf_model(checkpoint), [prompt], NEW_TOKENS)[0])


def test_rank1_dying_brings_the_server_down(server) -> None:
    titles = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
              for pid in child_pids(server.process.pid)}
    engine_children = [pid for pid, title in titles.items() if title.startswith("rapid_llm::")]
    assert {"rapid_llm::worker0", "rapid_llm::worker1"} <= set(titles.values())
    rank1 = next(pid for pid, title in titles.items() if title == "rapid_llm::worker1")
    body = {"prompt": "keep going", "max_tokens": LONG_TOKENS, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=body, timeout=60)
        time.sleep(0.5)
        os.kill(rank1, signal.SIGKILL)
        response = pending.result()
    assert response.status_code == 503
    assert server.process.wait(timeout=30) == 1
    server.stop()
    assert "worker1" in server.log() and "died" in server.log()
    assert wait_gone(engine_children) == []
    assert socket_dirs(server.process.pid) == []
