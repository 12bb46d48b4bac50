"""Scheduler process: the event loop around `Scheduler`, one step ahead of the worker.

Loop: take new requests, aborts and cache flushes, send plans until `depth` are in flight (2 with async
scheduling: plan n+1 goes out while the worker computes n; 1 in lock-step; P - 1 more with P pipeline stages,
each a micro-batch of other requests, scheduler.py), then block on the
sockets until the next result or request arrives. Blocking in `poll` is what keeps an idle
scheduler at 0% CPU: the poll has a timeout only while steps are in flight (the watchdog, which
logs a worker that stopped answering), and it never spins. A request the scheduler refuses ends
at once with finish_reason "abort" and the reason, for the client.
"""

from __future__ import annotations

import logging
import sys
import time
from multiprocessing.connection import Connection

import msgspec
import zmq

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import (
    AbortRequest,
    FlushCache,
    FlushCacheResult,
    FrontendToScheduler,
    GenerateBatch,
    GenerateRequest,
    KVTransferEvents,
    SchedulerStats,
    Shutdown,
    StepResult,
    TokenBatch,
    TokenUpdate,
    WorkerFailed,
    WorkerReady,
    WorkerToScheduler,
)
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.scheduler_proc.admission import DuplicateRequestId, RequestRejected
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.scheduler_proc.watchdog import StepWatchdog
from rapid_llm.utils.process import configure_child, report_failure, report_ready
from rapid_llm.utils.signal_wakeup import drain as drain_wakeups
from rapid_llm.utils.signal_wakeup import wakeup_fd

logger = logging.getLogger(__name__)
THROUGHPUT_LOG_INTERVAL_S = 5.0


class WorkerFailedError(RuntimeError):
    pass


class SchedulerLoop:
    def __init__(self, config: SchedulerConfig, paths: IpcPaths) -> None:
        context = zmq.Context()
        self.requests: Receiver = Receiver(context, paths.frontend_to_scheduler, FrontendToScheduler)
        self.results: Receiver = Receiver(context, paths.worker_to_scheduler, WorkerToScheduler, to_node0=True)
        self.workers = [Sender(context, address) for address in paths.scheduler_to_workers]
        self.detokenizer = Sender(context, paths.scheduler_to_detokenizer)
        self.frontend = Sender(context, paths.scheduler_to_frontend)
        self.kv_agents = ([] if config.kv_transfer is None else
                          [Sender(context, address) for address in paths.scheduler_to_kv_agents])
        ready = self.results.recv()
        if isinstance(ready, WorkerFailed):
            raise WorkerFailedError(ready.error)
        if not isinstance(ready, WorkerReady):
            raise WorkerFailedError(f"expected WorkerReady from rank 0, got {type(ready).__name__}")
        self.config = msgspec.structs.replace(config, num_kv_blocks=ready.num_kv_blocks, kv_windows=ready.kv_windows,
                                              recurrent_state=ready.num_state_layers > 0,
                                              state_snapshots=ready.num_state_snapshots,
                                              kv_offload_slots=ready.num_offload_slots,
                                              num_worker_ranks=len(self.workers))
        self.scheduler = Scheduler(self.config)
        # Pipeline stages: one more plan in flight per stage after the first, each a micro-batch of other requests.
        self.depth = (2 if config.async_scheduling else 1) + config.pipeline_parallel_size - 1
        self.poller = zmq.Poller()
        self.poller.register(self.requests.socket, zmq.POLLIN)
        self.poller.register(self.results.socket, zmq.POLLIN)
        if wakeup_fd() is not None:
            self.poller.register(wakeup_fd(), zmq.POLLIN)
        self._last_stats: SchedulerStats | None = None
        # Rank 0's collective totals and two-batch-overlap steps, from its latest result.
        self._collectives: tuple[float, int, int] = (0.0, 0, 0)
        self._throughput = _ThroughputLog()
        self._watchdog = StepWatchdog(config.watchdog_timeout)

    def run(self) -> None:
        while True:
            self._drain_requests()
            self._exchange_kv()
            while self.scheduler.num_inflight_steps < self.depth:
                was_idle = self.scheduler.num_inflight_steps == 0
                plan = self.scheduler.schedule()
                if plan is None:
                    break
                if was_idle:
                    self._watchdog.progressed()
                self._throughput.count_scheduled(sum(chunk.num_new_tokens for chunk in plan.scheduled))
                payload = self.workers[0].encode(plan)
                for worker in self.workers:
                    worker.send_bytes(payload)
            self._publish()
            events = dict(self.poller.poll(self._watchdog.poll_timeout_ms(self.scheduler.num_inflight_steps)))
            if wakeup_fd() in events:
                drain_wakeups()
            if self.results.socket in events:
                self._handle_result(self.results.recv())
            elif (oldest := self.scheduler.oldest_inflight_step_id) is not None:
                self._watchdog.check(oldest)

    def _drain_requests(self) -> None:
        while (message := self.requests.recv_nowait()) is not None:
            if isinstance(message, GenerateRequest):
                self._add_request(message)
            elif isinstance(message, GenerateBatch):
                for request in message.requests:
                    self._add_request(request)
            elif isinstance(message, AbortRequest):
                self.scheduler.abort_request(message.request_id)
            elif isinstance(message, FlushCache):
                # A blocking send, unlike stats: the frontend is waiting for this reply.
                self.frontend.send(FlushCacheResult(message.request_id, self.scheduler.reset_prefix_cache()))

    def _add_request(self, request: GenerateRequest) -> None:
        try:
            self.scheduler.add_request(request)
        except RequestRejected as error:
            # The frontend validates first; this guards other clients. Finish it, keep serving.
            logger.warning("rejected request %s: %s", request.request_id, error)
            self.detokenizer.send(TokenBatch(updates=[TokenUpdate(
                request.request_id, [], finish_reason="abort", error=str(error), error_kind=error.kind)]))
        except DuplicateRequestId as error:
            logger.warning("ignored request %s: %s", request.request_id, error)

    def _exchange_kv(self, message: KVTransferEvents | None = None) -> None:
        """Loads and leases to the transfer agent (prefill/decode disaggregation), its events back."""
        for command in self.scheduler.exchange_kv(message.events if message is not None else ()):
            # Every rank loads its share of a prompt's KV; leases exist on single-rank producers only.
            for agent in self.kv_agents:
                agent.send(command)

    def _handle_result(self, message: WorkerFailed | WorkerReady | StepResult | KVTransferEvents) -> None:
        if isinstance(message, WorkerFailed):
            raise WorkerFailedError(f"worker failed: {message.error}")
        if isinstance(message, KVTransferEvents):
            self._exchange_kv(message)
        if isinstance(message, StepResult):
            self._collectives = (message.collective_seconds, message.collective_calls, message.micro_batch_steps)
            self.scheduler.process_result(message)
            self._watchdog.progressed()
            self._throughput.count_generated(len(message.token_ids))

    def _publish(self) -> None:
        # Leases first: a decode instance may ask for one as soon as the output naming it is out.
        self._exchange_kv()
        outputs = self.scheduler.take_outputs()
        if outputs is not None:
            self.detokenizer.send(outputs)
        stats = msgspec.structs.replace(self.scheduler.stats(), collective_seconds=self._collectives[0],
                                        collective_calls=self._collectives[1],
                                        micro_batch_steps=self._collectives[2])
        if stats != self._last_stats:
            # A dropped snapshot stays unpublished, so the next pass through the loop sends it again.
            if self.frontend.send_if_room(stats):
                self._last_stats = stats
            self._throughput.maybe_log(stats)

    def shutdown_workers(self) -> None:
        for worker in self.workers:
            # Never blocking: a PUSH to a worker that has already exited (it got SIGTERM too) would
            # wait for it forever, until the launcher kills this process.
            worker.send_if_room(Shutdown())


