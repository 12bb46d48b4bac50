"""Transfer faults over a real link: the prefill instance in a network namespace of its own, joined to this one
by a veth pair whose both ends `tc tbf` rate-limits (this kernel has no netem: no delay or loss qdisc, so a link
starved to a few kbit/s, which drops what overflows its queue, stands for a lossy one).

A prefill instance killed with SIGKILL while the decode instance reads its KV, and a transfer slower than the
decode instance's load_timeout_s, both end in a local prefill with the colocated answer; afterwards the decode
instance (and the live prefill instance) report 0 KV blocks in use and 0 running requests. Needs root, `ip`/`tc`,
network namespaces and the tbf qdisc; skipped otherwise. Namespace and links are named after this process and removed after each test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Iterator

import pytest

from tests.e2e.test_disaggregation import assert_idle, colocated_choices, completion, instance

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                reason="needs root and iproute2 (ip, tc) for a network namespace")


class Link:
    """A namespace holding one end of a veth pair (PEER, 10.124.N.1); the other end (10.124.N.2) stays here."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.netns, self.outer, self.inner = f"rl-pd-{tag}", f"rlo{tag}", f"rli{tag}"
        subnet = tag % 250
        self.peer = f"10.124.{subnet}.1"
        commands = [
            ["ip", "netns", "add", self.netns],
            ["ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner],
            ["ip", "link", "set", self.inner, "netns", self.netns],
            ["ip", "-n", self.netns, "addr", "add", f"{self.peer}/24", "dev", self.inner],
            ["ip", "addr", "add", f"10.124.{subnet}.2/24", "dev", self.outer],
            ["ip", "-n", self.netns, "link", "set", "lo", "up"],
            ["ip", "-n", self.netns, "link", "set", self.inner, "up"],
            ["ip", "link", "set", self.outer, "up"],
        ]
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                self.remove()
                pytest.skip(f"no network namespace here: {' '.join(command)}: {done.stderr.strip()}")

    def limit(self, rate: str) -> None:
        """Both ends at `rate` (tc's units, e.g. 400kbit); a small burst, so the rate holds from the first byte."""
        for prefix, device in ((["ip", "netns", "exec", self.netns], self.inner), ([], self.outer)):
            done = subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                                   "burst", "4kb", "latency", "500ms"], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"no tbf qdisc here: {done.stderr.strip()}")

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


@pytest.fixture
def link() -> Iterator[Link]:
    made = Link()
    yield made
    made.remove()


# 32 KiB of fp32 KV per token: a 400-token prompt's 13 MB outgrow the kernel's socket buffers, so a producer killed
# mid-transfer takes unsent KV with it (what the kernel has buffered would still arrive).
WIDE = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=8, num_hidden_layers=8,
            intermediate_size=512, max_position_embeddings=1024)
LONG_PROMPT = [10 + index % 200 for index in range(400)]


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", **WIDE)


def kv_bits_per_prompt(decode) -> float:
    """Bits one LONG_PROMPT's transfer moves, from the decode instance's counters after exactly one load."""
    return 8 * decode.metrics()["rapid_llm:kv_transfer_bytes_total"]


def test_a_prefill_instance_killed_mid_transfer_costs_a_local_prefill(link: Link, llama) -> None:
    prefill = instance(llama, "kv_producer", kv_ip=link.peer, netns=link.netns, host=link.peer, new_session=True)
    decode = instance(llama, "kv_consumer", load_timeout_s=6)
    try:
        (colocated,) = colocated_choices(decode, prompt=LONG_PROMPT)
        params = completion(prefill.base_url, max_tokens=1, kv_transfer_params={"do_remote_decode": True},
                            prompt=LONG_PROMPT)
        assert completion(decode.base_url, kv_transfer_params=params["kv_transfer_params"],
                          prompt=LONG_PROMPT)["choices"][0]["text"] == colocated
        link.limit(f"{int(kv_bits_per_prompt(decode) / 4)}bit")  # a transfer now takes about 4 s
        (colocated,) = colocated_choices(decode, prompt=LONG_PROMPT)
        params = completion(prefill.base_url, max_tokens=1, kv_transfer_params={"do_remote_decode": True},
                            prompt=LONG_PROMPT)
        answer: dict = {}
        reader = threading.Thread(target=lambda: answer.update(completion(
            decode.base_url, kv_transfer_params=params["kv_transfer_params"], prompt=LONG_PROMPT)))
        reader.start()
        deadline = time.monotonic() + 10
        while decode.metrics()["rapid_llm:num_requests_waiting"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the request is loading
        time.sleep(0.3)
        os.killpg(prefill.process.pid, signal.SIGKILL)
        reader.join(60)
        assert answer["choices"][0]["text"] == colocated
        assert decode.metrics()["rapid_llm:kv_transfer_failures_total"] == 1
        assert_idle(decode)
    finally:
        prefill.stop()
        decode.stop()


def test_a_transfer_slower_than_the_load_timeout_falls_back_and_frees_both_sides(link: Link, llama) -> None:
    prefill = instance(llama, "kv_producer", kv_ip=link.peer, netns=link.netns, host=link.peer, lease_ttl_s=8)
    decode = instance(llama, "kv_consumer", load_timeout_s=2)
    try:
        params = completion(prefill.base_url, max_tokens=1, kv_transfer_params={"do_remote_decode": True},
                            prompt=LONG_PROMPT)
        completion(decode.base_url, kv_transfer_params=params["kv_transfer_params"], prompt=LONG_PROMPT)
        link.limit(f"{int(kv_bits_per_prompt(decode) / 30)}bit")  # a transfer would take about 30 s
        (colocated,) = colocated_choices(decode, prompt=LONG_PROMPT)
        params = completion(prefill.base_url, max_tokens=1, kv_transfer_params={"do_remote_decode": True},
                            prompt=LONG_PROMPT)
        started = time.monotonic()
        answer = completion(decode.base_url, kv_transfer_params=params["kv_transfer_params"], prompt=LONG_PROMPT)
        assert answer["choices"][0]["text"] == colocated and time.monotonic() - started < 15
        assert decode.metrics()["rapid_llm:kv_transfer_failures_total"] == 1
        assert_idle(decode)
        # The release may be lost on the starved link: the lease then expires (lease_ttl_s 8).
        prefill_metrics = prefill.wait_until_idle(timeout=20)
        assert prefill_metrics["rapid_llm:kv_cache_blocks_used"] == 0
    finally:
        prefill.stop()
        decode.stop()
