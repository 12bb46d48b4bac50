"""Step policies (scheduler_proc/step_policy.py): a new request lifecycle without touching the scheduler loops.

The test policy holds a request after its prompt, as a prefill instance would hand a request's KV to a decode
instance in prefill/decode disaggregation, until the test releases it. The real Scheduler runs against the
faithful fake worker of test_scheduler.py: the held request gets its first token, then no step until released,
while the other request runs to its end; every output equals the reference. Results reach the policies too: a
recording policy sees every live token in `take` (none of an aborted request's in-flight step) and, after all
tokens of a step, `end_step` once per request that took one; every output token is one the policy took.
Admission and resources go through the policy too: a staged policy (as a request whose KV arrives from a remote
prefill) is not admitted before it is ready and holds a spare slot from admission to release; the scheduler
honours both (two such requests at most in four slots) and gives the spare back through `release`.
"""

from __future__ import annotations

from collections import deque

import msgspec
import pytest

from rapid_llm.ipc.messages import GenerateRequest, StepPlan, StepResult
from rapid_llm.scheduler_proc.plan_record import PlanDraft
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.scheduler_proc.step_policy import PLAIN, StepAsk, StepPolicy
from tests.unit.test_scheduler import (Event, FakeWorker, _Collector, drive, expected_outcomes, hashed_model,
                                       make_config, request)


class Recording(StepPolicy):
    """Plain decoding that logs what it takes: ("take", request id, token) and ("end_step", request id, None)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int | None]] = []

    def take(self, scheduler: Scheduler, request: RequestState, slot: int, index: int, result: StepResult) -> None:
        self.log.append(("take", request.request_id, result.token_ids[index]))
        super().take(scheduler, request, slot, index, result)

    def end_step(self, scheduler: Scheduler, request: RequestState) -> None:
        self.log.append(("end_step", request.request_id, None))
        super().end_step(scheduler, request)

    def taken(self, request_id: str) -> list[int]:
        return [token for kind, taker, token in self.log if kind == "take" and taker == request_id]


class HoldAfterPrompt(Recording):
    """Plain decoding, except that a request in `held` gets no step once its prompt is computed."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    def ask(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        if request.request_id in self.held and request.num_computed_tokens >= request.num_prompt_tokens:
            return None
        return super().ask(scheduler, request, draft)


class HoldingScheduler(Scheduler):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.hold = HoldAfterPrompt()

    def policy_for(self, request: RequestState) -> StepPolicy:
        return self.hold if request.request_id.startswith("held") else super().policy_for(request)


def events() -> list[GenerateRequest]:
    return [request("held", list(range(1, 19)), max_tokens=6, ignore_eos=True),
            request("other", list(range(30, 41)), max_tokens=12, ignore_eos=True)]


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_a_held_request_waits_after_its_prompt_and_finishes_once_released(depth: int) -> None:
    config = make_config(max_num_batched_tokens=8)
    scheduler, worker, collector = HoldingScheduler(config), FakeWorker(config, hashed_model), _Collector()
    assert scheduler.policy_for(RequestState(events()[1], config.max_model_len, config.block_size)) is PLAIN
    scheduler.hold.held.add("held")
    for event in events():
        scheduler.add_request(event)
        collector.params[event.request_id] = event.params
    sent: deque[StepPlan] = deque()
    released_at = None
    for iteration in range(500):
        while scheduler.num_inflight_steps < depth and (plan := scheduler.schedule()) is not None:
            sent.append(plan)
        collector.add(scheduler.take_outputs())
        if sent:
            scheduler.process_result(worker.execute(sent.popleft()))
        elif not scheduler.has_unfinished_requests():
            break
        outcomes = collector.outcomes
        if released_at is None and outcomes.get("other") and outcomes["other"].finish_reason is not None:
            # Held all along: its prompt's chunk sampled one token, and nothing was scheduled for it since.
            assert len(outcomes["held"].token_ids) == 1 and outcomes["held"].finish_reason is None
            scheduler.hold.held.clear()
            released_at = len(worker.plans)
    collector.add(scheduler.take_outputs())
    assert released_at is not None
    held_slot = next(new.slot for plan in worker.plans for new in plan.new_requests if new.request_id == "held")
    steps_with_held = [i for i, plan in enumerate(worker.plans) if any(c.slot == held_slot for c in plan.scheduled)]
    # Its 18-token prompt takes at most 3 steps of 8 tokens; every later step of it was planned after the release
    # (a plan made at most `depth` steps before the step that follows it).
    assert all(i >= released_at - depth for i in steps_with_held[3:])
    assert collector.outcomes == expected_outcomes({0: events()}, config, hashed_model)
    assert scheduler.hold.taken("held") == collector.outcomes["held"].token_ids