class _ThroughputLog:
    """One line every few seconds while busy: tokens/s computed and generated, queue and KV usage."""

    def __init__(self) -> None:
        self.window_start = time.monotonic()
        self.scheduled_tokens = 0
        self.generated_tokens = 0

    def count_scheduled(self, tokens: int) -> None:
        self.scheduled_tokens += tokens

    def count_generated(self, tokens: int) -> None:
        self.generated_tokens += tokens

    def maybe_log(self, stats: SchedulerStats) -> None:
        elapsed = time.monotonic() - self.window_start
        if elapsed < THROUGHPUT_LOG_INTERVAL_S:
            return
        if self.scheduled_tokens:
            logger.info(
                "throughput: %.1f tokens/s computed, %.1f tokens/s generated | running %d, waiting %d | "
                "KV blocks %d/%d (%.1f%%)", self.scheduled_tokens / elapsed, self.generated_tokens / elapsed,
                stats.num_running, stats.num_waiting, stats.kv_blocks_used, stats.kv_blocks_total,
                100.0 * stats.kv_blocks_used / max(stats.kv_blocks_total, 1),
            )
        self.window_start, self.scheduled_tokens, self.generated_tokens = time.monotonic(), 0, 0


def run_scheduler(config: SchedulerConfig, paths: IpcPaths, log_level: str, ready: Connection) -> None:
    configure_child(log_level)
    try:
        loop = SchedulerLoop(config, paths)
        report_ready(ready, {"num_kv_blocks": loop.config.num_kv_blocks})
    except Exception as error:
        report_failure(ready, error)
        sys.exit(1)
    try:
        loop.run()
    except WorkerFailedError as error:
        logger.error("%s; the scheduler stops", error)
        sys.exit(1)
    finally:
        loop.shutdown_workers()
