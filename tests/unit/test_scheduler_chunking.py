"""The scheduler's token budget and running set, driven by test_scheduler.py's fake worker: a prompt longer
than the budget is chunked behind the running decodes, max_num_seqs caps the running set, and admission is first
come, first served even when the first waiting request cannot be admitted yet."""

from __future__ import annotations

from tests.unit.test_scheduler import Event, counting_model, drive, expected_outcomes, make_config, request


def test_prompt_longer_than_the_budget_is_chunked_and_decodes_go_first() -> None:
    config = make_config(max_num_batched_tokens=5)
    events: dict[int, list[Event]] = {0: [request("a", range(2), max_tokens=8, ignore_eos=True)],
                                      2: [request("b", range(10, 23), max_tokens=2, ignore_eos=True)]}
    run = drive(config, events, depth=1, model=counting_model)
    chunks = [[(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in plan.scheduled] for plan in run.worker.plans]
    assert chunks[:6] == [
        [(0, 0, 2)], [(0, 2, 1)],
        [(0, 3, 1), (1, 0, 4)], [(0, 4, 1), (1, 4, 4)], [(0, 5, 1), (1, 8, 4)], [(0, 6, 1), (1, 12, 1)],
    ]
    assert run.outcomes["b"].token_ids == [23, 24]


def test_max_num_seqs_caps_the_running_set() -> None:
    config = make_config(max_num_seqs=2)
    events: dict[int, list[Event]] = {0: [request(f"r{i}", [i + 1], max_tokens=3, ignore_eos=True) for i in range(5)]}
    run = drive(config, events, depth=2, model=counting_model)
    assert all(len(plan.scheduled) <= 2 for plan in run.worker.plans)
    assert [new.request_id for new in run.worker.plans[0].new_requests] == ["r0", "r1"]
    assert run.outcomes == expected_outcomes(events, config, counting_model)


def test_fcfs_does_not_skip_a_request_that_cannot_be_admitted() -> None:
    config = make_config(num_kv_blocks=16, max_num_batched_tokens=100)
    events: dict[int, list[Event]] = {0: [
        request("a", [1] * 40, max_tokens=2, ignore_eos=True),
        request("b", [2] * 30, max_tokens=2, ignore_eos=True),  # needs 8 blocks, only 6 are left
        request("c", [3] * 4, max_tokens=2, ignore_eos=True),  # would fit, but must wait behind b
    ]}
    run = drive(config, events, depth=2)
    assert [new.request_id for new in run.worker.plans[0].new_requests] == ["a"]
    assert run.admissions == ["a", "b", "c"]
    assert run.outcomes == expected_outcomes(events, config)
