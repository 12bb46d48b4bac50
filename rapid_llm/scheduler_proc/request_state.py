"""What the scheduler knows about one request: its tokens, KV blocks, slot and unsent output.

Tokens that steps still in flight will sample are counted as placeholders, so a request can be
planned again before their ids are known; drafts being verified (speculative decoding) count as
tentative outputs until the result says which were accepted. `epoch` changes on every preemption, so a result planned
before it can be recognised and dropped. Block hashes depend on the tokens only, so they are
computed once and survive preemption. Arrival, first admission and first sampled token are
timestamped here (monotonic clock), for the queue and prefill times of the first update.
"""

from __future__ import annotations

import enum
import time

from rapid_llm.ipc.messages import BeamSequence, ErrorKind, GenerateRequest, TokenLogprobs, TokenUpdate
from rapid_llm.sampling.kv_transfer_params import KVTransferParams
from rapid_llm.scheduler_proc.beam_group import BeamGroup
from rapid_llm.scheduler_proc.step_policy import PLAIN, StepPolicy
from rapid_llm.utils.block_hash import BlockHash, hash_block


# A block table entry whose block went back to the pool: its table's window has passed those positions.
FREED_BLOCK = -1


class RequestStatus(enum.Enum):
    LOADING = enum.auto()  # staged until a prefill instance's KV is loaded (remote_kv.py)
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class RequestState:
    """One request's progress; the scheduler moves it between its queues."""

    def __init__(self, request: GenerateRequest, max_model_len: int, block_size: int, num_tables: int = 1) -> None:
        self.request_id = request.request_id
        self.prompt_token_ids = request.prompt_token_ids
        self.params = request.params
        self.max_model_len = max_model_len
        # No max_tokens: only the model length bounds the output.
        self.max_tokens = max_model_len if request.params.max_tokens is None else request.params.max_tokens
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.num_placeholders = 0
        # Drafts a step in flight verifies (they follow the outputs); whether this request may draft at all.
        self.draft_token_ids: list[int] = []
        self.speculates = False
        self.num_computed_tokens = 0
        self.state_load = -1  # a state snapshot its next chunk starts from (a prefix hit of a model with state)
        # Per KV table (ops/attention/kv_tables.py), a block id per block of positions, FREED_BLOCK once the table's
        # window has passed it; every table holds as many entries. How many leading entries each has freed.
        self.block_tables: list[list[int]] = [[] for _ in range(num_tables)]
        self.num_freed = [0] * num_tables
        self.block_size = block_size
        # How many of block_ids have been offered to the prefix cache (registered or found there).
        self.num_registered_blocks = 0
        # Prompt tokens served from the prefix cache at the first admission (None before it); what
        # the client is told, whatever later resumptions after preemption find.
        self.num_cached_tokens: int | None = None
        # Anything besides the tokens that changes the KV keys the prefix cache too: a LoRA adapter's id.
        self.extra_cache_key: str | None = None if request.params.lora is None else request.params.lora.cache_key
        self._block_hashes: list[BlockHash] = []
        self.slot: int | None = None
        self.epoch = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None
        self.error: str | None = None  # why the engine aborted it, for the client
        self.error_kind: ErrorKind | None = None
        self._unsent_token_ids: list[int] = []
        self._unsent_logprobs: list[TokenLogprobs | None] = []
        # Prompt tokens whose logprobs have arrived (counting the first, which has none), and those unsent.
        self._num_prompt_logprobs = 1
        self._unsent_prompt_logprobs: list[TokenLogprobs] = []
        self.unsent_embedding: list[float] = []  # a pooling request's pooled prompt, until reported
        self.arrived_at = time.monotonic()
        self.first_scheduled_at: float | None = None  # first admission; resumptions keep it
        self.first_token_at: float | None = None
        # A beam search's live beams (the scheduler sets it), and its n best beams once it has finished.
        self.beam: BeamGroup | None = None
        self.policy: StepPolicy = PLAIN  # what it asks of each step; the scheduler sets it on arrival
        self.beam_outputs: list[BeamSequence] = []
        self.kv_transfer_out: KVTransferParams | None = None  # a prefill instance's lease, for the final update

    @property
    def block_ids(self) -> list[int]:
        """KV table 0's blocks: a request's only table unless sliding-window and full layers are mixed."""
        return self.block_tables[0]

    @block_ids.setter
    def block_ids(self, block_ids: list[int]) -> None:
        self.block_tables[0] = block_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Outputs including placeholders still being sampled and drafts being verified."""
        return len(self.output_token_ids) + self.num_placeholders + len(self.draft_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Prompt plus the outputs whose ids have arrived."""
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs, placeholders and drafts included: what the worker will know after in-flight steps
        (at most, with drafts)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def can_sample(self) -> bool:
        """Whether one more sampled token stays within max_tokens and max_model_len."""
        return self.num_output_tokens < self.max_tokens and self.num_tokens < self.max_model_len

    def known_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def block_hashes(self, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of (at least) the first `num_blocks` full blocks of known tokens."""
        if num_blocks * self.block_size > self.num_known_tokens:
            raise ValueError(f"request {self.request_id}: {num_blocks} full blocks need "
                             f"{num_blocks * self.block_size} tokens, {self.num_known_tokens} are known")
        while len(self._block_hashes) < num_blocks:
            start = len(self._block_hashes) * self.block_size
            parent = self._block_hashes[-1] if self._block_hashes else None
            tokens = self.token_slice(start, start + self.block_size)
            self._block_hashes.append(hash_block(parent, tokens, self.extra_cache_key))
        return self._block_hashes

    def token_slice(self, start: int, end: int) -> list[int]:
        """known_token_ids()[start:end] without copying the whole sequence."""
        split = self.num_prompt_tokens
        if end <= split:
            return self.prompt_token_ids[start:end]
        if start >= split:
            return self.output_token_ids[start - split : end - split]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - split]

    def add_sampled_token(self, token_id: int, logprobs: TokenLogprobs | None) -> None:
        """The real id of the oldest placeholder has arrived."""
        self.num_placeholders -= 1
        self.output_token_ids.append(token_id)
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self._unsent_token_ids.append(token_id)
        if self.params.logprobs is not None:
            self._unsent_logprobs.append(logprobs)

    def add_prompt_logprobs(self, start: int, entries: list[TokenLogprobs]) -> None:
        """Logprobs of prompt tokens [start, start + len(entries)); those that arrived before are skipped
        (a request recomputed after preemption computes them again)."""
        if start > self._num_prompt_logprobs:
            return  # not contiguous: from a finished request that had the same id
        fresh = entries[self._num_prompt_logprobs - start :]
        self._unsent_prompt_logprobs.extend(fresh)
        self._num_prompt_logprobs += len(fresh)

    def finish_reason_for_last_token(self, eos_token_ids: tuple[int, ...]) -> tuple[str, int | None] | None:
        """(finish_reason, stop_reason) if the newest real token ends the request, else None."""
        token_id = self.output_token_ids[-1]
        if token_id in self.params.stop_token_ids:
            return "stop", token_id
        if token_id in eos_token_ids and not self.params.ignore_eos:
            return "stop", None
        if len(self.output_token_ids) >= self.max_tokens or self.num_known_tokens >= self.max_model_len:
            return "length", None
        return None

    def held_block_ids(self) -> list[int]:
        """The blocks the request holds in every table (entries behind a window, already freed, left out)."""
        return [block for table, freed in zip(self.block_tables, self.num_freed) for block in table[freed:]]

    def extend_blocks(self, block_ids: list[int]) -> None:
        """Append `block_ids`, the same number for each table, table 0's first (as a chunk carries them)."""
        count = len(block_ids) // len(self.block_tables)
        for index, table in enumerate(self.block_tables):
            table.extend(block_ids[index * count : (index + 1) * count])

    def clear_blocks(self) -> None:
        """Forget every table's blocks (they went back to the pool)."""
        self.block_tables = [[] for _ in self.block_tables]
        self.num_freed = [0] * len(self.block_tables)

    def release_blocks_before(self, table: int, position: int) -> list[int]:
        """Mark the table's blocks wholly before `position` freed and return the ones that were still held."""
        block_ids, freed = self.block_tables[table], self.num_freed[table]
        end = min(max(0, position) // self.block_size, len(block_ids))
        released = block_ids[freed:end]
        block_ids[freed:end] = [FREED_BLOCK] * len(released)
        self.num_freed[table] = max(freed, end)
        return released

    def reset_for_recompute(self) -> None:
        """After preemption (blocks and slot already returned): recompute everything from scratch."""
        self.status = RequestStatus.WAITING
        self.num_placeholders = 0
        self.draft_token_ids = []
        self.num_computed_tokens = 0
        self.state_load = -1
        self.clear_blocks()
        self.num_registered_blocks = 0
        self.slot = None
        self.epoch += 1

    def mark_scheduled(self) -> None:
        """Admitted to run. Only the first admission counts: as in vLLM, waits after a preemption are not queue time."""
        if self.first_scheduled_at is None:
            self.first_scheduled_at = time.monotonic()

    def take_update(self) -> TokenUpdate:
        """Tokens (and finish) not yet reported to the detokenizer; the first with tokens has the timings."""
        queue_time = prefill_time = None
        # Unsent tokens that are all the outputs there are include the first one (outputs survive preemption).
        has_first = bool(self._unsent_token_ids) and len(self._unsent_token_ids) == len(self.output_token_ids)
        if has_first and self.first_scheduled_at is not None and self.first_token_at is not None:
            queue_time = self.first_scheduled_at - self.arrived_at
            prefill_time = self.first_token_at - self.first_scheduled_at
        update = TokenUpdate(
            request_id=self.request_id,
            token_ids=self._unsent_token_ids,
            logprobs=self._unsent_logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens or 0,
            prompt_logprobs=self._unsent_prompt_logprobs,
            queue_time=queue_time,
            prefill_time=prefill_time,
            error=self.error,
            error_kind=self.error_kind,
            beams=self.beam_outputs,
            embedding=self.unsent_embedding,
            kv_transfer_params=self.kv_transfer_out if self.finish_reason is not None else None,
        )
        self._unsent_token_ids = []
        self._unsent_logprobs = []
        self._unsent_prompt_logprobs = []
        self.unsent_embedding = []
        return update
