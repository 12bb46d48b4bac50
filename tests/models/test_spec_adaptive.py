"""Adaptive off on the demo target, scheduler + worker in one process: greedy tokens are identical with
adaptive off engaged (a strict threshold pauses requests, probes resume them), with it turned off and with
speculation off, in async+overlap and lock-step modes; seeded sampling at temperature 1.0 likewise."""

from __future__ import annotations

import msgspec
import pytest

from rapid_llm.sampling import SamplingParams
import tests.models.test_spec_decode as spec_models
from tests.models.test_spec_decode import GREEDY, MAX_TOKENS, NGRAM, _serve

STRICT = msgspec.structs.replace(NGRAM, acceptance_threshold=0.9, acceptance_window=2, probe_after_tokens=3)
NEVER = msgspec.structs.replace(NGRAM, acceptance_threshold=0.0)
demo = spec_models.demo  # the demo target's runner and code prompts (a module fixture)


@pytest.mark.parametrize("mode", ["async-overlap", "lockstep"])
def test_greedy_tokens_are_identical_with_adaptive_on_and_off(mode: str, demo) -> None:
    runner, _, prompts = demo
    adaptive, stats = _serve(runner, prompts, GREEDY, STRICT, mode)
    never, never_stats = _serve(runner, prompts, GREEDY, NEVER, mode)
    off, _ = _serve(runner, prompts, GREEDY, None, mode)
    assert adaptive == never == off
    assert stats.spec_decode_num_disables > 0 and never_stats.spec_decode_num_disables == 0
    assert stats.spec_decode_num_draft_tokens < never_stats.spec_decode_num_draft_tokens


def test_seeded_sampling_is_identical_with_adaptive_on_and_off(demo) -> None:
    runner, _, prompts = demo
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=MAX_TOKENS, ignore_eos=True)
    adaptive, stats = _serve(runner, prompts, params, STRICT, "async-overlap")
    off, _ = _serve(runner, prompts, params, None, "async-overlap")
    assert adaptive == off and stats.spec_decode_num_disables > 0
