"""Every message that crosses a process boundary, as msgspec Structs (no pickle anywhere).

Flow: frontend -> scheduler (GenerateRequest, GenerateBatch, AbortRequest, FlushCache); scheduler -> worker ranks
(StepPlan, Shutdown); worker rank 0 -> scheduler (WorkerReady, StepResult); scheduler -> each rank's KV transfer
agent (KVLease, KVLoad) and back (KVTransferEvents, on the workers' channel); scheduler -> detokenizer
(TokenBatch); detokenizer -> frontend (TextBatch); scheduler -> frontend (SchedulerStats,
FlushCacheResult).
Scheduler -> worker traffic carries per-step deltas (new requests, tokens to compute, new blocks,
released slots), never whole request states. Each channel decodes one tagged union type.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.kv_transfer_params import KVTransferParams

# Why the engine ended a request with finish_reason "abort" and an error: refused at admission for
# its parameters, refused because the waiting queue is full, or failed inside the worker.
ErrorKind = Literal["invalid_request", "queue_full", "internal"]


class _Part(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Base of nested parts: compact positional encoding, no type tag."""


class _Message(_Part, tag=True):
    """Base of top-level messages: the type tag lets one channel carry a union of them."""


# ---- frontend -> scheduler -------------------------------------------------------------------


class GenerateRequest(_Message):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class GenerateBatch(_Message):
    """Requests that arrive together (the offline `LLM`'s prompts): admitted in one drain of the scheduler's
    queue, so their first step holds all that fit, whatever the timing of the sends."""

    requests: list[GenerateRequest]


class AbortRequest(_Message):
    request_id: str


class FlushCache(_Message):
    """Empty the prefix cache; answered by a FlushCacheResult with the same id."""

    request_id: int


# ---- scheduler -> worker ---------------------------------------------------------------------


class NewRequest(_Part):
    """A request (re)entering the worker: every token it knows so far and a token-pool slot.

    A request resumed after preemption comes back as a NewRequest with its outputs included.
    """

    request_id: str
    slot: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams


class ScheduledChunk(_Part):
    """Compute tokens [num_computed_tokens, num_computed_tokens + num_new_tokens) of the request in `slot`.

    Both block lists extend the slot's block tables, `cached_block_ids` first; each list holds the same number of
    ids for every KV table (ops/attention/kv_tables.py), table 0's first. `new_block_ids` are
    freshly allocated and must be zeroed before use; `cached_block_ids` are prefix-cache hits (only
    on a request's first chunk after admission) whose KV another request wrote -- or an earlier or
    this same step is writing -- so they must be left as they are. `draft_token_ids` (speculative decoding)
    are tentative tokens after the request's last known one: the chunk computes that token and the drafts
    (num_new_tokens = 1 + len(draft_token_ids)) and samples at each of those positions to verify them.
    """

    slot: int
    num_computed_tokens: int
    num_new_tokens: int
    new_block_ids: list[int] = []
    cached_block_ids: list[int] = []
    draft_token_ids: list[int] = []
    # A worker-side proposer drafts for this request after the step only when set: False while the request does
    # not speculate (adaptive off paused it, or its parameters block drafts), so no draft forward is wasted.
    draft_after: bool = True
    # Models with state layers: the snapshot to load into the slot before the step (its prefix hit's; -1: none), and
    # (position, snapshot) pairs: keep the state after the request's first `position` tokens (inside the chunk).
    state_load: int = -1
    state_saves: list[tuple[int, int]] = []


class BlockCopy(_Part):
    """Copy KV block `src` into block `dst` in every layer (beam search's copy-on-write of a partial block)."""

    src: int
    dst: int


class TierSave(_Part):
    """Save KV block `block` (evicted: this plan hands it out again) into slot `slot` of the offload tier."""

    block: int
    slot: int


class TierLoad(_Part):
    """Load slot `slot` of the offload tier into KV block `block` (a prefix hit found in the tier)."""

    slot: int
    block: int


class LastToken(_Part):
    """The last known token of the request in `slot` is `token_id`, not what the worker sampled (beam search
    picks each beam's next token in the scheduler)."""

    slot: int
    token_id: int


class Rollback(_Part):
    """After a speculative step: the request in `slot` knows `num_tokens` tokens (its rejected drafts are gone)
    and keeps the first `num_blocks` blocks of its table (the scheduler freed the rest)."""

    slot: int
    num_tokens: int
    num_blocks: int


