"""The persistent per-slot input batch: every running request's state, kept in preallocated tensors.

Row `slot` holds the request in that slot: its tokens (the device token pool, which the step's sampled
token is written back into on the device), its block table per KV table (a device [tables, slots, max_blocks]
tensor plus the host lists the list-reading attention adapters use; every table of a row holds the same number of
blocks, ops/attention/kv_tables.py), host counts of its known and prompt tokens, and its
sampling row (`SamplingRows`). The scheduler's deltas update rows in place -- a new or resumed request
fills its row once, released slots are reset, new block ids are scattered into the table once per step
-- so a step only gathers rows by slot index. `num_tokens` counts tokens a launched step will sample
before their values reach the host, which is what lets the next step launch before the copy back. Drafts
(speculative decoding) are written after a row's tokens and counted as known until the scheduler's
`Rollback` sets the row's true count and cuts its block table.
Padded rows (CUDA graph buckets) are not rows here: their buffers point at the KV block `padding_block`, so
they read and write only that block, never live KV (cuda_graphs.py).

Usage:
    batch.add(slot, request_id, token_ids, num_prompt_tokens, params)  # raises if the request cannot be served
    batch.append_blocks(slot, block_ids); batch.flush_blocks()          # block_ids: each table's, table by table
    batch.record_sampled(slots, slots_on_device, positions_on_device, token_ids)
    batch.write_drafts(slots, drafts); batch.rollback(slot, num_tokens, num_blocks)  # speculative decoding
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest, min_tokens_banned_ids
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.host_staging import to_device
from rapid_llm.worker_proc.sampling_rows import SamplingRows


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int, padding_block: int,
                 vocab_size: int, eos_token_ids: Sequence[int], device: torch.device, num_tables: int = 1) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.padding_block = padding_block
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = device
        rows = max_num_seqs
        self.max_blocks = -(-max_model_len // block_size)
        # int32 halves the pool; one spare column holds the token sampled at max_model_len - 1.
        self.token_pool = torch.zeros(rows, max_model_len + 1, dtype=torch.int32, device=device)
        self.num_tables = num_tables
        self.block_tables = torch.full((num_tables, rows, self.max_blocks), padding_block, dtype=torch.int64,
                                       device=device)
        self.host_tables: list[list[list[int]]] = [[[] for _ in range(rows)] for _ in range(num_tables)]
        # Table 0: what a worker-side proposer and CUDA graphs read (they run with one table only).
        self.block_table = self.block_tables[0]
        self.host_block_tables = self.host_tables[0]
        self.num_blocks = np.zeros(rows, dtype=np.int64)
        self.num_tokens = np.zeros(rows, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int64)
        self.request_ids: list[str | None] = [None] * rows
        self.prompts: list[Sequence[int]] = [()] * rows
        self.params: list[SamplingParams] = [SamplingParams()] * rows
        self.has_logit_bias = np.zeros(rows, dtype=bool)  # so a step without any skips building a LogitBias
        self.wants_prompt_logprobs = np.zeros(rows, dtype=bool)
        self.sampling = SamplingRows(rows, vocab_size, device)
        self._pending_tables: list[int] = []
        self._pending_rows: list[int] = []
        self._pending_columns: list[int] = []
        self._pending_blocks: list[int] = []

    def check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_num_seqs:
            raise ValueError(f"slot {slot} is outside the input batch (max_num_seqs={self.max_num_seqs})")

    def sampling_row(self, params: SamplingParams, prompt: Sequence[int], outputs: Sequence[int]) -> SamplingBatch:
        """One request's sampling row, built on the CPU: raises for a parameter the sampler cannot take."""
        request = SamplingRequest(params, prompt, outputs, self.eos_token_ids)
        return SamplingBatch.build([request], vocab_size=self.vocab_size, device=torch.device("cpu"))

    def add(self, slot: int, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int,
            params: SamplingParams) -> None:
        """Fill `slot`'s row for a new or resumed request (all its known tokens); no block yet. Raises, leaving
        the row empty, if the request cannot be served."""
        self.check_slot(slot)
        prompt, outputs = token_ids[:num_prompt_tokens], token_ids[num_prompt_tokens:]
        row = self.sampling_row(params, prompt, outputs)
        self.write_tokens(slot, token_ids)
        self._reset_blocks([slot])
        self.num_tokens[slot] = len(token_ids)
        self.num_prompt_tokens[slot] = num_prompt_tokens
        self.request_ids[slot] = request_id
        self.prompts[slot] = prompt
        self.params[slot] = params
        self.has_logit_bias[slot] = bool(params.logit_bias)
        self.wants_prompt_logprobs[slot] = params.prompt_logprobs is not None
        self.sampling.add(slot, row, min_tokens_banned_ids(params, self.eos_token_ids), params)

    def write_tokens(self, slot: int, token_ids: Sequence[int]) -> None:
        """Put tokens into the slot's pool row; the row's request is unknown until `add` (used alone by tests)."""
        self.check_slot(slot)
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"{len(token_ids)} tokens exceed max_model_len {self.max_model_len}")
        self.request_ids[slot] = None
        self.token_pool[slot, : len(token_ids)] = to_device([torch.tensor(token_ids, dtype=torch.int32)], self.device)[0]

    def set_last_tokens(self, slots: Sequence[int], token_ids: Sequence[int]) -> None:
        """Overwrite each slot's last known token (beam search chooses it, not the sampler), in one device op."""
        if not slots:
            return
        positions = [int(self.num_tokens[slot]) - 1 for slot in slots]
        rows, columns, values = to_device(
            [torch.tensor(slots, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
             torch.tensor(token_ids, dtype=torch.int32)], self.device)
        self.token_pool[rows, columns] = values

    def write_drafts(self, slots: Sequence[int], drafts: Sequence[Sequence[int]]) -> None:
        """Append each slot's draft tokens after its known ones (one device op for the step)."""
        rows: list[int] = []
        columns: list[int] = []
        values: list[int] = []
        for slot, tokens in zip(slots, drafts):
            start = int(self.num_tokens[slot])
            if start + len(tokens) > self.max_model_len:
                raise ValueError(f"slot {slot}: {start + len(tokens)} tokens with drafts exceed max_model_len "
                                 f"{self.max_model_len}")
            rows.extend([slot] * len(tokens))
            columns.extend(range(start, start + len(tokens)))
            values.extend(tokens)
            self.num_tokens[slot] = start + len(tokens)
        if values:
            row, column, value = to_device([torch.tensor(rows, dtype=torch.int64),
                                            torch.tensor(columns, dtype=torch.int64),
                                            torch.tensor(values, dtype=torch.int32)], self.device)
            self.token_pool[row, column] = value

    def rollback(self, slot: int, num_tokens: int, num_blocks: int) -> None:
        """After a speculative step: the row knows `num_tokens` tokens and keeps its first `num_blocks` blocks (the
        cut ones point at the padding block again)."""
        self.check_slot(slot)
        held = int(self.num_blocks[slot])
        if not 0 <= num_blocks <= held or not 0 < num_tokens <= self.max_model_len:
            raise ValueError(f"slot {slot}: cannot roll back to {num_tokens} tokens and {num_blocks} of {held} blocks")
        self.num_tokens[slot] = num_tokens
        if num_blocks < held:
            for table in self.host_tables:
                del table[slot][num_blocks:]
            self.num_blocks[slot] = num_blocks
            self.block_tables[:, slot, num_blocks:held] = self.padding_block

    def release(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self.request_ids[slot] = None
            self.num_tokens[slot] = 0
        self._reset_blocks(slots)

    def _reset_blocks(self, slots: Sequence[int]) -> None:
        """Point the rows at the padding block: a stale id must never lead a reused row into live KV."""
        held = [slot for slot in slots if self.num_blocks[slot]]
        for slot in held:
            self.num_blocks[slot] = 0
            for table in self.host_tables:
                table[slot] = []
        if held:
            self.block_tables[:, to_device([torch.tensor(held, dtype=torch.int64)], self.device)[0]] = \
                self.padding_block

    def append_blocks(self, slot: int, block_ids: Sequence[int]) -> None:
        """Extend the slot's block tables by `block_ids`, the same number for each table, table 0's first; the device
        tables get them at the next `flush_blocks`."""
        if not block_ids:
            return
        count, rest = divmod(len(block_ids), self.num_tables)
        if rest:
            raise ValueError(f"slot {slot}: {len(block_ids)} block ids do not split evenly over {self.num_tables} "
                             "KV tables")
        start = int(self.num_blocks[slot])
        if start + count > self.max_blocks:
            raise ValueError(f"slot {slot}: {start + count} blocks exceed the {self.max_blocks} that "
                             f"max_model_len {self.max_model_len} needs")
        # A negative id is a position a windowed table does not hold (behind its window): the padding block.
        block_ids = [self.padding_block if block < 0 else block for block in block_ids]
        for table, host in enumerate(self.host_tables):
            host[slot].extend(block_ids[table * count : (table + 1) * count])
            self._pending_tables.extend([table] * count)
            self._pending_columns.extend(range(start, start + count))
        self._pending_rows.extend([slot] * len(block_ids))
        self._pending_blocks.extend(block_ids)
        self.num_blocks[slot] = start + count

    def flush_blocks(self) -> None:
        """Scatter every block appended since the last flush into the device tables, in one copy and one op."""
        if not self._pending_blocks:
            return
        tables, rows, columns, blocks = to_device(
            [torch.tensor(values, dtype=torch.int64) for values in
             (self._pending_tables, self._pending_rows, self._pending_columns, self._pending_blocks)], self.device)
        self.block_tables[tables, rows, columns] = blocks
        self._pending_tables, self._pending_rows, self._pending_columns, self._pending_blocks = [], [], [], []

    def record_sampled(self, slots: np.ndarray, slots_on_device: torch.Tensor, positions_on_device: torch.Tensor,
                       token_ids: torch.Tensor) -> None:
        """Each sampling row's token: into its pool row at `positions` and its penalty counts, on the device; the
        host counts it now, before its value is known there."""
        self.token_pool[slots_on_device, positions_on_device] = token_ids.to(torch.int32)
        self.sampling.count(slots_on_device, token_ids)
        self.num_tokens[slots] += 1
