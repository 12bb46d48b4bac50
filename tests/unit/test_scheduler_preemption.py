"""Preemption when the KV cache is full, driven by test_scheduler.py's fake worker: the newest running request
gives its blocks up, goes back to the front of the queue and resumes with the outputs it had; a request that
preempts itself waits for a later step instead of thrashing."""

from __future__ import annotations

from tests.unit.test_scheduler import Event, counting_model, drive, expected_outcomes, make_config, request


def test_preemption_takes_the_newest_and_resumes_it_first_with_its_outputs() -> None:
    config = make_config(max_model_len=16, num_kv_blocks=4, max_num_seqs=2)
    events: dict[int, list[Event]] = {0: [
        request("a", range(10, 17), max_tokens=6, ignore_eos=True),
        request("b", range(30, 37), max_tokens=4, ignore_eos=True),
        request("c", [50], max_tokens=2, ignore_eos=True),  # fits in the block left after step 2
    ]}
    run = drive(config, events, depth=1, model=counting_model)
    plans = run.worker.plans
    # Step 2: a's 9th token needs a third block; the pool is full, so b (newer) gives its blocks up.
    assert plans[2].released_slots == [1]
    assert [(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in plans[2].scheduled] == [(0, 8, 1)]
    # b went back to the front of the queue: c may not overtake it.
    assert run.admissions == ["a", "b", "b", "c"]
    assert run.num_preemptions == 1
    resumed = [new for plan in plans for new in plan.new_requests if new.request_id == "b"][1]
    assert resumed.token_ids == [*range(30, 37), 37, 38] and resumed.num_prompt_tokens == 7
    assert run.outcomes == expected_outcomes(events, config, counting_model)


def test_a_request_that_preempts_itself_waits_for_a_later_step() -> None:
    config = make_config(max_model_len=16, num_kv_blocks=4, max_num_seqs=2, max_num_batched_tokens=2)
    events: dict[int, list[Event]] = {0: [request("a", range(10, 14), max_tokens=9, ignore_eos=True),
                                          request("b", range(30, 34), max_tokens=3, ignore_eos=True)]}
    run = drive(config, events, depth=1, model=counting_model)
    # Step 6: a takes the last free block; b needs one more, is the newest, so it preempts itself.
    # The block it frees would take a 1-token chunk of b again, but that would only thrash.
    step = run.worker.plans[6]
    assert [(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in step.scheduled] == [(0, 8, 1)]
    assert (step.released_slots, step.new_requests) == ([1], [])
    assert run.num_preemptions == 1
    assert run.outcomes == expected_outcomes(events, config, counting_model)
