"""SchedulerConfig: the plain numbers the scheduler process runs with (no torch needed to read it)."""

from __future__ import annotations

import msgspec

from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.config.lora_config import LoRAConfig
from rapid_llm.config.speculative_config import SpeculativeConfig

PREFIX_CACHE_POLICIES = ("hash", "radix")
EVICTION_POLICIES = ("lru", "lfu", "cost")
# As SGLang's --watchdog-timeout: long enough for one big prefill step on a CPU.
DEFAULT_WATCHDOG_TIMEOUT_S = 300.0


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Batching limits and KV-cache shape as the scheduler sees them.

    `max_num_batched_tokens` is the one token budget per step; prompts longer than what is left of
    it are chunked. `num_kv_blocks` is filled in once the worker has sized the cache, and `kv_windows` (per KV
    table, its layers' attention window; None: the whole context) from its layers' cache specs: a request holds a
    block id per table for each block of its positions, and a table's blocks behind its window are freed.
    `enable_prefix_caching` reuses the KV of full blocks that match earlier requests' tokens, indexed by
    `prefix_cache_policy` (hash or radix; None: radix where `cache_policy` allows it) and evicted in
    `eviction_policy` order (scheduler_proc/cache_index.py); evicted full blocks go to an offload tier of
    `kv_offload_slots` blocks, if the worker keeps one (scheduler_proc/offload_tier.py).
    `max_waiting_requests` bounds the waiting queue (None: unbounded, as vLLM and SGLang by default);
    a request arriving at a full queue is refused at once. `watchdog_timeout` is how long a step may
    stay unanswered before the engine is reported stuck. `speculative` turns speculative decoding on
    (docs/spec_decode/README.md). `itl_target_ms` (None: off) cuts prompt chunks while requests decode, so
    a step is predicted, from measured step times, to take at most that long (scheduler_proc/step_cost.py).
    `recurrent_state` is filled in from the worker: some layers keep per-request state (a state cache group), so
    beam search is refused, and a prefix hit also needs a snapshot of the state at its end: `state_snapshots`
    (from the worker) is how many it keeps (0: no hits; scheduler_proc/prefix_cache.py), taken every
    `state_snapshot_interval` blocks of a prompt and at its last block boundary. `kv_transfer` (None: colocated)
    makes the instance a prefill and/or decode instance of a disaggregated deployment (docs/disaggregation.md).
    `lora` (None: off) serves LoRA adapters; a step runs at most `lora.max_loras` distinct ones (docs/lora.md).
    """

    max_model_len: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_kv_blocks: int = 0
    kv_windows: tuple[int | None, ...] = (None,)
    recurrent_state: bool = False
    state_snapshots: int = 0
    state_snapshot_interval: int = 16
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int | None = None  # token ids at or above it are rejected (they would crash the worker)
    async_scheduling: bool = True
    enable_prefix_caching: bool = True
    prefix_cache_policy: str | None = None
    eviction_policy: str = "lru"
    kv_offload_slots: int = 0  # blocks the worker's offload tier holds (filled in from the worker; 0: no tier)
    max_waiting_requests: int | None = None
    watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT_S
    speculative: SpeculativeConfig | None = None
    itl_target_ms: float | None = None
    kv_transfer: KVTransferConfig | None = None
    lora: LoRAConfig | None = None  # --enable-lora's settings; None: adapters are refused
    pipeline_parallel_size: int = 1  # > 1: micro-batches of disjoint requests keep every stage busy
    num_worker_ranks: int = 1  # filled in by the scheduler process: each rank's transfer agent reports a load

    def __post_init__(self) -> None:
        # Checked on construction, so no holder of a SchedulerConfig needs to check it again.
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.state_snapshot_interval < 1:
            raise ValueError(f"--state-snapshot-interval must be at least 1 block, got {self.state_snapshot_interval}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ValueError(f"--max-waiting-requests must be at least 1 (or unset), got {self.max_waiting_requests}")
        if self.itl_target_ms is not None and not self.itl_target_ms > 0:
            raise ValueError(f"--itl-target-ms must be positive milliseconds (or unset), got {self.itl_target_ms}")
        if not self.kv_windows:
            raise ValueError("kv_windows needs one entry per KV table, at least one")
        if self.prefix_cache_policy not in (None, *PREFIX_CACHE_POLICIES):
            raise ValueError(f"--prefix-cache-policy must be one of {', '.join(PREFIX_CACHE_POLICIES)}, "
                             f"got {self.prefix_cache_policy!r}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"--eviction-policy must be one of {', '.join(EVICTION_POLICIES)}, "
                             f"got {self.eviction_policy!r}")
        if not self.watchdog_timeout > 0:
            raise ValueError(f"--watchdog-timeout must be positive seconds, got {self.watchdog_timeout}")

    def cache_policy(self) -> str:
        """The prefix cache's index: radix unless asked otherwise, or where the model has sliding-window or state
        layers, whose hits the radix tree does not track (hash; an explicit radix is refused)."""
        radix_blocker = ("its sliding-window layers free blocks behind their window" if any(self.kv_windows)
                         else "its state layers need state snapshots at hits" if self.recurrent_state else None)
        if self.prefix_cache_policy == "radix" and radix_blocker is not None and self.enable_prefix_caching:
            raise ValueError(f"--prefix-cache-policy radix is not available for this model: {radix_blocker}, which "
                             "only the hash index tracks; use --prefix-cache-policy hash")
        return self.prefix_cache_policy or ("hash" if radix_blocker else "radix")
