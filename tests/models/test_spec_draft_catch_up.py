"""The draft model skips decode steps in which no row drafts (speed gate closed) and catches up afterwards:
with a draft equal to the target, drafts after a closed stretch are still almost always accepted (they would
not be if the skipped positions' draft KV were left unwritten), the proposer is never called for such a step,
and greedy tokens equal those without speculation. Prompt positions it always computes: a later request that
hits them in the prefix cache drafts from valid KV."""

from __future__ import annotations

import pytest

from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.spec_decode.speed_gate import SpeedGate
from tests.models.test_spec_decode_draft import GREEDY, CheckedEngine, _runner, _serve, _spec


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


def test_prompts_computed_while_closed_serve_prefix_hits_with_valid_draft_kv(tiny_checkpoint,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = _spec(target, k=3)
    prompt = list(range(60, 84))  # six full blocks of 4
    engine = CheckedEngine(_runner(target, speculative), speculative=speculative)
    gate = engine.scheduler._speculation.gate
    monkeypatch.setattr(SpeedGate, "step_done", lambda self, *args: None)  # the test decides open/closed
    gate.open = False
    first = engine.serve([GenerateRequest("closed", prompt, GREEDY)], depth=1)
    assert engine.scheduler.stats().spec_decode_num_draft_tokens == 0
    gate.open = True
    second = engine.serve([GenerateRequest("open", prompt, GREEDY)], depth=1)
    stats = engine.scheduler.stats()
    assert stats.prefix_cache_hits > 0
    assert second["open"]["token_ids"] == first["closed"]["token_ids"]
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0
