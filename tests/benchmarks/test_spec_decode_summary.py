"""benchmarks/common/spec_decode.py: the spec-decode counters parsed from Prometheus text (rapid_llm's and
vLLM's names, several label sets), the run's deltas, acceptance rate, mean acceptance length, per-position
rates, and the printed section."""

from __future__ import annotations

from benchmarks.common.spec_decode import format_spec_decode, parse_spec_counters, spec_decode_summary


def _text(prefix: str, drafts: int, draft_tokens: int, accepted: int, per_position: list[int],
          disables: int = 0) -> str:
    lines = ["# HELP x y", f'{prefix}:spec_decode_num_drafts_total{{model_name="m"}} {float(drafts)}',
             f'{prefix}:spec_decode_num_draft_tokens_total{{model_name="m"}} {float(draft_tokens)}',
             f'{prefix}:spec_decode_num_accepted_tokens_total{{model_name="m"}} {float(accepted)}',
             f'{prefix}:spec_decode_num_disables_total{{model_name="m"}} {float(disables)}',
             f'{prefix}:prefix_cache_hits_total{{model_name="m"}} 99.0']
    lines += [f'{prefix}:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{i}"}} {float(v)}'
              for i, v in enumerate(per_position)]
    return "\n".join(lines) + "\n"


def test_counters_are_parsed_for_rapid_llm_and_vllm_names() -> None:
    for prefix in ("rapid_llm", "vllm"):
        counters = parse_spec_counters(_text(prefix, 10, 30, 12, [7, 4, 1], disables=2))
        assert counters == {"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 12.0,
                            "num_disables": 2.0, "accepted_per_position": [7.0, 4.0, 1.0]}
    two_models = _text("vllm", 1, 3, 2, [1, 1]) + _text("vllm", 2, 6, 1, [1]).replace('"m"', '"n"')
    assert parse_spec_counters(two_models)["accepted_per_position"] == [2.0, 1.0]
    assert parse_spec_counters('rapid_llm:num_preemptions_total{model_name="m"} 0.0\n') is None


def test_the_summary_is_the_runs_delta() -> None:
    before = parse_spec_counters(_text("rapid_llm", 10, 30, 12, [7, 4, 1]))
    after = parse_spec_counters(_text("rapid_llm", 30, 80, 42, [22, 14, 6], disables=3))
    summary = spec_decode_summary(before, after)
    assert summary == {"num_drafts": 20, "num_draft_tokens": 50, "num_accepted_tokens": 30, "num_disables": 3,
                       "num_gate_closes": 0, "acceptance_rate": 0.6, "mean_acceptance_length": 2.5,
                       "per_position_acceptance_rate": [0.75, 0.5, 0.25]}
    text = format_spec_decode(summary)
    assert "Acceptance rate (%):" in text and "60.00" in text and "75.0 50.0 25.0" in text and "2.50" in text


def test_no_counters_is_none_and_no_drafts_has_no_rates() -> None:
    same = parse_spec_counters(_text("rapid_llm", 4, 12, 3, [3]))
    idle = spec_decode_summary(same, same)
    assert idle["num_drafts"] == 0 and idle["acceptance_rate"] is idle["mean_acceptance_length"] is None
    assert "n/a" in format_spec_decode(idle)
    assert spec_decode_summary(None, same) is None and spec_decode_summary(same, None) is None
    # A position first accepted during the run has no earlier value.
    grown = spec_decode_summary(parse_spec_counters(_text("rapid_llm", 0, 0, 0, [])),
                                parse_spec_counters(_text("rapid_llm", 2, 4, 3, [2, 1])))
    assert grown["per_position_acceptance_rate"] == [1.0, 0.5]
    assert "no drafts verified" in format_spec_decode(None)
