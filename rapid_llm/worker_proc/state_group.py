"""The state cache group: every recurrent layer's per-request state (layers/state_layer.py), a row per input-batch
slot, a padding row, and rows of snapshots that keep a state at a block boundary for prefix-cache hits.

Key design choice: state is not paged, so a prefix hit cannot share it by block as KV is shared. Instead the
scheduler names snapshot rows (its own pool, scheduler_proc/state_snapshots.py): a chunk may keep the state after
any of its tokens in one (the layers write it during the forward, `kept_states`), and a request starting from a
hit loads the snapshot of its last hit block into its slot before the step (`load`). Per slot the host counts the
tokens its state has folded in; a step must continue from there, restart at 0 (the row is zeroed) or load one.
With speculative decoding, layers keep the state after each token of a chunk verifying drafts in scratch rows of
its slot (`kept_states`), and `restore` takes the one after the accepted drafts; the scheduler's rollback `rewind`s
the count. Usage: `group = StateGroup(layers, max_num_seqs, num_snapshots, dtype, device, draft_positions)`;
`group.allocate()`; per step `group.load(...)`, `group.build_metadata(...)`, the forward.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.ops.attention.backend import AttentionMetadata
from rapid_llm.ops.state_metadata import KeptStates, StateMetadata, kept_states
from rapid_llm.utils.host_staging import to_device


class StateGroup:
    def __init__(self, layers: list[StateLayer], max_num_seqs: int, num_snapshots: int, dtype: torch.dtype,
                 device: torch.device, draft_positions: int = 0) -> None:
        self.layers = layers
        self.specs = [layer.state_spec(dtype) for layer in layers]
        self.first_snapshot = max_num_seqs + 1  # slot rows, the padding row, the snapshots, the scratch rows
        self.num_snapshots = num_snapshots
        # Speculative decoding: per slot, the state after each token of a chunk verifying drafts (1 + k tokens).
        self.draft_positions = draft_positions
        self.first_scratch = self.first_snapshot + num_snapshots
        self.num_rows = self.first_scratch + max_num_seqs * draft_positions
        self.device = device
        self.num_tokens = np.zeros(self.first_snapshot, dtype=np.int64)

    @property
    def num_bytes(self) -> int:
        return self.num_rows * sum(spec.bytes_per_slot() for spec in self.specs)

    def allocate(self) -> None:
        for layer, spec in zip(self.layers, self.specs):
            layer.bind(spec.allocate(self.num_rows, self.device))

    def forget(self, slots: Sequence[int]) -> None:
        """Forget what these slots' states folded in (a request left or entered them)."""
        self.num_tokens[list(slots)] = 0

    def load(self, slots: Sequence[int], snapshots: Sequence[int], starts: Sequence[int]) -> None:
        """Start each slot from a snapshot: the state after its first `starts[i]` tokens."""
        if snapshots:
            self._copy(self._snapshot_rows(snapshots), list(slots))
            self.num_tokens[list(slots)] = starts

    def kept_states(self, slots: np.ndarray, starts: np.ndarray, query_lens: np.ndarray, num_drafts: np.ndarray,
                    state_saves: Sequence[Sequence[tuple[int, int]]]) -> KeptStates | None:
        """The tokens whose states (after them) the layers keep this step (None: none): each token of a chunk
        verifying drafts in its slot's scratch row for its position in the chunk, and the token a snapshot ends at
        in the snapshot's row."""
        verifying = np.flatnonzero(num_drafts > 0)
        if verifying.size and int(query_lens[verifying].max()) > self.draft_positions:
            raise ValueError(f"a chunk verifies {int(query_lens[verifying].max()) - 1} drafts, but the state keeps "
                             f"{self.draft_positions} positions per slot (--speculative-config's tokens + 1)")
        kept = [(seq, offset, self.first_scratch + int(slots[seq]) * self.draft_positions + offset)
                for seq in verifying.tolist() for offset in range(int(query_lens[seq]))]
        for seq, saves in enumerate(state_saves):
            for position, snapshot in saves:
                offset = position - 1 - int(starts[seq])
                if not 0 <= offset < query_lens[seq]:
                    raise ValueError(f"slot {slots[seq]}: a state snapshot after token {position} is outside the "
                                     f"chunk's tokens [{starts[seq]}, {starts[seq] + query_lens[seq]})")
                kept.append((seq, offset, self._snapshot_rows([snapshot])[0]))
        return kept_states(query_lens.tolist(), kept, self.device)

    def restore(self, slots: Sequence[int], num_accepted: torch.Tensor) -> None:
        """After a verification: each slot takes the state kept after its last token and `num_accepted` drafts."""
        base, targets = to_device([torch.tensor([self.first_scratch + slot * self.draft_positions for slot in slots]),
                                   torch.tensor(list(slots))], self.device)
        self._copy_rows(base + num_accepted, targets)

    def rewind(self, slot: int, num_tokens: int) -> None:
        """The slot's state now holds `num_tokens` tokens (its verified ones, after `restore`)."""
        self.num_tokens[slot] = num_tokens

    def _snapshot_rows(self, snapshots: Sequence[int]) -> list[int]:
        bad = [snapshot for snapshot in snapshots if not 0 <= snapshot < self.num_snapshots]
        if bad:
            raise ValueError(f"state snapshot {bad[0]} is outside the {self.num_snapshots} this worker keeps")
        return [self.first_snapshot + snapshot for snapshot in snapshots]

    def _copy(self, sources: list[int], targets: list[int]) -> None:
        self._copy_rows(*to_device([torch.tensor(sources), torch.tensor(targets)], self.device))

    def _copy_rows(self, source: torch.Tensor, target: torch.Tensor) -> None:
        for layer in self.layers:
            for tensor in layer.bound():
                tensor.index_copy_(0, target, tensor.index_select(0, source))

    def build_metadata(self, slots: np.ndarray, starts: np.ndarray, query_lens: np.ndarray, num_drafts: np.ndarray,
                       state_saves: Sequence[Sequence[tuple[int, int]]], slots_on_device: torch.Tensor,
                       common: AttentionMetadata) -> StateMetadata:
        """The step's state metadata; zeroes the rows of sequences starting at token 0. A chunk starting elsewhere
        must continue exactly where its slot's state stopped (or a snapshot loaded it): state cannot be rolled
        back, so anything else would be wrong output, and is refused."""
        stale = (starts != 0) & (starts != self.num_tokens[slots])
        if stale.any():
            row = int(np.flatnonzero(stale)[0])
            raise ValueError(f"slot {slots[row]}: the step continues from token {starts[row]}, but its recurrent "
                             f"state holds {self.num_tokens[slots[row]]} tokens (a chunk must start at 0, where the "
                             "state stopped, or where a loaded snapshot left it)")
        fresh = starts == 0
        fresh_slots, has_initial_state = to_device(
            [torch.from_numpy(slots[fresh]), torch.from_numpy((~fresh).astype(np.int64))], self.device)
        if fresh.any():
            for layer in self.layers:
                for tensor in layer.bound():
                    tensor.index_fill_(0, fresh_slots, 0)
        self.num_tokens[slots] = starts + query_lens
        return StateMetadata(slots_on_device, slots_on_device[common.seq_index], common.query_start_loc,
                             has_initial_state.bool(), int(query_lens.max()),
                             self.kept_states(slots, starts, query_lens, num_drafts, state_saves))
