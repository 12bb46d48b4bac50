"""KV blocks from one instance's paged cache into another's over ZeroMQ: the built-in transfer of prefill/decode
disaggregation (the ZmqConnector; worker_proc/kv_agent.py runs it in the worker).

The producer leases blocks under a transfer id and serves them to one reader, distinct tensor by distinct tensor
(so a reader holds one tensor's blocks at a time), until the reader confirms, releases, or the lease expires. The
consumer reads them (all, or those from `first_block` on: the rest it has cached) into blocks of its own. Key design
choice: the producer's one serving loop owns every lease and checks expiry where it serves reads, so blocks handed
back (and reusable) are never read afterwards; a read that arrives just before its lease (the lease and the answer
naming it take different paths) waits a short grace; a load has one deadline over connecting, every tensor and the
confirmation, and always ends with a result, so nothing waits on a peer that went away. Both sides refuse a cache
of another layout (`KVCache.layout_id`).
Usage (producer): `sender = KVSender(cache, "tcp://127.0.0.1:5600"); sender.lease("t1", block_ids, ttl_s=30)`,
then `sender.serve(timeout_ms)` in its loop returns the leases that ended, (id, "done" | "released" | "expired").
Usage (consumer): `KVReceiver(cache).load("tcp://127.0.0.1:5600", "t1", block_ids, deadline_s=10)` (raises
KVLoadError with the reason when it cannot).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import msgspec
import torch
import zmq

from rapid_llm.worker_proc.kv_cache import KVCache
from rapid_llm.worker_proc.kv_mooncake import MooncakeDataPlane

_READ, _DONE, _RELEASE = b"read", b"done", b"release"
_TENSOR, _END, _GONE, _SEGMENTS = b"tensor", b"end", b"gone", b"segments"
UNKNOWN_LEASE_GRACE_S = 2.0


@dataclass
class _Lease:
    block_ids: list[int]
    expires_at: float
    readers: int = 1  # the ranks of a tensor-parallel consumer, each reading its heads; each confirms once
    confirmations: int = 0


class KVSender:
    """The producer's side: leases and the socket readers reach them on (serve from one thread)."""

    def __init__(self, cache: KVCache, address: str, context: zmq.Context | None = None,
                 mooncake: MooncakeDataPlane | None = None) -> None:
        self.cache = cache
        self._mooncake = mooncake
        self._socket = (context or zmq.Context.instance()).socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(address)
        self._leases: dict[str, _Lease] = {}
        self._early_reads: list[tuple[float, bytes, dict]] = []  # (give up at, reader, request) for unknown leases

    @property
    def socket(self) -> zmq.Socket:
        """What readers reach; poll it beside other sockets, then `serve(0)`."""
        return self._socket

    @property
    def leased(self) -> dict[str, list[int]]:
        return {transfer_id: lease.block_ids for transfer_id, lease in self._leases.items()}

    def lease(self, transfer_id: str, block_ids: Sequence[int], ttl_s: float) -> None:
        if transfer_id in self._leases:
            raise ValueError(f"KV transfer {transfer_id!r} is already leased")
        self._leases[transfer_id] = _Lease(list(block_ids), time.monotonic() + ttl_s)
        early = [read for read in self._early_reads if read[2].get("transfer_id") == transfer_id]
        self._early_reads = [read for read in self._early_reads if read[2].get("transfer_id") != transfer_id]
        for _, reader, request in early:
            self._serve_read(reader, request)

    def serve(self, timeout_ms: int) -> list[tuple[str, str]]:
        """Answer what readers sent within `timeout_ms`; the leases that ended (confirmed, released, expired)."""
        ended: list[tuple[str, str]] = []
        if self._socket.poll(timeout_ms):
            while True:
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                ended += self._handle(frames)
        now = time.monotonic()
        for transfer_id in [tid for tid, lease in self._leases.items() if lease.expires_at <= now]:
            del self._leases[transfer_id]
            ended.append((transfer_id, "expired"))
        late = [read for read in self._early_reads if read[0] <= now]
        self._early_reads = [read for read in self._early_reads if read[0] > now]
        for _, reader, request in late:
            self._reply(reader, _GONE, {"reason": f"no lease {request.get('transfer_id')!r} (never made, ended or "
                                                  "expired)"})
        return ended

    def next_deadline_s(self) -> float | None:
        """Seconds until the next lease expires or an early read gives up (None: nothing pending)."""
        times = [lease.expires_at for lease in self._leases.values()] + [read[0] for read in self._early_reads]
        return None if not times else max(0.0, min(times) - time.monotonic())

    def close(self) -> None:
        self._socket.close()

    def _handle(self, frames: list[bytes]) -> list[tuple[str, str]]:
        if len(frames) != 3:
            return []
        reader, kind, header = frames
        request = msgspec.msgpack.decode(header)
        transfer_id = request.get("transfer_id")
        lease = self._leases.get(transfer_id)
        if kind in (_DONE, _RELEASE):
            if lease is None:
                return []
            lease.confirmations += 1
            if lease.confirmations < lease.readers:
                return []
            del self._leases[transfer_id]
            return [(transfer_id, "done" if kind == _DONE else "released")]
        if kind != _READ:
            return []
        if lease is None:
            self._early_reads.append((time.monotonic() + UNKNOWN_LEASE_GRACE_S, reader, request))
        else:
            self._serve_read(reader, request)
        return []

    def _serve_read(self, reader: bytes, request: dict) -> None:
        transfer_id = request.get("transfer_id")
        lease = self._leases.get(transfer_id)
        first = request.get("first_block", 0)
        tp_rank, tp_size = request.get("tp", (0, 1))
        layout = self.cache.layout_id(tp_size)
        if lease is None or lease.expires_at <= time.monotonic():
            self._reply(reader, _GONE, {"reason": f"no lease {transfer_id!r} (never made, ended or expired)"})
        elif request.get("layout_id") != layout:
            self._reply(reader, _GONE, {"reason": f"the caches differ in layout ({request.get('layout_id')} there, "
                                                  f"{layout} here at {tp_size} rank(s))"})
        elif not isinstance(first, int) or not 0 <= first <= len(lease.block_ids):
            self._reply(reader, _GONE, {"reason": f"first_block {first!r} is outside the lease's "
                                                  f"{len(lease.block_ids)} blocks"})
        elif request.get("transport") == "mooncake":
            self._answer_with_segments(reader, lease, first, tp_size, float(request.get("deadline_s", 0)))
        else:
            lease.readers = tp_size
            for tensor in range(self.cache.num_tensors):
                data = self.cache.read_blocks(tensor, lease.block_ids[first:], tp_rank, tp_size)
                self._socket.send_multipart([reader, _TENSOR, msgspec.msgpack.encode({"tensor": tensor}),
                                             memoryview(data.numpy())], copy=False)
            self._reply(reader, _END, {"tensors": self.cache.num_tensors})

    def _answer_with_segments(self, reader: bytes, lease: _Lease, first: int, tp_size: int, deadline_s: float) -> None:
        """A Mooncake reader pulls the blocks itself: where they lie in this cache, and the engine's session."""
        if self._mooncake is None:
            self._reply(reader, _GONE, {"reason": "this producer moves KV over ZeroMQ; start both instances with the "
                                                  "same kv_connector"})
        elif tp_size > 1:
            self._reply(reader, _GONE, {"reason": "Mooncake moves whole caches: a tensor-parallel reader needs "
                                                  "the ZmqConnector"})
        else:
            # The reader pulls after this answer: the blocks stay leased at least until its deadline.
            lease.expires_at = max(lease.expires_at, time.monotonic() + deadline_s + 1.0)
            self._reply(reader, _SEGMENTS, {"session": self._mooncake.session,
                                            "segments": self._mooncake.segments(lease.block_ids[first:])})

    def _reply(self, reader: bytes, kind: bytes, body: dict) -> None:
        self._socket.send_multipart([reader, kind, msgspec.msgpack.encode(body)])


