"""A step's plan while it is being built (`PlanDraft`), and what the scheduler keeps of it until its result
arrives (`StepRecord`).

Key design choice: results are mapped through the record, not through the requests' current slots. A plan may
be made before the previous step's tokens are known (async scheduling), and by the time its result arrives a
request may have finished, been aborted or preempted and its slot reused; the record says which request, in which
preemption epoch, held each sampling slot when the plan was made. Usage: the planner fills a `PlanDraft` (step
policies add their chunks to it) and appends a `StepRecord`; `process_result` pops the oldest record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid_llm.ipc.messages import BlockCopy, LastToken, NewRequest, ScheduledChunk
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.scheduler_proc.state_snapshots import SnapshotSave
from rapid_llm.scheduler_proc.step_cost import PrefillAllowance


@dataclass
class StepRecord:
    step_id: int
    samplers: dict[int, tuple[RequestState, int]]  # slot -> (request, its epoch) when planned
    # Every chunk decodes (1 + its drafts tokens, then samples): the speed gate measures it (False without
    # speculation, where nobody reads it).
    decode_only: bool
    features: tuple[int, int]  # (tokens, attention pairs): what the step cost model learns the time of
    snapshot_saves: list[SnapshotSave] = field(default_factory=list)  # kept once the result arrives


@dataclass
class PlanDraft:
    budget: int
    prefill: PrefillAllowance | None = None  # None: prompt chunks are cut by the token budget alone
    new_requests: list[NewRequest] = field(default_factory=list)
    chunks: list[ScheduledChunk] = field(default_factory=list)
    samplers: dict[int, tuple[RequestState, int]] = field(default_factory=dict)
    proposals: dict[RequestState, list[int]] = field(default_factory=dict)  # the n-gram proposer's drafts
    last_tokens: list[LastToken] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)
    snapshot_saves: list[SnapshotSave] = field(default_factory=list)
