"""The built-in KV transfer (worker_proc/kv_transfer.py) between two caches over ZeroMQ on 127.0.0.1: leased blocks
arrive byte for byte in the reader's blocks (bf16, fp8 and an MLA latent cache) and the lease ends as done; a lease
that is unknown, expired or of another layout is refused with the reason and nothing waits; a producer that never
answers fails the load by its deadline; a lease never read expires; each rank of a tensor-parallel reader gets its
KV heads; with mooncake installed, its data plane (kv_mooncake.py) moves the same bytes."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import zmq

from rapid_llm.worker_proc.kv_cache import KVCache
from rapid_llm.worker_proc.kv_mooncake import mooncake_missing
from rapid_llm.worker_proc.kv_transfer import KVLoadError, KVReceiver, KVSender
from tests.e2e.server import free_port
from tests.unit.random_kv_cache import random_kv_cache

CASES = {"bf16": ("LlamaForCausalLM", "auto"), "fp8": ("LlamaForCausalLM", "fp8"),
         "mla": ("DeepseekV3ForCausalLM", "auto")}


class Serving:
    """A producer serving from a thread until stopped; what ended, in order."""

    def __init__(self, cache: KVCache, mooncake: object = None) -> None:
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.sender = KVSender(cache, self.address, zmq.Context(), mooncake)
        self.ended: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def lease(self, transfer_id: str, block_ids: list[int], ttl_s: float = 30) -> None:
        with self._lock:
            self.sender.lease(transfer_id, block_ids, ttl_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.ended += self.sender.serve(10)

    def wait_ended(self, count: int, timeout_s: float = 10) -> list[tuple[str, str]]:
        deadline = time.monotonic() + timeout_s
        while len(self.ended) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.ended

    def __enter__(self) -> Serving:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sender.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_leased_blocks_arrive_byte_for_byte_and_the_lease_ends_done(tiny_checkpoint, case: str) -> None:
    architecture, cache_dtype = CASES[case]
    checkpoint = tiny_checkpoint(architecture, dtype=torch.bfloat16)
    producer, consumer = random_kv_cache(checkpoint, cache_dtype), random_kv_cache(checkpoint, cache_dtype)
    untouched = [0, 1, 3, 4, 5, 7, 8, 9, 11]
    before = [consumer.read_blocks(t, untouched) for t in range(consumer.num_tensors)]
    with Serving(producer) as serving:
        serving.lease("r1", [3, 5, 7])
        KVReceiver(consumer, zmq.Context()).load(serving.address, "r1", [10, 2, 6], deadline_s=10)
        assert serving.wait_ended(1) == [("r1", "done")] and serving.sender.leased == {}
    for tensor in range(consumer.num_tensors):
        assert torch.equal(consumer.read_blocks(tensor, [10, 2, 6]), producer.read_blocks(tensor, [3, 5, 7]))
        assert torch.equal(consumer.read_blocks(tensor, untouched), before[tensor])


def test_unknown_expired_and_foreign_leases_are_refused_with_the_reason(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16)
    producer, consumer = random_kv_cache(checkpoint, "auto"), random_kv_cache(checkpoint, "auto")
    other_layout = random_kv_cache(checkpoint, "auto", block_size=8)
    with Serving(producer) as serving:
        receiver = KVReceiver(consumer, zmq.Context())
        with pytest.raises(KVLoadError, match="no lease 'nobody'"):
            receiver.load(serving.address, "nobody", [1], deadline_s=10)
        serving.lease("short", [1, 2], ttl_s=0.05)
        assert serving.wait_ended(1) == [("short", "expired")]
        with pytest.raises(KVLoadError, match="no lease 'short'"):
            receiver.load(serving.address, "short", [1, 2], deadline_s=10)
        serving.lease("foreign", [1])
        with pytest.raises(KVLoadError, match="the caches differ in layout"):
            KVReceiver(other_layout, zmq.Context()).load(serving.address, "foreign", [1], deadline_s=10)
        # The refused reader released the lease: its blocks are the producer's again.
        assert serving.wait_ended(2)[1] == ("foreign", "released")
        serving.lease("fewer", [1, 2, 3])
        with pytest.raises(KVLoadError, match="bytes for 2 blocks"):
            receiver.load(serving.address, "fewer", [4, 5], deadline_s=10)
        assert serving.wait_ended(3)[2] == ("fewer", "released")


def test_a_producer_that_never_answers_fails_the_load_by_its_deadline(tiny_checkpoint) -> None:
    consumer = random_kv_cache(tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16), "auto")
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    address = f"tcp://127.0.0.1:{free_port()}"
    silent.bind(address)
    started = time.monotonic()
    try:
        with pytest.raises(KVLoadError, match="no answer before the deadline"):
            KVReceiver(consumer, context).load(address, "r1", [1], deadline_s=0.3)
    finally:
        silent.close(linger=0)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("num_heads", "tp_size"), [(2, 2), (2, 4)], ids=["sliced", "replicated"])
def test_each_rank_of_a_tensor_parallel_reader_gets_its_heads_and_the_lease_ends_with_the_last(
        tiny_checkpoint, num_heads: int, tp_size: int) -> None:
    producer = random_kv_cache(tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16, num_key_value_heads=num_heads), "auto")
    # A rank's cache holds max(1, heads / ranks) heads: what a checkpoint with that many KV heads builds.
    per_rank = max(1, num_heads // tp_size)
    ranks = [random_kv_cache(tiny_checkpoint("LlamaForCausalLM", dtype=torch.bfloat16, num_key_value_heads=per_rank), "auto")
             for _ in range(tp_size)]
    with Serving(producer) as serving:
        serving.lease("tp", [3, 5])
        for rank, cache in enumerate(ranks):
            KVReceiver(cache, zmq.Context(), rank, tp_size).load(serving.address, "tp", [1, 2], deadline_s=10)
            assert serving.ended == [] or rank == tp_size - 1  # still leased until the last rank confirms
        assert serving.wait_ended(1) == [("tp", "done")]
    for rank, cache in enumerate(ranks):
        first = rank // max(1, tp_size // num_heads) * per_rank
        for tensor in range(cache.num_tensors):
            # [2, blocks, block_size, heads, bytes per head row]
            expected = producer.read_blocks(tensor, [3, 5]).narrow(3, first, per_rank)
            assert torch.equal(cache.read_blocks(tensor, [1, 2]), expected)


@pytest.mark.skipif(mooncake_missing() is not None, reason=str(mooncake_missing()))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_mooncake_data_plane_moves_the_same_bytes_and_a_zmq_producer_refuses_it(tiny_checkpoint,
                                                                                     case: str) -> None:
    from rapid_llm.worker_proc.kv_mooncake import MooncakeDataPlane

    architecture, cache_dtype = CASES[case]
    checkpoint = tiny_checkpoint(architecture, dtype=torch.bfloat16)
    producer, consumer = random_kv_cache(checkpoint, cache_dtype), random_kv_cache(checkpoint, cache_dtype)
    with Serving(producer, MooncakeDataPlane(producer, "127.0.0.1")) as serving:
        serving.lease("m1", [3, 5, 7])
        receiver = KVReceiver(consumer, zmq.Context(), mooncake=MooncakeDataPlane(consumer, "127.0.0.1"))
        moved = receiver.load(serving.address, "m1", [10, 2], deadline_s=10, first_block=1)
        assert serving.wait_ended(1) == [("m1", "done")]
    assert moved == sum(size for tensor in range(producer.num_tensors)
                        for _, size in producer.block_segments(tensor, [5, 7]))
    for tensor in range(consumer.num_tensors):
        assert torch.equal(consumer.read_blocks(tensor, [10, 2]), producer.read_blocks(tensor, [5, 7]))
    with Serving(random_kv_cache(checkpoint, cache_dtype)) as plain:
        plain.lease("m2", [1])
        with pytest.raises(KVLoadError, match="start both instances with the same kv_connector"):
            receiver.load(plain.address, "m2", [1], deadline_s=10)