class KVLoadError(RuntimeError):
    """A load that did not complete: the reason, for the log and the fallback to local prefill."""


class KVReceiver:
    """The consumer's side: loads into its own cache's blocks; as rank `tp_rank` of a tensor-parallel consumer of
    `tp_size` ranks, the producer sends it only its share of the KV heads."""

    def __init__(self, cache: KVCache, context: zmq.Context | None = None, tp_rank: int = 0, tp_size: int = 1,
                 mooncake: MooncakeDataPlane | None = None) -> None:
        self.cache = cache
        self._context = context or zmq.Context.instance()
        self._tp = (tp_rank, tp_size)
        self._mooncake = mooncake

    def load(self, address: str, transfer_id: str, block_ids: Sequence[int], deadline_s: float,
             first_block: int = 0) -> int:
        """Read lease `transfer_id`'s blocks from `first_block` on (all the rest) from the producer at `address` into
        `block_ids`, then confirm; the bytes read. Raises KVLoadError when it cannot by the deadline (the blocks'
        content is then undefined)."""
        deadline = time.monotonic() + deadline_s
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(address)
            socket.send_multipart([_READ, msgspec.msgpack.encode({"transfer_id": transfer_id,
                                                                  "layout_id": self.cache.layout_id(),
                                                                  "first_block": first_block, "tp": self._tp,
                                                                  "deadline_s": deadline_s,
                                                                  **({"transport": "mooncake"} if self._mooncake
                                                                     else {})})])
            try:
                num_bytes = self._receive(socket, transfer_id, block_ids, deadline)
            except KVLoadError:
                self._confirm(socket, _RELEASE, transfer_id, deadline)
                raise
            if self.cache.device.type == "cuda":
                # The copies run asynchronously; a step may read the blocks as soon as the load is reported.
                torch.cuda.synchronize(self.cache.device)
            self._confirm(socket, _DONE, transfer_id, deadline)
            return num_bytes
        finally:
            socket.close()

    def release(self, address: str, transfer_id: str, deadline_s: float) -> None:
        """Tell the producer its lease will not be read (its blocks go back at once instead of at expiry)."""
        socket = self._context.socket(zmq.DEALER)
        try:
            socket.connect(address)
            self._confirm(socket, _RELEASE, transfer_id, time.monotonic() + deadline_s)
        finally:
            socket.close()

    @staticmethod
    def _confirm(socket: zmq.Socket, kind: bytes, transfer_id: str, deadline: float) -> None:
        """Best effort: a lost confirmation only keeps the producer's blocks until its lease expires."""
        socket.setsockopt(zmq.LINGER, max(0, int(1000 * (deadline - time.monotonic()))))
        try:
            socket.send_multipart([kind, msgspec.msgpack.encode({"transfer_id": transfer_id})], zmq.NOBLOCK)
        except zmq.Again:
            pass  # never connected: nothing to confirm to

    def _receive(self, socket: zmq.Socket, transfer_id: str, block_ids: Sequence[int], deadline: float) -> int:
        written: set[int] = set()
        num_bytes = 0
        while True:
            left_ms = int(1000 * (deadline - time.monotonic()))
            if left_ms <= 0 or not socket.poll(left_ms):
                raise KVLoadError(f"KV transfer {transfer_id!r}: no answer before the deadline "
                                  f"({len(written)} of {self.cache.num_tensors} tensors read)")
            kind, header, *payload = socket.recv_multipart(copy=False)
            body = msgspec.msgpack.decode(header.bytes)
            if kind.bytes == _GONE:
                raise KVLoadError(f"KV transfer {transfer_id!r}: {body['reason']}")
            if kind.bytes == _SEGMENTS and self._mooncake is not None:
                try:
                    num_bytes = self._mooncake.read(body["session"], body["segments"], block_ids)
                except ValueError as error:
                    raise KVLoadError(f"KV transfer {transfer_id!r}: {error}") from error
                if time.monotonic() > deadline:
                    # The producer keeps the blocks until the deadline only: after it they may hold other KV.
                    raise KVLoadError(f"KV transfer {transfer_id!r}: Mooncake's read ended after the deadline")
                return num_bytes
            if kind.bytes == _TENSOR:
                tensor = body["tensor"]
                try:
                    self.cache.write_blocks(tensor, block_ids, torch.frombuffer(bytearray(payload[0].buffer),
                                                                                dtype=torch.uint8))
                except ValueError as error:
                    raise KVLoadError(f"KV transfer {transfer_id!r}: {error}") from error
                written.add(tensor)
                num_bytes += len(payload[0].buffer)
            elif kind.bytes == _END:
                if written != set(range(self.cache.num_tensors)):
                    raise KVLoadError(f"KV transfer {transfer_id!r}: the producer ended after tensors "
                                      f"{sorted(written)} of {self.cache.num_tensors}")
                return num_bytes
