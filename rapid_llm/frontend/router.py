"""Router: which data-parallel replica serves a request, by `--load-balance-method`, and its per-replica counts.

Key design choice: the router runs inside the frontend process and sees only what the frontend sees --
requests routed, tokens streamed back, requests finished -- so it needs no message from the schedulers
and adds no hop. Its load figures are the frontend's own: requests in flight and outstanding tokens
(prompt + max_tokens - generated so far, an upper bound on the work left). Policies:
round_robin; shortest_queue (fewest requests in flight); minimum_tokens (fewest outstanding tokens);
cache_aware (the replica whose approximate prefix index holds the longest prefix of the prompt, unless it
is more than `balance_tokens` outstanding tokens above the least-loaded replica, then minimum_tokens).
Ties go to the replica after the one chosen last, so equal loads still alternate.
Usage: `replica = router.route(request_id, prompt_ids, max_tokens)`, `router.progress(...)`, `router.finish(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rapid_llm.config.parallel_config import LOAD_BALANCE_METHODS
from rapid_llm.frontend.prefix_index import PrefixIndex

DEFAULT_BALANCE_TOKENS = 4096


@dataclass
class ReplicaLoad:
    routed: int = 0  # requests sent to it since start
    in_flight: int = 0
    outstanding_tokens: int = 0
    cache_routed: int = 0  # requests sent to it by a prefix match (cache_aware)


@dataclass
class _Routed:
    replica: int
    outstanding: int


class Router:
    def __init__(self, num_replicas: int, method: str, block_size: int, index_blocks: int,
                 balance_tokens: int = DEFAULT_BALANCE_TOKENS) -> None:
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"--load-balance-method {method!r} must be one of {', '.join(LOAD_BALANCE_METHODS)}")
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {num_replicas}")
        self.method = method
        self.loads = [ReplicaLoad() for _ in range(num_replicas)]
        self.balance_tokens = balance_tokens
        self._next = 0  # where round robin, and every tie, starts
        self._requests: dict[str, _Routed] = {}
        self._indexes = ([PrefixIndex(block_size, index_blocks) for _ in range(num_replicas)]
                         if method == "cache_aware" else [])

    def route(self, request_id: str, prompt_token_ids: list[int], max_tokens: int) -> int:
        """Choose the replica for a new request and count it there."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already routed")
        replica = self._choose(prompt_token_ids)
        outstanding = len(prompt_token_ids) + max_tokens
        load = self.loads[replica]
        load.routed += 1
        load.in_flight += 1
        load.outstanding_tokens += outstanding
        self._requests[request_id] = _Routed(replica, outstanding)
        self._next = (replica + 1) % len(self.loads)
        return replica

    def progress(self, request_id: str, num_new_tokens: int) -> None:
        """`num_new_tokens` more tokens of the request came back."""
        routed = self._requests.get(request_id)
        if routed is None:
            return
        done = min(num_new_tokens, routed.outstanding)
        routed.outstanding -= done
        self.loads[routed.replica].outstanding_tokens -= done

    def finish(self, request_id: str) -> None:
        """The request ended (finished, aborted or failed): it no longer loads its replica."""
        routed = self._requests.pop(request_id, None)
        if routed is None:
            return
        load = self.loads[routed.replica]
        load.in_flight -= 1
        load.outstanding_tokens -= routed.outstanding

    def replica_of(self, request_id: str) -> int | None:
        routed = self._requests.get(request_id)
        return None if routed is None else routed.replica

    def _choose(self, prompt_token_ids: list[int]) -> int:
        if self.method == "round_robin":
            return self._next
        if self.method == "shortest_queue":
            return self._least(lambda replica: self.loads[replica].in_flight)
        least_loaded = self._least(lambda replica: self.loads[replica].outstanding_tokens)
        if self.method == "minimum_tokens":
            return least_loaded
        hashes = self._indexes[0].block_hashes(prompt_token_ids)
        matches = [index.match(hashes) for index in self._indexes]
        best = self._least(lambda replica: (-matches[replica], self.loads[replica].outstanding_tokens))
        floor = self.loads[least_loaded].outstanding_tokens
        if matches[best] == 0 or self.loads[best].outstanding_tokens - floor > self.balance_tokens:
            best = least_loaded
        else:
            self.loads[best].cache_routed += 1
        self._indexes[best].insert(hashes)
        return best

    def _least(self, key: Callable[[int], Any]) -> int:
        """The replica with the smallest `key(replica)`; ties go to the first at or after `_next`."""
        count = len(self.loads)
        return min(((self._next + offset) % count for offset in range(count)), key=key)
