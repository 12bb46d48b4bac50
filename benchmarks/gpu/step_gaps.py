"""How long the GPU idles between worker steps, from a trace of RAPID_LLM_TORCH_PROFILER_DIR (step_profiler.py).

    python benchmarks/gpu/step_gaps.py TRACE.json[.gz] [--json OUT.json]

Device work is the trace's "kernel", "gpu_memcpy" and "gpu_memset" events (kineto's categories); their union is
the GPU's busy time, the holes in it its idle gaps, and the window runs from the first "worker_step" range to the
end of the last step or device event. A device event belongs to the step whose range holds its launch (the host
event with the same correlation id), so per step the report gives the gap from the last device event of the step
before (that had any) to this step's first: near zero when host scheduling hides behind the GPU, about the
host's step time when it does not; `top_device_work` names where the GPU's time goes (per step, by event
name). Times are microseconds, percentiles nearest-rank. A CPU-only trace has no
device events: the report says so and gives the steps' host durations only. Key design choice: standard library
only, so it runs wherever the trace is (report.py reads its --json output).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import math
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_RANGE = "worker_step"  # written by rapid_llm/worker_proc/step_profiler.py
TOP_DEVICE_WORK = 15


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's complete ("X") events."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as trace:
        return [event for event in json.load(trace)["traceEvents"] if event.get("ph") == "X"]


def stats(name: str, values: list[float]) -> dict[str, Any]:
    """Flat `{name}_count`, `_sum_us`, `_p50_us`, `_p90_us`, `_max_us` (None when there are no values)."""
    ordered = sorted(values)

    def rank(percent: int) -> float | None:
        return ordered[max(math.ceil(percent / 100 * len(ordered)), 1) - 1] if ordered else None

    return {f"{name}_count": len(ordered), f"{name}_sum_us": sum(ordered), f"{name}_p50_us": rank(50),
            f"{name}_p90_us": rank(90), f"{name}_max_us": ordered[-1] if ordered else None}


def busy_intervals(device: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The union of the device events' [start, end) intervals, in time order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((event["ts"], event["ts"] + event["dur"]) for event in device):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def analyse(events: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sorted((event for event in events if event.get("cat") == "user_annotation"
                    and event["name"] == STEP_RANGE), key=lambda event: event["ts"])
    if not steps:
        raise ValueError(f"no {STEP_RANGE!r} ranges in the trace: was it written by step_profiler.py?")
    device = [event for event in events if event.get("cat") in DEVICE_CATEGORIES]
    per_step: list[dict[str, Any]] = [{"cpu_us": step["dur"]} for step in steps]
    window_start = steps[0]["ts"]
    window_end = max([step["ts"] + step["dur"] for step in steps] + [event["ts"] + event["dur"] for event in device])
    report: dict[str, Any] = {"steps": len(steps), "window_us": window_end - window_start,
                              "device_events": len(device), **stats("cpu_step", [step["dur"] for step in steps])}
    if not device:
        report["note"] = "no device events: a CPU-only trace, host step durations only"
        return report | {"per_step": per_step}

    launches = {event["args"]["correlation"]: event["ts"] for event in events
                if event.get("cat") not in DEVICE_CATEGORIES and "correlation" in event.get("args", {})}
    starts = [step["ts"] for step in steps]
    owned: list[list[tuple[float, float]]] = [[] for _ in steps]  # per step: its device events' intervals
    for event in device:
        launch = launches.get(event.get("args", {}).get("correlation"))
        index = bisect.bisect_right(starts, launch) - 1 if launch is not None else -1
        if index < 0 or launch > starts[index] + steps[index]["dur"]:
            continue  # launched outside every step (or no launch found): counted in busy time only
        owned[index].append((event["ts"], event["ts"] + event["dur"]))
    previous_end = None
    for row, intervals in zip(per_step, owned):
        row["device_events"] = len(intervals)
        if not intervals:
            row["device_span_us"] = row["gap_before_us"] = None
            continue
        first, last = min(start for start, _ in intervals), max(end for _, end in intervals)
        row["device_span_us"] = last - first
        row["gap_before_us"] = first - previous_end if previous_end is not None else None
        previous_end = last

    busy = busy_intervals(device)
    busy_us = sum(end - start for start, end in busy)
    idle_gaps = [start - busy[i - 1][1] for i, (start, _) in enumerate(busy) if i > 0]
    step_gaps = [row["gap_before_us"] for row in per_step if row["gap_before_us"] is not None]
    return report | {"device_events_outside_steps": len(device) - sum(map(len, owned)), "gpu_busy_us": busy_us,
                     "gpu_idle_fraction": 1 - busy_us / report["window_us"], **stats("idle_gap", idle_gaps),
                     **stats("step_gap", step_gaps), "top_device_work": top_device_work(device, len(steps)),
                     "per_step": per_step}


def top_device_work(device: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """The device events' names with the most time: microseconds and events per step, most first."""
    time_us, calls = collections.Counter(), collections.Counter()
    for event in device:
        time_us[event["name"]] += event["dur"]
        calls[event["name"]] += 1
    return [{"name": name, "us_per_step": total / steps, "events_per_step": calls[name] / steps}
            for name, total in time_us.most_common(TOP_DEVICE_WORK)]


def summary(report: dict[str, Any]) -> str:
    lines = [f"{report['steps']} steps over {report['window_us']:.0f} us; host step p50 "
             f"{report['cpu_step_p50_us']:.1f} us, max {report['cpu_step_max_us']:.1f} us"]
    if "note" in report:
        return "\n".join([*lines, report["note"]])
    lines.append(f"GPU busy {report['gpu_busy_us']:.0f} us, idle {report['gpu_idle_fraction']:.1%}; "
                 f"{report['idle_gap_count']} idle gaps, sum {report['idle_gap_sum_us']:.0f} us")
    if report["step_gap_count"]:
        lines.append(f"gap before a step's first device event: p50 {report['step_gap_p50_us']:.1f} us, "
                     f"p90 {report['step_gap_p90_us']:.1f} us, max {report['step_gap_max_us']:.1f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("trace", type=Path, help="worker-rank{rank}.json.gz (or an uncompressed .json)")
    parser.add_argument("--json", type=Path, help="Also write the report here.")
    args = parser.parse_args(argv)
    report = {"trace": str(args.trace), **analyse(load_events(args.trace))}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))


if __name__ == "__main__":
    main()