class StepPlan(_Message):
    """Applied in this order: rollbacks, released slots, new requests, last tokens, the offload tier's saves read,
    block copies, block tables (new blocks zeroed), the tier's loads, its saves kept, then the forward."""

    step_id: int
    released_slots: list[int] = []  # finished, aborted or preempted requests
    new_requests: list[NewRequest] = []
    scheduled: list[ScheduledChunk] = []
    last_tokens: list[LastToken] = []
    block_copies: list[BlockCopy] = []
    rollbacks: list[Rollback] = []
    tier_saves: list[TierSave] = []
    tier_loads: list[TierLoad] = []
    tier_prefetch: list[int] = []  # tier slots a waiting request will load


class Shutdown(_Message):
    pass


# ---- scheduler -> KV transfer agents (one per worker rank) and back ------------------------------


class KVLease(_Message):
    """Serve blocks `block_ids` (held by the scheduler until the lease ends) to the reader of `transfer_id` (each
    rank of a tensor-parallel reader reads its share)."""

    transfer_id: str
    block_ids: list[int]
    ttl_s: float


class KVLoad(_Message):
    """Read blocks [first_block, first_block + len(block_ids)) of the producer's lease `transfer_id` at `address`
    into `block_ids` (which no step touches until the scheduler hears back); no blocks: release the lease."""

    transfer_id: str
    address: str
    block_ids: list[int]
    first_block: int
    deadline_s: float


class KVTransferEnded(_Part):
    """A lease ended ("done", "released", "expired") or a load did ("loaded", "failed", with the reason)."""

    transfer_id: str
    status: Literal["done", "released", "expired", "loaded", "failed"]
    reason: str = ""
    num_bytes: int = 0  # a load's bytes read, and its seconds from the request to the last tensor written
    seconds: float = 0.0


class KVTransferEvents(_Message):
    events: list[KVTransferEnded]


# ---- worker -> scheduler ---------------------------------------------------------------------


class WorkerReady(_Message):
    num_kv_blocks: int
    # Per KV table, its layers' attention window (None: the whole context); the scheduler frees blocks behind it.
    kv_windows: tuple[int | None, ...] = (None,)
    # Layers in the worker's state cache group (per-request recurrent state): they cache nothing per block, so a
    # prefix-cache hit (every group's hits intersected) never exists, and beam search cannot fork their state.
    num_state_layers: int = 0
    num_state_snapshots: int = 0  # snapshot rows the scheduler may name in state_load / state_saves
    num_offload_slots: int = 0  # blocks the KV offload tier holds (0: no tier)


class WorkerFailed(_Message):
    error: str


class TokenLogprobs(_Part):
    logprob: float
    top_token_ids: list[int] = []
    top_logprobs: list[float] = []
    rank: int | None = None  # the token's rank in the distribution (1 = the most likely); prompt tokens only


class PromptLogprobs(_Part):
    """Logprobs of prompt tokens [start, start + len(entries)) of a request, from one prefill chunk."""

    request_id: str
    start: int  # >= 1: the first prompt token has nothing before it to predict it
    entries: list[TokenLogprobs]


class PooledPrompt(_Part):
    """A pooling request's prompt as one vector of final hidden states (float32, not normalised)."""

    request_id: str
    values: list[float]


class SlotFailure(_Part):
    """The worker could not serve the request in `slot` (e.g. its state could not be prepared)."""

    slot: int
    request_id: str
    error: str


class StepResult(_Message):
    """Tokens sampled in `step_id`, for the scheduled chunks that reached their request's end.

    `failures` lists the scheduled slots the worker skipped because their request failed; the rest
    of the step ran without them. `prompt_logprobs` has one entry per chunk of a request that asked.
    `num_accepted` (empty when no chunk had drafts) counts, per slot, the drafts the target accepted: the
    slot's new tokens are those drafts followed by its `token_ids` entry (the correction or bonus token).
    `draft_token_ids` (empty unless a worker-side proposer drafts) holds, per slot, the drafts to verify after
    those new tokens.
    """

    step_id: int
    slots: list[int]
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = []
    failures: list[SlotFailure] = []
    prompt_logprobs: list[PromptLogprobs] = []
    num_accepted: list[int] = []
    # Rank 0's time in tensor-parallel collectives since start, and their number (distributed/collective_timer.py).
    collective_seconds: float = 0.0
    collective_calls: int = 0
    micro_batch_steps: int = 0  # rank 0's steps run as two overlapped micro-batches, since start
    draft_token_ids: list[list[int]] = []
    # Wall seconds from the step's launch to its tokens on the host (the scheduler's step cost model learns it).
    step_seconds: float = 0.0
    pooled: list[PooledPrompt] = []  # one per pooling request whose prompt ended this step
    kv_tier_error: str = ""  # the offload tier failed (once): the scheduler stops using it


