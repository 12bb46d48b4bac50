"""Two launches on one machine as two nodes (`--nnodes 2`, loopback TCP): node 1 runs rank 1 of a `--tp 2` model
headless, node 0 serves HTTP with rank 0. A greedy completion equals transformers' (what one node answers, see
test_tp_server.py) and its collectives are timed; with `--pp 2` each node runs one pipeline stage and node 1's
last stage answers over TCP; stopping node 0 ends node 1 with nothing left behind; killing node 1's launcher ends node 0
with exit code 1 and a line naming it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import torch
import transformers

from tests.distributed.engine_children import assert_all_gone, engine_children
from tests.e2e.server import ServerProcess, child_pids, wait_gone
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 16


def free_port_run(length: int) -> int:
    """A port p with p .. p + length - 1 all free on 127.0.0.1 (the dist-init port and the ones after it)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + length > 65535:
            continue
        try:
            for port in range(base, base + length):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")


class Nodes:
    """Node 1 (a plain subprocess: it serves no HTTP) and node 0 (a ServerProcess) of one engine."""

    def __init__(self, checkpoint: Path, layout: tuple[str, ...] = ("--tp", "2")) -> None:
        # The store, the node link, node 1's plan channel and (a remote last stage) the results channel.
        address = f"127.0.0.1:{free_port_run(5)}"
        common = ["--model", str(checkpoint), *layout, "--nnodes", "2", "--dist-init-addr", address,
                  "--num-kv-blocks", "64", "--log-level", "info"]
        self.node1_log = tempfile.TemporaryFile("w+")
        self.node1 = subprocess.Popen([sys.executable, "-m", "rapid_llm.launch_server", *common, "--node-rank", "1"],
                                      stdout=self.node1_log, stderr=subprocess.STDOUT)
        try:
            self.node0 = ServerProcess(*common, "--node-rank", "0")
        except BaseException:
            self.node1.kill()
            raise

    def node1_output(self) -> str:
        self.node1_log.seek(0)
        return self.node1_log.read()

    def stop(self) -> None:
        self.node0.stop()
        if self.node1.poll() is None:
            self.node1.terminate()
            self.node1.wait(30)


@pytest.fixture
def nodes(tiny_checkpoint) -> Iterator[Nodes]:
    launched = Nodes(tiny_checkpoint("LlamaForCausalLM"))
    yield launched
    launched.stop()


def test_two_nodes_answer_like_one_and_node0_stopping_ends_node1(nodes, tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    prompt = torch.randint(10, 500, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    body = {"model": str(checkpoint), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
            "min_tokens": NEW_TOKENS}
    answer = httpx.post(f"{nodes.node0.base_url}/v1/completions", json=body, timeout=60).json()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    assert answer["choices"][0]["text"] == tokenizer.decode(hf_greedy(hf_model(checkpoint), [prompt], NEW_TOKENS)[0])
    info = httpx.get(f"{nodes.node0.base_url}/server_info", timeout=5).json()
    assert (info["nnodes"], info["tensor_parallel_size"]) == (2, 2)
    # Rank 0's all-reduces crossed the nodes and were timed.
    metrics = nodes.node0.metrics()
    assert metrics["rapid_llm:collective_calls_total"] > 0 and metrics["rapid_llm:collective_seconds_total"] > 0
    assert set(engine_children(nodes.node0).values()) == {"scheduler", "detokenizer", "worker0"}
    node1_children = child_pids(nodes.node1.pid)
    assert nodes.node0.stop() == 0
    assert nodes.node1.wait(timeout=30) == 0
    assert "node 0 shut down" in nodes.node1_output()
    assert wait_gone(node1_children) == []


def test_one_pipeline_stage_per_node_answers_like_transformers(tiny_checkpoint) -> None:
    """`--pp 2 --nnodes 2`: node 1 runs the last stage, whose results reach node 0's scheduler over TCP."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    nodes = Nodes(checkpoint, ("--pp", "2"))
    try:
        prompt = torch.randint(10, 500, (9,), generator=torch.Generator().manual_seed(4)).tolist()
        body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "min_tokens": NEW_TOKENS,
                "return_token_ids": True}
        answer = httpx.post(f"{nodes.node0.base_url}/v1/completions", json=body, timeout=60).json()
        assert answer["choices"][0]["token_ids"] == hf_greedy(hf_model(checkpoint), [prompt], NEW_TOKENS)[0]
        info = httpx.get(f"{nodes.node0.base_url}/server_info", timeout=5).json()
        assert (info["nnodes"], info["pipeline_parallel_size"]) == (2, 2)
        assert "pipeline stage 1 of 2" in nodes.node1_output()
    finally:
        nodes.stop()


@pytest.mark.slow
def test_node1_launcher_killed_ends_node0(nodes) -> None:
    children = engine_children(nodes.node0)
    node1_children = child_pids(nodes.node1.pid)
    os.kill(nodes.node1.pid, signal.SIGKILL)
    nodes.node1.wait(10)
    # Node 1's rank notices its launcher's death (parent-death signal) and exits too.
    assert wait_gone(node1_children, timeout=10) == []
    assert_all_gone(nodes.node0, children, "node1-launcher")


def test_node_link_port_in_use_is_one_line(tiny_checkpoint) -> None:
    base = free_port_run(2)
    with socket.create_server(("127.0.0.1", base + 1)):
        result = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--model",
                                 str(tiny_checkpoint("LlamaForCausalLM")), "--tp", "2", "--nnodes", "2",
                                 "--dist-init-addr", f"127.0.0.1:{base}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"--dist-init-addr: cannot listen on 127.0.0.1:{base + 1} for the node link" in result.stderr
