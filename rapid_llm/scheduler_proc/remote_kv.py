"""The scheduler's half of the KV connector: leases on a prefill instance, staged loads on a decode instance.

Producer: a request that asked `do_remote_decode` and ended by length (its prompt computed) leases its prompt's full
blocks (one more reference each, so its own release frees only the rest) under a fresh transfer id; the agent serves
them until the consumer confirms, releases or the lease expires, and the event frees them. Consumer: a request with
`do_remote_prefill` is staged, not queued, so it never holds up first-come-first-served admission; its load takes
the prompt's locally cached blocks (kept) and allocates the rest, and is sent to the agent only once every step
planned before that allocation has reported (such a step may still write a block that was freed just before).
Loaded blocks are registered in the prefix cache under the prompt's chained hashes and stay pinned until each of
the load's requests (n choices share one load) is admitted, which then finds them as an ordinary prefix hit. Key
design choice: a load that fails, times out or finds another prompt's hash only frees its blocks: its requests
prefill locally, so a transfer fault costs time, never a request. A tensor-parallel consumer's ranks each load
their share of the heads; the load ends when every rank has reported. Usage: the scheduler calls `lease` when a
producer's request ends, `stage`, `advance` and `on_events` for loads, `admitted` / `drop` from the step policy.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.ipc.messages import KVLease, KVLoad, KVTransferEnded
from rapid_llm.sampling.kv_transfer_params import KVTransferParams
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.prefix_cache import PrefixCache
from rapid_llm.scheduler_proc.request_state import FREED_BLOCK, RequestState

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Load:
    params: KVTransferParams
    requests: list[RequestState]
    held: list[int] = field(default_factory=list)  # local hits, then the blocks being written; one reference each
    num_local: int = 0  # leading blocks of `held` found cached here (not loaded)
    ready_after_step: int | None = None  # set once blocks are held: steps before it must report first
    sent: bool = False
    reports: list[KVTransferEnded] = field(default_factory=list)  # one per worker rank once sent
    staged_at: float = field(default_factory=time.monotonic)


class RemoteKV:
    def __init__(self, config: KVTransferConfig, blocks: BlockManager, prefix_cache: PrefixCache,
                 block_size: int, num_ranks: int = 1, reserve_blocks: int = 0) -> None:
        self.config = config
        self.engine_id = config.engine_id or uuid.uuid4().hex[:12]
        self._blocks = blocks
        self._prefix_cache = prefix_cache
        self._block_size = block_size
        self._num_ranks = num_ranks
        # Free blocks loads never take: with every other block pinned or loading, the request at the head of the
        # queue can still start (one step's chunk), so what holds blocks always moves on.
        self._reserve = reserve_blocks
        self._leases: dict[str, list[int]] = {}
        self._loads: dict[str, _Load] = {}  # staged or being read, by transfer id
        # Loaded, until each of its requests is admitted or ends (a retry under the same id may load again).
        self._pinned: dict[str, list[_Load]] = {}
        self.commands: list[KVLease | KVLoad] = []  # for the agent, taken by the process loop
        # Since start: loads that ended in blocks, loads that failed, their bytes and seconds, leases expired.
        self.num_loads = self.num_failures = self.num_bytes = self.num_expired = 0
        self.seconds = 0.0

    @property
    def num_loading_requests(self) -> int:
        return sum(len(load.requests) for load in self._loads.values())

    def busy(self) -> bool:
        """Whether blocks are leased, loading or pinned."""
        return bool(self._leases or self._loads or self._pinned)

    # ---- producer ------------------------------------------------------------------------------

    def lease(self, request: RequestState) -> KVTransferParams | None:
        """Keep the finished request's computed full prompt blocks for a consumer; what its response tells it
        (None: nothing to lease, the consumer prefills locally)."""
        num_blocks = min(request.num_prompt_tokens - 1, request.num_computed_tokens) // self._block_size
        block_ids = request.block_ids[:num_blocks]
        if num_blocks == 0 or FREED_BLOCK in block_ids:
            return None
        self._blocks.share(block_ids)
        transfer_id = uuid.uuid4().hex
        self._leases[transfer_id] = block_ids
        self.commands.append(KVLease(transfer_id, block_ids, self.config.lease_ttl_s))
        return KVTransferParams(do_remote_prefill=True, remote_engine_id=self.engine_id, remote_host=self.config.kv_ip,
                                remote_port=self.config.kv_port, remote_block_ids=block_ids, transfer_id=transfer_id,
                                last_block_hash=request.block_hashes(num_blocks)[num_blocks - 1].hex())

    # ---- consumer ------------------------------------------------------------------------------

    def stage(self, request: RequestState, params: KVTransferParams) -> bool:
        """Hold a request until its prompt's KV is loaded (or the load fails); choices of one prompt share a load.
        False: it cannot start from that KV (another prompt's, or it asks prompt logprobs): it prefills locally."""
        transfer_id = params.transfer_id
        if not self._matches(request, params):
            logger.warning("KV transfer %s: the prefill instance's blocks do not serve request %s (another prompt, "
                           "or prompt logprobs); it prefills locally", transfer_id, request.request_id)
            if transfer_id not in self._loads and transfer_id not in self._pinned:
                self.commands.append(KVLoad(transfer_id, params.address, [], 0, self.config.load_timeout_s))
            return False
        load = self._loads.get(transfer_id)
        if load is None:
            self._loads[transfer_id] = _Load(params, [request])
        else:
            load.requests.append(request)
        return True

    def _matches(self, request: RequestState, params: KVTransferParams) -> bool:
        """Whether the leased blocks are this request's prompt (its chained hash of the last one) and it would
        start from cached blocks at all; every request of a load passes this, so its blocks are registered under
        the hashes that were checked."""
        num_remote = len(params.remote_block_ids)
        return (self._prefix_cache.serves(request) and 0 < num_remote <= (request.num_tokens - 1) // self._block_size
                and request.block_hashes(num_remote)[num_remote - 1].hex() == params.last_block_hash)

    def advance(self, next_step_id: int, oldest_inflight_step: int | None) -> list[RequestState]:
        """Give staged loads their blocks and send those whose blocks no earlier step can write any more; the
        requests that need no load (all cached here) or gave up waiting for blocks are returned, to be queued."""
        ready: list[RequestState] = []
        for transfer_id, load in list(self._loads.items()):
            if load.ready_after_step is None and not self._hold_blocks(transfer_id, load, next_step_id):
                if transfer_id not in self._loads:
                    ready += load.requests
                continue
            if not load.sent and (oldest_inflight_step is None or oldest_inflight_step >= load.ready_after_step):
                params = load.params
                self.commands.append(KVLoad(transfer_id, params.address, load.held[load.num_local:], load.num_local,
                                            self.config.load_timeout_s))
                load.sent = True
        return ready

    def _hold_blocks(self, transfer_id: str, load: _Load, next_step_id: int) -> bool:
        """Take the local hits and allocate the rest; False when the load is not needed (all cached here), gave up
        waiting for free blocks (both: dropped, lease released) or must wait for them (kept)."""
        lead, params = load.requests[0], load.params
        num_remote = len(params.remote_block_ids)
        hits = self._prefix_cache.lookup(lead).block_ids[:num_remote]
        if len(hits) == num_remote:
            self._end_unsent(transfer_id, load)
            return False
        num_new = num_remote - len(hits)
        if not self._blocks.can_allocate(num_new + self._blocks.num_unreferenced(hits) + self._reserve):
            if num_new + self._reserve > self._blocks.num_blocks:
                logger.warning("KV transfer %s: %d blocks to load and %d kept free exceed the cache's %d; "
                               "prefilling locally", transfer_id, num_new, self._reserve, self._blocks.num_blocks)
                self._end_unsent(transfer_id, load)
            elif time.monotonic() - load.staged_at > self.config.load_timeout_s:
                logger.warning("KV transfer %s: no free blocks to load into for %.0f s; prefilling locally",
                               transfer_id, self.config.load_timeout_s)
                self._end_unsent(transfer_id, load)
            return False
        self._blocks.share(hits)
        load.held = hits + self._blocks.allocate(num_new)
        load.num_local = len(hits)
        load.ready_after_step = next_step_id
        return True

    def _end_unsent(self, transfer_id: str, load: _Load) -> None:
        """A load that will not be read: its blocks go back, the producer's lease is released."""
        del self._loads[transfer_id]
        self._blocks.free(reversed(load.held))
        load.held = []
        self.commands.append(KVLoad(transfer_id, load.params.address, [], 0, self.config.load_timeout_s))

    def on_events(self, events: list[KVTransferEnded]) -> tuple[list[RequestState], list[RequestState]]:
        """Leases that ended free their blocks; loads that ended return their requests, to be queued: those whose
        blocks loaded (pinned: they go first), then those that prefill locally."""
        loaded: list[RequestState] = []
        failed: list[RequestState] = []
        for event in events:
            if event.status in ("done", "released", "expired"):
                if event.transfer_id not in self._leases:
                    continue
                if event.status == "expired":
                    self.num_expired += 1
                    logger.warning("KV transfer %s: no decode instance read it in %.0f s; its blocks are freed",
                                   event.transfer_id, self.config.lease_ttl_s)
                self._blocks.free(reversed(self._leases.pop(event.transfer_id)))
                continue
            load = self._loads.get(event.transfer_id)
            if load is None or not load.sent:
                continue
            # Each rank loads its share of the heads: the load has ended once every rank has said how.
            load.reports.append(event)
            if len(load.reports) == self._num_ranks:
                del self._loads[event.transfer_id]
                (failed if self._load_ended(event.transfer_id, load) else loaded).extend(load.requests)
        return loaded, failed

    def _load_ended(self, transfer_id: str, load: _Load) -> bool:
        """Account for the load and register (and pin) or free its blocks; whether it failed."""
        failures = [report.reason for report in load.reports if report.status != "loaded"]
        if failures:
            self.num_failures += 1
            logger.warning("KV transfer %s failed (%s); %d request(s) prefill locally", transfer_id, failures[0],
                           len(load.requests))
        else:
            self.num_loads += 1
            self.num_bytes += sum(report.num_bytes for report in load.reports)
            self.seconds += max(report.seconds for report in load.reports)
        if failures or not load.requests:
            self._blocks.free(reversed(load.held))
        else:
            self._prefix_cache.cache_blocks(load.requests[0], 0, load.held, load.num_local, len(load.held))
            self._pinned.setdefault(transfer_id, []).append(load)
        return bool(failures)

    def admitted(self, request: RequestState) -> None:
        """The request took its blocks as prefix hits: the load's pin on them is no longer needed for it."""
        self.drop(request)

    def drop(self, request: RequestState) -> None:
        """The request no longer waits on its load (admitted, finished or aborted)."""
        transfer_id = request.params.kv_transfer_params.transfer_id
        # A retry of the same transfer id may be staged while an earlier load of it is pinned: find the request's.
        load = next((candidate for candidate in (*self._pinned.get(transfer_id, ()), self._loads.get(transfer_id))
                     if candidate is not None and request in candidate.requests), None)
        if load is None:
            return
        load.requests.remove(request)
        if load.requests:
            return
        pinned = self._pinned.get(transfer_id, [])
        if load in pinned:
            pinned.remove(load)
            if not pinned:
                del self._pinned[transfer_id]
            self._blocks.free(reversed(load.held))
        elif not load.sent:
            self._end_unsent(transfer_id, load)
        # A load being read keeps its blocks until its event: the agent may be writing them.