class RecordingScheduler(Scheduler):
    """Every request runs under one `Recording` policy; `steps` holds each result's slice of its log."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.recording = Recording()
        self.steps: list[list[tuple[str, str, int | None]]] = []

    def policy_for(self, request: RequestState) -> StepPolicy:
        return self.recording

    def process_result(self, result: StepResult) -> None:
        start = len(self.recording.log)
        super().process_result(result)
        self.steps.append(self.recording.log[start:])


def test_each_live_token_is_taken_by_the_policy_then_each_taker_ends_the_step() -> None:
    config = make_config(max_num_batched_tokens=6)
    events: dict[int, list[Event]] = {0: [request("a", range(1, 12), max_tokens=9, ignore_eos=True),
                                          request("b", [5, 6], max_tokens=7, ignore_eos=True),
                                          request("c", [7, 8, 9], max_tokens=20, ignore_eos=True)],
                                      4: ["c"]}
    scheduler = RecordingScheduler(config)
    run = drive(config, events, depth=2, scheduler=scheduler)
    shared_steps = 0
    for step in scheduler.steps:
        takers = [taker for kind, taker, _ in step if kind == "take"]
        # All takes first, then one end_step per taker, in the order they took.
        assert step == [entry for entry in step if entry[0] == "take"] + [("end_step", taker, None) for taker in takers]
        assert len(set(takers)) == len(takers)
        shared_steps += len(takers) > 1
    assert shared_steps > 0, "no step sampled for several requests: the order above was not tested"
    # Every output token was taken by the policy; c's token of the step in flight at its abort was not.
    for request_id, outcome in run.outcomes.items():
        assert scheduler.recording.taken(request_id) == outcome.token_ids
    assert run.outcomes["c"].finish_reason == "abort" and len(run.outcomes["c"].token_ids) < run.worker.num_sampled["c"]
    expected = expected_outcomes({0: events[0][:2]}, config)
    assert {request_id: run.outcomes[request_id] for request_id in expected} == expected


class Staged(Recording):
    """Admitted only once `ready` (like KV arriving from a remote prefill), with one spare slot besides its own, held
    until `release`; the worker never hears of it. Logs ("start"/"release", request id, slots)."""

    def __init__(self) -> None:
        super().__init__()
        self.ready: set[str] = set()
        self.spare: dict[RequestState, int] = {}
        self.holds: list[tuple[str, str, list[int]]] = []

    def admit(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        if request.request_id not in self.ready:
            return None
        ask = super().admit(scheduler, request, draft)
        if ask is not None:
            ask.num_slots += 1
        return ask

    def start(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk,
              slots: list[int]) -> None:
        self.spare[request] = slots[-1]
        super().start(scheduler, request, draft, ask, slots[:-1])
        self.holds.append(("start", request.request_id, sorted(slots)))

    def slots_of(self, request: RequestState) -> list[int]:
        return super().slots_of(request) + ([self.spare[request]] if request in self.spare else [])

    def release(self, scheduler: Scheduler, request: RequestState) -> None:
        self.holds.append(("release", request.request_id, sorted(self.slots_of(request))))
        super().release(scheduler, request)
        del self.spare[request]


class StagedScheduler(Scheduler):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.staged = Staged()

    def policy_for(self, request: RequestState) -> StepPolicy:
        return self.staged


class SpareSlotWorker(FakeWorker):
    """The faithful worker, which is told of spare slots' release too: it forgets only slots a request entered."""

    def execute(self, plan: StepPlan) -> StepResult:
        released = [slot for slot in plan.released_slots if slot in self.slots]
        return super().execute(msgspec.structs.replace(plan, released_slots=released))


@pytest.mark.parametrize("num_kv_blocks", [200, 8], ids=["roomy", "preempting"])
def test_admission_and_release_go_through_the_policy(num_kv_blocks: int) -> None:
    config = make_config(max_model_len=32, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=8)
    scheduler, worker, collector = StagedScheduler(config), SpareSlotWorker(config, hashed_model), _Collector()
    staged = scheduler.staged
    events = [request(name, range(start, start + 12), max_tokens=12, ignore_eos=True)
              for name, start in (("a", 1), ("b", 20), ("c", 40))]
    staged.ready.update({"a", "b"})
    for event in events:
        scheduler.add_request(event)
        collector.params[event.request_id] = event.params
    sent: deque[StepPlan] = deque()
    ready_at = None
    for iteration in range(500):
        if iteration == 3:
            staged.ready.add("c")
            ready_at = len(worker.plans) + len(sent)  # the index of the next plan made
        while scheduler.num_inflight_steps < 2 and (plan := scheduler.schedule()) is not None:
            # A spare slot is never handed to anyone while it is held.
            assert not {new.slot for new in plan.new_requests} & set(staged.spare.values())
            sent.append(plan)
        collector.add(scheduler.take_outputs())
        if sent:
            scheduler.process_result(worker.execute(sent.popleft()))
            # Two slots each out of four: never more than two requests in the worker.
            assert len(worker.slots) <= 2
        elif not scheduler.has_unfinished_requests() and iteration > 3:
            break
    collector.add(scheduler.take_outputs())
    # Not admitted before it was ready, although slots were free.
    first_c = next(i for i, plan in enumerate(worker.plans) if any(new.request_id == "c" for new in plan.new_requests))
    assert ready_at is not None and first_c >= ready_at
    # Every admission's slots, spare included, came back through `release`, once: all four are free again.
    for request_id in "abc":
        held = [(kind, slots) for kind, taker, slots in staged.holds if taker == request_id]
        assert held and [kind for kind, _ in held] == ["start", "release"] * (len(held) // 2)
        assert all(start == end for (_, start), (_, end) in zip(held[::2], held[1::2]))
        assert all(len(slots) == 2 for _, slots in held)
    assert sorted(scheduler._free_slots) == list(range(config.max_num_seqs)) and not staged.spare
    assert (scheduler.stats().num_preemptions > 0) == (num_kv_blocks == 8)
    assert collector.outcomes == expected_outcomes({0: events}, config, hashed_model)
    for event in events:
        assert staged.taken(event.request_id) == collector.outcomes[event.request_id].token_ids
