"""benchmarks/soak_spec.py's verdict on synthetic rounds: stable outputs pass; a response that differs from round
2's from round 3 on fails (round 1 is not compared), as do failed requests, growing RSS and too few rounds."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import soak_spec

TEXTS = ["def f():\n    return 1", "import os", "x = 2"]


def _result(minute: int, texts: list[str], worker_rss: float, failed: int = 0) -> dict:
    processes = [{"title": "rapid_llm::worker0", "rss_mib_mean": worker_rss},
                 {"title": "rapid_llm::scheduler", "rss_mib_mean": 50.0}]
    return {"date": f"20261202-04{minute:02d}00", "generated_texts": texts, "failed": failed,
            "resources": {"processes": processes},
            "spec_decode": {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12, "num_disables": 1}}


def _write(out: Path, rounds: dict[str, list[dict]]) -> Path:
    for workload, results in rounds.items():
        for number, result in enumerate(results, 1):
            (out / f"{workload}-{number}.json").write_text(json.dumps(result))
    (out / "workload-A.jsonl").write_text("")  # other files in the directory are ignored
    return out


def test_stable_rounds_pass_and_round_one_is_not_compared(tmp_path: Path) -> None:
    first = [TEXTS[0] + "!", *TEXTS[1:]]  # a prefix-cache rounding flip in round 1 only
    rounds = {"A": [_result(0, first, 400.0), _result(2, TEXTS, 420.0), _result(4, TEXTS, 421.0),
                    _result(6, TEXTS, 420.0)],
              "B": [_result(1, TEXTS, 410.0), _result(3, TEXTS, 421.0), _result(5, TEXTS, 422.0)]}
    summary = soak_spec.summarize(_write(tmp_path, rounds), max_growth_mib=8.0)
    assert summary["ok"] and summary["problems"] == []
    assert summary["outputs"]["A"] == {"rounds": 4, "requests": 12, "failed": 0, "mismatches": 0,
                                       "first_mismatches": []}
    assert summary["duration_s"] == 360.0
    assert summary["spec_decode"]["num_drafts"] == 70 and summary["spec_decode"]["acceptance_rate"] == 0.4
    worker = summary["memory"]["processes"]["rapid_llm::worker0"]
    # Each workload's round 1 is left out: the series is 420, 421, 421, 422, 420.
    assert worker["rss_mib_first"] == 420.0 and worker["rounds"] == 5 and worker["growth_mib"] == 0.0


def test_a_differing_response_failed_requests_and_growth_fail(tmp_path: Path) -> None:
    changed = [TEXTS[0], "import sys", TEXTS[2]]
    rounds = {"A": [_result(0, TEXTS, 400.0), _result(2, TEXTS, 430.0), _result(4, changed, 460.0, failed=1)],
              "B": [_result(1, TEXTS, 415.0), _result(3, TEXTS, 445.0), _result(5, TEXTS, 475.0)]}
    summary = soak_spec.summarize(_write(tmp_path, rounds), max_growth_mib=8.0)
    assert not summary["ok"]
    assert summary["outputs"]["A"]["first_mismatches"] == [{"round": 3, "request": 1, "at_char": 7}]
    assert summary["problems"] == ["A: 1 failed requests, 1 responses differ from round 2",
                                   "RSS grew by more than 8.0 MiB"]
    assert summary["memory"]["processes"]["rapid_llm::worker0"]["slope_mib_per_hour"] == 900.0


def test_too_short_to_judge(tmp_path: Path) -> None:
    rounds = {"A": [_result(0, TEXTS, 400.0), _result(2, TEXTS, 400.0)], "B": [_result(1, TEXTS, 400.0)]}
    summary = soak_spec.summarize(_write(tmp_path, rounds), max_growth_mib=8.0)
    assert summary["problems"] == ["too short to judge: each workload needs 3 rounds"]
