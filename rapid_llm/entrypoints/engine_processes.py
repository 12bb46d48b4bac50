"""Start, supervise and stop the scheduler, worker and detokenizer processes of one engine.

Children are spawned (never forked: torch and ZMQ state must not be inherited), all at once so
their imports overlap. Each target is a "module:function" string imported inside the child, so
this module (and the HTTP process importing it) never loads the worker's model stack. Each reports ready or its exception over a pipe; start-up fails with the
first child's one-line cause. Afterwards a watcher thread notices any child that exits and
calls back, so the server stops rather than answering /health without an engine behind it.
One worker is started per tensor-parallel rank (`config.parallel`); they meet in a torch.distributed group
through a rendezvous file in the launch's private socket directory, which shutdown removes with it. With
`--data-parallel-size D` there are D replicas, each its own scheduler, detokenizer and ranks (children named
dp<i>-scheduler, dp<i>-worker<r>, ...) with its own sockets and rendezvous. Multi-node: node 0 runs the
schedulers and its share of ranks, another node only its ranks; the group meets over TCP at
--dist-init-addr and a node link (`node_link.py`) joins the nodes' fates. Any child, or a lost node, ends all.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from rapid_llm.config.node_layout import plan_channel, result_channel, store_init_method
from rapid_llm.entrypoints.node_link import NodeLink
from rapid_llm.entrypoints.openmp_spin import openmp_spin_environment
from rapid_llm.ipc.sockets import IpcPaths
from rapid_llm.utils.process import run_child

if TYPE_CHECKING:
    from rapid_llm.config import EngineConfig

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0
T = TypeVar("T")


def _read_report(pipe: Connection) -> tuple[str, Any]:
    """The child's ("ready", info) or ("error", text); a child that died silently reads as an error."""
    try:
        return pipe.recv() if pipe.poll() else ("error", None)
    except EOFError:
        return "error", None


def op_backends_line(ops: dict[str, dict[str, str]]) -> str:
    """One log line for a worker's op choices ({op: {"backend", "reason"}}): every rank logs each op with its
    reason at debug level, and /server_info reports them."""
    backends = ", ".join(f"{name}={choice['backend']}" for name, choice in ops.items())
    return f"op backends: {backends} (details: --log-level debug, /server_info)"


class EngineStartupError(RuntimeError):
    """A child failed to start; the message is its one-line cause."""


