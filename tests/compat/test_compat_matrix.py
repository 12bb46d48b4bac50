"""The compatibility matrix's CI subset, and the harness failing what is broken.

A few float32 cells run here (the full matrix: `python -m tests.compat.matrix --write docs/compatibility.md`);
a made-up feature that samples instead of decoding greedily must come out as a failed cell, as must
speculation whose every draft is blocked (the tokens match; the evidence does not), a declared
unsupported combination as unsupported without an engine, and docs/compatibility.md must cover every
pair of today's features and all on (tests/unit/test_docs_compatibility.py checks its feature table).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.compat.features import FEATURES, TARGET_CHECKPOINT, UNSUPPORTED, Feature, Setting, Unsupported
from rapid_llm.ipc.messages import TokenLogprobs
from tests.compat.harness import (FP8_NEAR_TIE_NATS, NEAR_TIE_NATS, CellResult, Reference, References,
                                  _with_checkpoint, cell_architecture, combinations, compare, largest_supported,
                                  prompts, run_cell, run_matrix, settings, unsupported_reason)
from tests.compat.report import GENERATED_MARK, pair_label, render

REPO_ROOT = Path(__file__).resolve().parents[2]
# Seven pairs, chosen so each float32 feature that starts no extra process is on in one of them. The hybrid model's
# pair is prefix caching: its hits restore recurrent state from snapshots written at block boundaries mid-prompt; a
# LoRA adapter's is chunked prefill (every chunk's rows read their adapter's slot).
CI_SUBSET = [("chunked_prefill", "prefix_caching"), ("async_scheduling", "preemption"), ("speculative", "quantization"),
             ("preemption", "draft_model"), ("structured_output", "kv_cache_fp8"), ("prefix_caching", "hybrid_model"),
             ("chunked_prefill", "lora")]
FACTS = {"commit": "test", "device": "cpu", "date": "today"}


@pytest.fixture(scope="module")
def references(tiny_checkpoint) -> References:
    return References(tiny_checkpoint, prompts())


def test_ci_subset_passes(tiny_checkpoint) -> None:
    results = run_matrix(tiny_checkpoint, CI_SUBSET)
    assert [(r.combination, r.status, r.reason) for r in results] == [(c, "passed", "") for c in CI_SUBSET]


def test_the_ci_subset_covers_every_fast_float32_feature() -> None:
    covered = {name for combination in CI_SUBSET for name in combination}
    fast = {feature.name for feature in FEATURES if not feature.slow and feature.name != "dtype"}
    assert covered == fast
    assert not any(feature.slow for feature in FEATURES if feature.name in covered)


def test_speculation_whose_drafts_are_all_blocked_fails_its_evidence(references) -> None:
    # logprobs (the harness's default request) keep every request from drafting: the tokens still match,
    # so only the evidence can tell that speculation never ran.
    blocked = tuple(dataclasses.replace(f, on=Setting(f.on.label, f.on.engine_args)) if f.name == "speculative"
                    else f for f in FEATURES)
    result = run_cell(("speculative",), references, blocked)
    assert (result.status, result.reason) == ("failed", "speculative decoding is on, yet no draft was verified")


def test_a_broken_combination_is_a_failed_cell(references) -> None:
    broken = Feature("sampled", "sampling instead of greedy", off=Setting("off"),
                     on=Setting("on", request={"temperature": 1.0, "seed": 3}))
    features = (*FEATURES, broken)
    result = run_cell(("chunked_prefill", "sampled"), references, features)
    assert result.status == "failed"
    assert result.reason.startswith("first pass: prompt ") and "the reference's" in result.reason, result.reason
    page = render([result], FACTS, features)
    assert "**failed** [1]" in page and "1. chunked prefill + sampling instead of greedy: failed: first pass" in page


def test_an_engine_that_refuses_the_settings_is_a_failed_cell_with_the_cause(references) -> None:
    refusing = Feature("no_slots", "no request slots", off=Setting("off"), on=Setting("on", {"max_num_seqs": 0}))
    result = run_cell(("no_slots",), references, (*FEATURES, refusing))
    assert result == CellResult(("no_slots",), "failed", "ValueError: --max-num-seqs must be at least 1, got 0",
                                result.seconds)


def test_declared_unsupported_combinations_are_not_run() -> None:
    declared = (Unsupported(frozenset({"chunked_prefill", "preemption"}), "made up for the test"),)

    def no_checkpoint(architecture: str) -> Path:
        raise AssertionError(f"an unsupported cell asked for the {architecture} checkpoint")

    results = run_matrix(no_checkpoint, [("chunked_prefill", "preemption", "dtype")], unsupported=declared)
    assert [(r.status, r.reason) for r in results] == [("unsupported", "made up for the test")]
    assert "unsupported [1]" in render(results, FACTS)


def test_two_features_setting_one_argument_differently_is_refused() -> None:
    clash = Feature("clash", "clash", off=Setting("off"), on=Setting("on", {"max_num_batched_tokens": 64}))
    with pytest.raises(ValueError, match="chunked_prefill and clash both set max_num_batched_tokens"):
        settings(("clash",), (*FEATURES, clash))
    with pytest.raises(ValueError, match="unknown features"):
        settings(("nope",))


def _all_on_but(*left_out: str) -> tuple[str, ...]:
    return tuple(feature.name for feature in FEATURES if feature.name not in left_out)


def test_the_combinations_are_baseline_singles_pairs_and_all_on_per_checkpoint() -> None:
    names = [feature.name for feature in FEATURES]
    runs = combinations(unsupported=())
    # All on, on the hybrid checkpoint, then on the default one.
    assert runs[0] == () and runs[-2:] == [_all_on_but(), _all_on_but("hybrid_model")]
    assert len(runs) == len(set(runs)) == 1 + len(names) + len(names) * (len(names) - 1) // 2 + 2


def test_an_unsupported_all_on_adds_the_supported_all_but_one_runs() -> None:
    declared = (Unsupported(frozenset({"chunked_prefill", "preemption"}), "made up for the test"),)
    runs = combinations(unsupported=declared)
    assert runs[-6:] == [_all_on_but(), _all_on_but("chunked_prefill"), _all_on_but("preemption"),
                         _all_on_but("hybrid_model"), _all_on_but("hybrid_model", "chunked_prefill"),
                         _all_on_but("hybrid_model", "preemption")]


def test_with_every_pair_of_conflicts_the_largest_supported_combinations_run() -> None:
    names = [feature.name for feature in FEATURES]
    runs = largest_supported(names, UNSUPPORTED)
    # What each run leaves out: n-gram and draft-model speculation never stay together, nor either with structured
    # output or LoRA, nor tensor parallelism with quantization, nor pipeline stages or either context parallelism
    # with speculation or the hybrid model, nor the three parallelisms of one sequence (PP, DCP, PCP) together.
    tp, quant, dcp, pcp, pp = "tensor_parallel", "quantization", "decode_context_parallel", \
        "prefill_context_parallel", "pipeline_parallel"
    spec, draft, so, fp8_kv = "speculative", "draft_model", "structured_output", "kv_cache_fp8"
    left_out = [{dcp, draft, pp, pcp, quant, spec}, {dcp, draft, pp, pcp, spec, tp},
                {draft, "hybrid_model", fp8_kv, pp, pcp, quant, spec},
                {dcp, draft, "hybrid_model", "lora", pcp, quant, spec},
                {dcp, draft, "hybrid_model", "lora", pcp, spec, tp}, {dcp, draft, "lora", pp, pcp, quant, so},
                {dcp, draft, "lora", pp, pcp, so, tp}, {dcp, draft, "hybrid_model", fp8_kv, "lora", pp, quant, spec},
                {dcp, "hybrid_model", "lora", pp, pcp, quant, spec, so},
                {dcp, draft, "hybrid_model", fp8_kv, "lora", pp, spec, tp},
                {dcp, "hybrid_model", "lora", pp, pcp, spec, so, tp}]
    assert [set(names) - set(run) for run in runs] == left_out
    for run in runs:  # each is supported, and adding back anything it leaves out is refused
        assert unsupported_reason(run, UNSUPPORTED) is None
        assert all(unsupported_reason((*run, name), UNSUPPORTED) for name in set(names) - set(run))
    default_checkpoint = _all_on_but("hybrid_model")
    default_runs = [run for run in largest_supported(default_checkpoint, UNSUPPORTED) if run not in runs]
    assert combinations()[-2 - len(runs) - len(default_runs):] == [tuple(names), *runs, default_checkpoint,
                                                                   *default_runs]


def test_a_cell_runs_on_the_checkpoint_its_settings_name() -> None:
    assert cell_architecture(()) == cell_architecture(("chunked_prefill",)) == "LlamaForCausalLM"
    assert cell_architecture(("chunked_prefill", "hybrid_model")) == "Qwen3_5ForCausalLM"
    moe = Feature("moe_model", "MoE model", off=Setting("off"), on=Setting("on", architecture="Qwen3MoeForCausalLM"))
    with pytest.raises(ValueError, match="hybrid_model and moe_model name different checkpoints"):
        cell_architecture(("hybrid_model", "moe_model"), (*FEATURES, moe))


def test_the_draft_model_setting_names_the_cells_checkpoint() -> None:
    engine_args, _ = settings(("draft_model",))
    assert engine_args["speculative_config"]["model"] == TARGET_CHECKPOINT
    resolved = _with_checkpoint(engine_args, Path("/ckpt"))
    assert resolved["speculative_config"]["model"] == "/ckpt" and resolved["log_level"] == "warning"


def test_the_page_is_generated_and_covers_every_pair_and_all_on() -> None:
    page = (REPO_ROOT / "docs" / "compatibility.md").read_text()
    assert page.startswith(GENERATED_MARK)
    for i, first in enumerate(FEATURES):
        for second in FEATURES[i + 1:]:
            for first_on in (False, True):
                for second_on in (False, True):
                    assert f"| {pair_label(first, first_on, second, second_on)} |" in page, (first.name, second.name)
    assert "\nAll on: " in page and "not run" not in page


def _top(*pairs: tuple[int, float]) -> TokenLogprobs:
    return TokenLogprobs(pairs[0][1], [token for token, _ in pairs], [logprob for _, logprob in pairs])


@pytest.mark.parametrize(("ours", "tolerant", "accepted"), [
    (_top((161, -3.356), (93, -3.387)), True, True),  # the measured bf16 chunked-prefill tie
    (_top((161, -3.0), (93, -3.0 - 2 * NEAR_TIE_NATS)), True, False),  # a clear preference: a real difference
    (_top((161, -3.356)), True, False),  # the reference's token is not even in our top logprobs
    (_top((161, -3.356), (93, -3.387)), False, False),  # float32's reference must match exactly
])
def test_outputs_may_part_from_a_tolerant_reference_only_at_a_tie(ours, tolerant: bool, accepted: bool) -> None:
    theirs = _top((93, -3.354), (161, -3.354))
    reference = Reference([[5, 93, 7], [1, 2]], [[None, theirs, None], [None, None]] if tolerant else None)
    mismatch, ties = compare([[5, 161, 8], [1, 2]], [[None, ours, None], [None, None]], reference)
    where = "prompt 0 (5 tokens): output token 1 is 161, the reference's 93"
    assert (mismatch, ties) == ((None, [where]) if accepted else (where, []))


def test_an_fp8_reference_tolerates_an_fp8_rounding_step() -> None:
    ours, theirs = _top((87, -3.405), (119, -3.546)), _top((119, -3.456), (87, -3.487))  # measured, 0.14 nats
    where = "prompt 0 (5 tokens): output token 1 is 87, the reference's 119"
    for tie_nats, accepted in ((NEAR_TIE_NATS, False), (FP8_NEAR_TIE_NATS, True)):
        reference = Reference([[5, 119]], [[None, theirs]], tie_nats)
        mismatch, ties = compare([[5, 87]], [[None, ours]], reference)
        assert (mismatch, ties) == ((None, [where]) if accepted else (where, []))
