"""The draft model skips steps in which no row drafts (speed gate closed) and catches up afterwards: with a
draft equal to the target, drafts after a closed stretch are still almost always accepted (they would not be
if the skipped positions' draft KV were left unwritten), the proposer is never called while closed, and greedy
tokens equal those without speculation."""

from __future__ import annotations

import pytest

from rapid_llm.spec_decode.speed_gate import SpeedGate
from tests.models.test_spec_decode_draft import GREEDY, _runner, _serve, _spec


@pytest.mark.parametrize("mode", ["async-overlap", "lockstep"])
def test_the_draft_model_catches_up_on_steps_it_skipped(tiny_checkpoint, mode: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    results = {"count": 0}

    def closed_for_a_while(self: SpeedGate, decode_only: bool, num_rows: int, num_tokens: int) -> None:
        results["count"] += 1
        self.open = not 2 <= results["count"] < 8

    target = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = _spec(target, k=3)
    prompts = [[5, 9, 17, 33] * 4, list(range(60, 80))]
    reference = _serve(_runner(target, None), prompts, GREEDY, None, "lockstep")[0]
    runner = _runner(target, speculative)
    calls: list[tuple[bool, int, int]] = []
    propose = runner.drafting.proposer.propose

    def recording_propose(step):
        calls.append((results["count"] >= 8, len(step.draft_rows), int(step.query_lens.sum())))
        return propose(step)

    runner.drafting.proposer.propose = recording_propose
    monkeypatch.setattr(SpeedGate, "step_done", closed_for_a_while)
    tokens, stats, _ = _serve(runner, prompts, GREEDY, speculative, mode)
    assert tokens == reference
    assert all(rows > 0 for _, rows, _ in calls)  # never called for a step without a drafting row
    reopened = [length for after, _, length in calls if after]
    # The first call after the closed stretch catches up on every position skipped (several per row).
    assert reopened and reopened[0] > 2 * (1 + 3)
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0
