"""The verdict of a speculative-decoding soak (benchmarks/soak_spec.sh) from its rounds' bench_serving results.

    python benchmarks/soak_spec.py OUT_DIR [--max-growth-mib 32]   # exit 1 unless the soak passed

Every round sends the same fixed requests (greedy, or seeded sampling), so from round 2 on each response
must equal round 2's for its workload: a difference means state leaked between requests (KV rollback,
drafts, a reused slot). Round 1 is not compared: it fills the prefix cache, and a prompt prefilled in full
and one served from cached blocks differ in bf16 rounding, which can flip a near-tie sampled token (seen with
speculation off too: demo target, workload B, 1 request of 16). Memory is flat when every server process's mean RSS over the last third of the rounds exceeds
that over the first third by at most `--max-growth-mib`, each workload's round 1 left out (it warms caches);
the least-squares slope (MiB per hour) is reported too. Any failed request fails the soak, and so does one
too short to judge: fewer than 3 rounds of a workload.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

_ROUND = re.compile(r"^(?P<workload>[A-Za-z]+)-(?P<round>\d+)\.json$")


def finished_at(result: dict[str, Any]) -> float:
    """When the round ended (bench_serving's `date`, one-second resolution), as a POSIX time."""
    return datetime.strptime(result["date"], "%Y%m%d-%H%M%S").timestamp()


def load_rounds(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Result JSONs named WORKLOAD-ROUND.json, per workload in round order."""
    rounds: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for path in out.iterdir():
        match = _ROUND.match(path.name)
        if match:
            rounds.setdefault(match["workload"], []).append((int(match["round"]), json.loads(path.read_text())))
    return {workload: [result for _, result in sorted(items, key=lambda item: item[0])]
            for workload, items in sorted(rounds.items())}


def _first_difference(reference: str, text: str) -> int:
    for index, (a, b) in enumerate(zip(reference, text)):
        if a != b:
            return index
    return min(len(reference), len(text))


def check_outputs(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Failed requests, and responses of rounds 3... that differ from round 2's (by request index)."""
    if len(results) < 2:
        return {"rounds": len(results), "requests": sum(len(r["generated_texts"]) for r in results),
                "failed": sum(r["failed"] for r in results), "mismatches": 0, "first_mismatches": []}
    reference = results[1]["generated_texts"]
    mismatches = []
    for number, result in enumerate(results[2:], 3):
        texts = result["generated_texts"]
        if len(texts) != len(reference):
            raise ValueError(f"round {number} has {len(texts)} requests, round 2 has {len(reference)}")
        for index, (expected, text) in enumerate(zip(reference, texts)):
            if text != expected:
                mismatches.append({"round": number, "request": index, "at_char": _first_difference(expected, text)})
    return {"rounds": len(results), "requests": sum(len(r["generated_texts"]) for r in results),
            "failed": sum(r["failed"] for r in results), "mismatches": len(mismatches),
            "first_mismatches": mismatches[:10]}


def _slope_per_hour(times: list[float], values: list[float]) -> float | None:
    if len(times) < 2 or max(times) == min(times):
        return None
    mean_t, mean_v = statistics.mean(times), statistics.mean(values)
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values))
    return 3600.0 * covariance / sum((t - mean_t) ** 2 for t in times)


def check_memory(results: list[dict[str, Any]], max_growth_mib: float) -> dict[str, Any]:
    """Per server process (by title), its mean RSS per round of `results` in time order: growth and slope."""
    series: dict[str, list[tuple[float, float]]] = {}
    for result in results:
        resources = result["resources"]
        if "unavailable" in resources:
            continue
        for process in resources["processes"]:
            series.setdefault(process["title"], []).append((finished_at(result), process["rss_mib_mean"]))
    processes = {}
    for title, points in sorted(series.items()):
        values = [value for _, value in points]
        third = max(1, len(values) // 3)
        processes[title] = {
            "rounds": len(points), "rss_mib_first": values[0], "rss_mib_last": values[-1], "rss_mib_max": max(values),
            "growth_mib": statistics.mean(values[-third:]) - statistics.mean(values[:third]),
            "slope_mib_per_hour": _slope_per_hour([t for t, _ in points], values),
        }
    flat = bool(processes) and all(p["growth_mib"] <= max_growth_mib for p in processes.values())
    return {"max_growth_mib": max_growth_mib, "flat": flat, "processes": processes}


def summarize(out: Path, max_growth_mib: float) -> dict[str, Any]:
    rounds = load_rounds(out)
    if not rounds:
        raise ValueError(f"{out}: no WORKLOAD-ROUND.json results")
    ordered = sorted((result for results in rounds.values() for result in results), key=finished_at)
    outputs = {workload: check_outputs(results) for workload, results in rounds.items()}
    spec = [r["spec_decode"] for r in ordered if r.get("spec_decode")]
    drafts, draft_tokens = sum(s["num_drafts"] for s in spec), sum(s["num_draft_tokens"] for s in spec)
    accepted = sum(s["num_accepted_tokens"] for s in spec)
    warm = sorted((result for results in rounds.values() for result in results[1:]), key=finished_at)
    memory = check_memory(warm, max_growth_mib)
    problems = [f"{workload}: {o['failed']} failed requests, {o['mismatches']} responses differ from round 2"
                for workload, o in outputs.items() if o["failed"] or o["mismatches"]]
    if not memory["flat"]:
        problems.append(f"RSS grew by more than {max_growth_mib} MiB")
    if min(o["rounds"] for o in outputs.values()) < 3:
        problems.append("too short to judge: each workload needs 3 rounds")
    return {"ok": not problems, "problems": problems, "duration_s": finished_at(ordered[-1]) - finished_at(ordered[0]), "outputs": outputs, "memory": memory,
            "spec_decode": {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
                            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
                            "num_disables": sum(s["num_disables"] for s in spec),
                            "num_gate_closes": sum(s.get("num_gate_closes", 0) for s in spec)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-growth-mib", type=float, default=32.0,
                        help="Largest mean-RSS growth per process, last third vs first third of the rounds.")
    args = parser.parse_args(argv)
    summary = summarize(args.out, args.max_growth_mib)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print("soak passed" if summary["ok"] else "soak FAILED: " + "; ".join(summary["problems"]))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
