"""ZeroMQ channels between the processes: one PUSH/PULL pair per direction, msgspec on the wire.

Every launch gets its own directory of `ipc://` socket files, so two servers on one machine
never collide, and removing that directory on shutdown removes every socket file. A launch that
was killed (SIGKILL) cannot remove its own, so each new launch sweeps the directories of launchers
whose pid is no longer alive (the pid is in the directory name). Receivers
block in `recv`/`poll`, so an idle process sleeps in the kernel instead of spinning; in an engine
child that wait also watches the signal wakeup fd (`utils.signal_wakeup`).
Data-parallel replicas share the directory, each with its own prefixed set of sockets. A channel that
crosses hosts (multi-node: the step plans of a remote rank; a remote last pipeline stage's results) is a
`tcp://` address on node 0, which only node 0 knows, so node 0's end binds and the other connects
(`sender_binds`: the sender, unless the channel leads back to node 0).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import zmq
import zmq.asyncio

from rapid_llm.utils.signal_wakeup import drain as drain_wakeups
from rapid_llm.utils.signal_wakeup import wakeup_fd

T = TypeVar("T")
_DIR_PREFIX = "rapid_llm-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        pass
    return True


def remove_stale_socket_dirs() -> None:
    """Remove the socket directories of launchers that died without cleaning up."""
    for directory in glob.glob(os.path.join(tempfile.gettempdir(), f"{_DIR_PREFIX}*-*-*")):
        pid = os.path.basename(directory)[len(_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and os.path.isdir(directory) and not _pid_alive(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class IpcPaths:
    """The socket addresses of one launch (all under one private directory)."""

    directory: str
    frontend_to_scheduler: str
    scheduler_to_detokenizer: str
    detokenizer_to_frontend: str
    scheduler_to_frontend: str
    worker_to_scheduler: str
    scheduler_to_workers: tuple[str, ...]
    scheduler_to_kv_agents: tuple[str, ...]  # each rank's KV transfer agent (prefill/decode disaggregation only)

    @classmethod
    def create(cls, num_ranks: int) -> "IpcPaths":
        return cls.create_replicas(num_ranks, 1)[0]

    @classmethod
    def create_replicas(cls, num_ranks: int, num_replicas: int) -> list["IpcPaths"]:
        """One launch directory holding every replica's sockets (replica 0's names are unprefixed)."""
        remove_stale_socket_dirs()
        directory = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-")
        return [cls._in(directory, num_ranks, f"dp{replica}-" if replica else "") for replica in range(num_replicas)]

    @classmethod
    def _in(cls, directory: str, num_ranks: int, prefix: str) -> "IpcPaths":
        def address(name: str) -> str:
            return f"ipc://{os.path.join(directory, prefix + name)}"

        return cls(
            directory=directory,
            frontend_to_scheduler=address("frontend-scheduler"),
            scheduler_to_detokenizer=address("scheduler-detokenizer"),
            detokenizer_to_frontend=address("detokenizer-frontend"),
            scheduler_to_frontend=address("scheduler-frontend"),
            worker_to_scheduler=address("worker-scheduler"),
            scheduler_to_workers=tuple(address(f"scheduler-worker{rank}") for rank in range(num_ranks)),
            scheduler_to_kv_agents=tuple(address(f"scheduler-kv-agent{rank}") for rank in range(num_ranks)),
        )

    def with_result_channel(self, address: str) -> "IpcPaths":
        """These paths with the results channel replaced (an answering rank on another node)."""
        return dataclasses.replace(self, worker_to_scheduler=address)

    def with_plan_channels(self, channels: dict[int, str]) -> "IpcPaths":
        """These paths with the step-plan channels of the ranks in `channels` replaced (remote ranks)."""
        plans = tuple(channels.get(rank, address) for rank, address in enumerate(self.scheduler_to_workers))
        return dataclasses.replace(self, scheduler_to_workers=plans)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def sender_binds(address: str, to_node0: bool = False) -> bool:
    """Whether the sending end binds `address`: a tcp:// channel crosses hosts and lives on node 0, where the
    sender is, unless the channel leads to node 0 (`to_node0`)."""
    return address.startswith("tcp://") and not to_node0


class Sender:
    """PUSH end of a channel; the receiving process binds (tcp: node 0's end), so start order does not matter."""

    def __init__(self, context: zmq.Context, address: str, to_node0: bool = False) -> None:
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        if sender_binds(address, to_node0):
            self.socket.bind(address)
        else:
            self.socket.connect(address)
        self._encoder = msgspec.msgpack.Encoder()

    def send(self, message: Any) -> None:
        self.socket.send(self._encoder.encode(message), copy=False)

    def send_if_room(self, message: Any) -> bool:
        """Send unless the peer's queue is full (or nobody listens); for snapshots that may be dropped.
        True when it was sent."""
        try:
            self.socket.send(self._encoder.encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def send_bytes(self, payload: bytes) -> None:
        self.socket.send(payload, copy=False)

    def encode(self, message: Any) -> bytes:
        return self._encoder.encode(message)


class Receiver(Generic[T]):
    """PULL end of a channel, bound by the process that owns it; decodes one message type (or union)."""

    def __init__(self, context: zmq.Context, address: str, message_type: Any, to_node0: bool = False) -> None:
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        if sender_binds(address, to_node0):
            self.socket.connect(address)
        else:
            self.socket.bind(address)
        self._decoder = msgspec.msgpack.Decoder(message_type)
        self._poller: zmq.Poller | None = None
        if wakeup_fd() is not None:
            self._poller = zmq.Poller()
            self._poller.register(self.socket, zmq.POLLIN)
            self._poller.register(wakeup_fd(), zmq.POLLIN)

    def recv(self) -> T:
        """The next message; in an engine child a signal wakes the wait, so its handler runs at once."""
        if self._poller is not None:
            # A message already queued (the busy case) costs no poll.
            message = self.recv_nowait()
            if message is not None:
                return message
            while self.socket not in dict(self._poller.poll()):
                drain_wakeups()
        return self._decoder.decode(self.socket.recv(copy=False).buffer)

    def recv_nowait(self) -> T | None:
        try:
            frame = self.socket.recv(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        return self._decoder.decode(frame.buffer)


class AsyncReceiver(Generic[T]):
    """PULL end for asyncio code (the frontend)."""

    def __init__(self, context: zmq.asyncio.Context, address: str, message_type: Any) -> None:
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)
        self._decoder = msgspec.msgpack.Decoder(message_type)

    async def recv(self) -> T:
        frame = await self.socket.recv(copy=False)
        return self._decoder.decode(frame.buffer)