# ---- scheduler -> detokenizer -> frontend ----------------------------------------------------


class DetokenizeRequest(_Part):
    """Sent once, before a request's first tokens, with what the detokenizer needs to know."""

    request_id: str
    prompt_token_ids: list[int]
    stop: list[str] = []
    skip_special_tokens: bool = True
    min_tokens: int = 0  # stop strings are not matched before this many output tokens
    include_stop_str_in_output: bool = False


class BeamSequence(_Part):
    """One returned beam of a beam-search request: its output tokens, score and end; `text` is filled in by the
    detokenizer."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float  # cumulative_logprob / generated length ** length_penalty: what ranks the beams
    finish_reason: str  # "stop" | "length"
    stop_reason: int | None = None
    text: str = ""


class TokenUpdate(_Part):
    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = []
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # Logprobs of the prompt's tokens from the second on, continuing the previous updates' (with the first tokens).
    prompt_logprobs: list[TokenLogprobs] = []
    # On a request's first update with tokens only: seconds from arrival at the scheduler to its first
    # admission, and from that admission to its first sampled token (scheduler clock).
    queue_time: float | None = None
    prefill_time: float | None = None
    error: str | None = None  # set (with finish_reason "abort") when the engine ended the request
    error_kind: ErrorKind | None = None
    # A finished beam search: its n best beams, best first (token_ids then stays empty).
    beams: list[BeamSequence] = []
    embedding: list[float] = []  # a pooling request's pooled prompt (PooledPrompt.values), sent once
    # On the final update of a request that asked do_remote_decode: where a decode instance reads its prompt's KV.
    kv_transfer_params: KVTransferParams | None = None


class TokenBatch(_Message):
    new_requests: list[DetokenizeRequest] = []
    updates: list[TokenUpdate] = []


class TextDelta(_Part):
    """New text of one request since its previous delta; `finish_reason` set on the last one."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = []
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs] = []  # as TokenUpdate.prompt_logprobs
    queue_time: float | None = None  # as on the TokenUpdate this delta starts with
    prefill_time: float | None = None
    error: str | None = None  # as TokenUpdate.error
    error_kind: ErrorKind | None = None
    beams: list[BeamSequence] = []  # as TokenUpdate.beams, with their text
    embedding: list[float] = []  # as TokenUpdate.embedding
    kv_transfer_params: KVTransferParams | None = None  # as TokenUpdate.kv_transfer_params


class TextBatch(_Message):
    deltas: list[TextDelta]


class SchedulerStats(_Message):
    num_running: int
    num_waiting: int
    kv_blocks_used: int  # referenced by a request; blocks that only cache a prefix count as free
    kv_blocks_total: int
    num_preemptions: int = 0  # since start
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache at admissions, since start
    prefix_cache_hits: int = 0  # of those, tokens found cached on the device
    external_prefix_cache_hits: int = 0  # and tokens loaded from the KV offload tier
    kv_offload_blocks_saved: int = 0  # evicted blocks saved into the offload tier, since start
    kv_offload_blocks_loaded: int = 0  # blocks loaded back from it
    num_steps: int = 0  # steps whose result has arrived, since start: the engine's heartbeat
    # Speculative decoding, since start: verified draft sequences, their tokens, and the tokens accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = []  # [i]: verifications that accepted draft i
    collective_seconds: float = 0.0  # the latest StepResult's totals
    collective_calls: int = 0
    micro_batch_steps: int = 0
    spec_decode_num_disables: int = 0  # requests paused by adaptive off (low acceptance)
    spec_decode_num_gate_closes: int = 0  # times the speed gate turned speculation off for the batch
    # Prefill/decode disaggregation, since start: loads that ended in blocks, loads that fell back to a local
    # prefill, the bytes and seconds of the former; leases that expired unread.
    kv_transfer_loads: int = 0
    kv_transfer_failures: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_expired_leases: int = 0


class FlushCacheResult(_Message):
    request_id: int
    flushed: bool  # False: requests were running, nothing was flushed


FrontendToScheduler = GenerateRequest | GenerateBatch | AbortRequest | FlushCache
SchedulerToFrontend = SchedulerStats | FlushCacheResult
SchedulerToWorker = StepPlan | Shutdown
SchedulerToKVAgent = KVLease | KVLoad
WorkerToScheduler = WorkerReady | WorkerFailed | StepResult | KVTransferEvents