class EngineProcesses:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parallel = config.parallel
        self.replica_paths = IpcPaths.create_replicas(parallel.world_size, parallel.data_parallel_size)
        self.paths = self.replica_paths[0]
        self.processes: dict[str, BaseProcess] = {}
        self._ready_pipes: dict[str, Connection] = {}
        self._stopping = threading.Event()
        self.info: dict[str, dict[str, Any]] = {}
        self._node_link = NodeLink(parallel) if parallel.nnodes > 1 else None
        context = multiprocessing.get_context("spawn")
        targets: list[tuple[str, str, tuple[Any, ...]]] = []
        for replica in range(parallel.data_parallel_size):
            targets += self._replica_targets(replica)
        for name, target, args in targets:
            receiver, sender = context.Pipe(duplex=False)
            self.processes[name] = context.Process(target=run_child, args=(name, target, *args, sender), name=name,
                                                   daemon=True)
            self._ready_pipes[name] = receiver

    def child_name(self, replica: int, role: str) -> str:
        """The name of replica `replica`'s `role` child ("scheduler", "worker0", ...)."""
        return role if self.config.parallel.data_parallel_size == 1 else f"dp{replica}-{role}"

    def _replica_targets(self, replica: int) -> list[tuple[str, str, tuple[Any, ...]]]:
        parallel = dataclasses.replace(self.config.parallel, data_parallel_rank=replica)
        config = dataclasses.replace(self.config, parallel=parallel)
        paths = self.replica_paths[replica]
        if parallel.nnodes > 1:
            address = parallel.dist_init_addr
            remote = set(range(parallel.world_size)) - set(range(parallel.world_size // parallel.nnodes))
            paths = paths.with_plan_channels({rank: plan_channel(address, rank) for rank in remote})
            if parallel.result_rank in remote:
                paths = paths.with_result_channel(result_channel(address, parallel.world_size))
            self.replica_paths[replica] = paths
            dist_init_method = store_init_method(address)
        else:
            # A fresh file per launch: torch's FileStore must not find one left by an earlier group.
            dist_init_method = "file://" + os.path.join(paths.directory, self.child_name(replica, "dist-init"))
        targets: list[tuple[str, str, tuple[Any, ...]]] = []
        if parallel.node_rank == 0:
            targets += [
                (self.child_name(replica, "scheduler"), "rapid_llm.scheduler_proc.process:run_scheduler",
                 (config.scheduler, paths, config.log_level)),
                (self.child_name(replica, "detokenizer"), "rapid_llm.detokenizer_proc.process:run_detokenizer",
                 (config.tokenizer, paths, config.log_level)),
            ]
        targets += [(self.child_name(replica, f"worker{rank}"), "rapid_llm.worker_proc.process:run_worker",
                     (config, rank, paths, dist_init_method)) for rank in parallel.local_ranks]
        # Attention-FFN disaggregation's FFN ranks follow the world's (single node: refused otherwise).
        targets += [(self.child_name(replica, f"ffn{index}"), "rapid_llm.worker_proc.ffn_worker:run_ffn_worker",
                     (config, parallel.world_size + index, dist_init_method))
                    for index in range(parallel.afd_ffn_ranks)]
        return targets

    def start(self) -> None:
        """Start every child; they load in parallel with whatever the caller does next."""
        self._started_at = time.perf_counter()
        with openmp_spin_environment(self.config.device.type):
            for process in self.processes.values():
                process.start()

    def start_while(self, prepare: Callable[[], T]) -> T:
        """Start the children, run `prepare` (e.g. load the tokenizer) while they load, wait until they
        are ready and return its result; on any failure every child is stopped before it propagates."""
        self.start()
        try:
            result = prepare()
            self.wait_until_ready()
        except BaseException:
            self.shutdown()
            raise
        return result

    def wait_until_ready(self) -> None:
        """Wait until every child reported ready; raise EngineStartupError (children stopped) otherwise."""
        pending = dict(self._ready_pipes)
        try:
            while pending:
                self._wait_for_one(pending)
            if self._node_link is not None:
                self._node_link.establish()
        except BaseException:
            self.shutdown()
            raise
        logger.info("engine processes ready in %.2f s (%s)", time.perf_counter() - self._started_at,
                    ", ".join(self.processes))
        # Every local rank and replica runs the same device kind and dtype: the first worker's choices stand for all.
        ops = next((info["ops"] for info in self.info.values() if "ops" in info), None)
        if ops is not None:
            logger.info("%s", op_backends_line(ops))

    def _wait_for_one(self, pending: dict[str, Connection]) -> None:
        sentinels = {self.processes[name].sentinel: name for name in pending}
        ready = wait([*pending.values(), *sentinels])
        for item in ready:
            name = sentinels.get(item) or next(n for n, pipe in pending.items() if pipe is item)
            pipe = pending.pop(name, None)
            if pipe is None:
                continue
            status, payload = _read_report(pipe)
            if status != "ready":
                cause = payload.splitlines()[0] if payload else f"exited with code {self.processes[name].exitcode}"
                logger.debug("%s start-up failure:\n%s", name, payload)
                raise EngineStartupError(f"{name} failed to start: {cause}")
            self.info[name] = payload

    def watch(self, on_death: Callable[[str, int | None], None]) -> None:
        """Call `on_death(name, exit_code)` from a daemon thread when a child exits unasked."""

        def watcher() -> None:
            by_sentinel: dict[Any, str] = {process.sentinel: name for name, process in self.processes.items()}
            links = self._node_link.peers if self._node_link is not None else {}
            by_sentinel.update({link: name for name, link in links.items()})
            dead = wait(list(by_sentinel))
            if not self._stopping.is_set():
                name = by_sentinel[dead[0]]
                if name in links:
                    on_death(name, 0 if NodeLink.said_goodbye(links[name]) else None)
                    return
                # The sentinel fires as the child exits, a moment before its exit code can be read.
                self.processes[name].join(STOP_TIMEOUT_S)
                on_death(name, self.processes[name].exitcode)

        threading.Thread(target=watcher, name="engine-watcher", daemon=True).start()

    def is_alive(self) -> bool:
        return not self._stopping.is_set() and all(p.is_alive() for p in self.processes.values())

    def replica_info(self, replica: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """What replica `replica`'s scheduler and rank 0 reported when they became ready."""
        return self.info[self.child_name(replica, "scheduler")], self.info[self.child_name(replica, "worker0")]

    def shutdown(self) -> None:
        """Terminate every child, wait for them, and remove the socket files (other nodes are told first)."""
        self._stopping.set()
        if self._node_link is not None:
            self._node_link.close()
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes.values():
            if process.pid is None:
                continue
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("the %s process did not stop within %.0f s of SIGTERM; killing it", process.name,
                               STOP_TIMEOUT_S)
                process.kill()
                process.join()
        self.paths.remove()
