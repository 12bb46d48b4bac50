"""The worker's half of the KV connector: a thread in each worker rank that serves leased blocks (producer, one rank)
and loads remote ones (consumer: each rank its share of the KV heads) while the main thread runs steps.

The scheduler decides everything: it sends KVLease (blocks it holds until the lease ends) and KVLoad (blocks that no
step touches until the load is reported), and it hears back on the workers' result channel (KVTransferEvents), so
the agent needs no view of requests. Key design choice: the agent thread owns the producer socket and the lease
table (one owner, no locks); each load runs in a small thread pool with a deadline (a dead or slow producer delays
only its own requests, which then prefill locally) and reports on a socket of its own thread. Blocks are read and
written as bytes on the default stream, so on CUDA they queue behind the steps already launched.
Usage: `agent = KVAgent(cache, config, paths, rank, world_size)` (binds the producer's address: a taken port fails
the start), then `agent.start()`.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import zmq

from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.ipc.messages import KVLease, KVLoad, KVTransferEnded, KVTransferEvents, SchedulerToKVAgent
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.worker_proc.kv_cache import KVCache
from rapid_llm.worker_proc.kv_mooncake import MooncakeDataPlane
from rapid_llm.worker_proc.kv_transfer import KVLoadError, KVReceiver, KVSender

logger = logging.getLogger(__name__)
MAX_CONCURRENT_LOADS = 4


class KVAgent:
    def __init__(self, cache: KVCache, config: KVTransferConfig, paths: IpcPaths, rank: int = 0,
                 world_size: int = 1) -> None:
        self._context = zmq.Context()
        self._paths = paths
        self._rank = rank
        self._commands: Receiver = Receiver(self._context, paths.scheduler_to_kv_agents[rank], SchedulerToKVAgent)
        mooncake = MooncakeDataPlane(cache, config.kv_ip) if config.kv_connector == "MooncakeConnector" else None
        try:
            self._sender = (KVSender(cache, f"tcp://*:{config.kv_port}", self._context, mooncake)
                            if config.is_producer else None)
        except zmq.ZMQError as error:
            raise RuntimeError(f"the KV transfer port {config.kv_port} cannot be bound ({error}); pass another "
                               "kv_port in --kv-transfer-config") from None
        self._receiver = KVReceiver(cache, self._context, rank, world_size, mooncake)
        self._loads = ThreadPoolExecutor(MAX_CONCURRENT_LOADS, thread_name_prefix="kv-load")
        self._local = threading.local()  # each load thread's own socket to the scheduler

    def start(self) -> None:
        threading.Thread(target=self._run, name="kv-agent", daemon=True).start()

    def _run(self) -> None:
        events = Sender(self._context, self._paths.worker_to_scheduler)
        poller = zmq.Poller()
        poller.register(self._commands.socket, zmq.POLLIN)
        if self._sender is not None:
            poller.register(self._sender.socket, zmq.POLLIN)
        while True:
            wait_s = None if self._sender is None else self._sender.next_deadline_s()
            poller.poll(None if wait_s is None else int(1000 * wait_s) + 1)
            try:
                # Commands first: a lease and a read naming it may arrive in one wake-up.
                while (command := self._commands.recv_nowait()) is not None:
                    self._handle(command)
                if self._sender is not None:
                    ended = self._sender.serve(0)
                    if ended:
                        events.send(KVTransferEvents([KVTransferEnded(transfer_id, status)
                                                      for transfer_id, status in ended]))
            except Exception:  # a malformed read must not stop the agent: its leases would never end
                logger.exception("KV transfer agent: a message could not be handled")

    def _handle(self, command: KVLease | KVLoad) -> None:
        if isinstance(command, KVLease):
            if self._sender is None:
                logger.error("KV lease %s on an instance that is not a producer: ignored", command.transfer_id)
                return
            self._sender.lease(command.transfer_id, command.block_ids, command.ttl_s)
        else:
            self._loads.submit(self._load, command, time.monotonic())

    def _load(self, command: KVLoad, received: float) -> None:
        # The deadline counts from the command's arrival: waiting for a pool thread spends it too.
        deadline_s = command.deadline_s - (time.monotonic() - received)
        if not command.block_ids:
            if self._rank == 0:  # one release per lease, whatever the ranks
                self._receiver.release(command.address, command.transfer_id, max(deadline_s, 1.0))
            return
        started = time.monotonic()
        try:
            if deadline_s <= 0:
                raise KVLoadError(f"KV transfer {command.transfer_id!r}: its deadline passed while it waited for one "
                                  f"of the {MAX_CONCURRENT_LOADS} load threads")
            num_bytes = self._receiver.load(command.address, command.transfer_id, command.block_ids, deadline_s,
                                            first_block=command.first_block)
            ended = KVTransferEnded(command.transfer_id, "loaded", num_bytes=num_bytes,
                                    seconds=time.monotonic() - started)
        except KVLoadError as error:
            ended = KVTransferEnded(command.transfer_id, "failed", str(error))
        except Exception as error:  # anything else still ends the load, so the scheduler never waits on it
            logger.exception("KV load %s failed", command.transfer_id)
            ended = KVTransferEnded(command.transfer_id, "failed", f"{type(error).__name__}: {error}")
        sender = getattr(self._local, "events", None)
        if sender is None:
            sender = self._local.events = Sender(self._context, self._paths.worker_to_scheduler)
        sender.send(KVTransferEvents([ended]))
