"""Speculative-decoding acceptance over a benchmark run, from the server's /metrics counters read before and after.

Key design choice: only the Prometheus text is parsed, by metric-name suffix, so the same code reads
rapid_llm's `rapid_llm:spec_decode_*` and vLLM's `vllm:spec_decode_*` counters; a server that exports none
(speculation off, or another server) yields None, and the report says so instead of printing zeros.

Usage:
    before = fetch_spec_counters(base_url, headers); ...run...; after = fetch_spec_counters(base_url, headers)
    summary = spec_decode_summary(before, after)   # None without counters or drafts
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from benchmarks.common.metrics import table_header, table_row

_SUFFIXES = {  # metric name suffix -> key
    ":spec_decode_num_drafts_total": "num_drafts",
    ":spec_decode_num_draft_tokens_total": "num_draft_tokens",
    ":spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    ":spec_decode_num_disables_total": "num_disables",
    ":spec_decode_num_gate_closes_total": "num_gate_closes",
}
_PER_POSITION = ":spec_decode_num_accepted_tokens_per_pos_total"
_POSITION = re.compile(r'position="(\d+)"')


def parse_spec_counters(text: str) -> dict[str, Any] | None:
    """The spec-decode counters in Prometheus text (summed over other labels, e.g. several models), with
    `accepted_per_position` as a list; None when the text has no draft counter."""
    counters: dict[str, Any] = {}
    per_position: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name.endswith(_PER_POSITION):
            match = _POSITION.search(key)
            if match:
                position = int(match.group(1))
                per_position[position] = per_position.get(position, 0.0) + float(rest)
            continue
        for suffix, field in _SUFFIXES.items():
            if name.endswith(suffix):
                counters[field] = counters.get(field, 0.0) + float(rest)
    if "num_drafts" not in counters:
        return None
    counters["accepted_per_position"] = [per_position.get(i, 0.0) for i in range(max(per_position, default=-1) + 1)]
    return counters


def fetch_spec_counters(base_url: str, headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    """`GET {base_url}/metrics` parsed by `parse_spec_counters`; None where unreachable or without counters."""
    try:
        response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=10.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_spec_counters(response.text)


def spec_decode_summary(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the run added: counts, acceptance rate (accepted / draft tokens), mean acceptance length (1 +
    accepted / drafts: tokens per verification step, the bonus included) and, per draft position, the share
    of verifications that accepted it (the rates None when no draft was verified: speculation paused, e.g. the
    speed gate closed for the whole run). None without counters on both sides."""
    if before is None or after is None:
        return None
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in _SUFFIXES.values()}
    old = before["accepted_per_position"]
    per_position = [value - (old[i] if i < len(old) else 0.0) for i, value in enumerate(after["accepted_per_position"])]
    drafts, draft_tokens = delta["num_drafts"], delta["num_draft_tokens"]
    return {
        **{key: int(value) for key, value in delta.items()},
        "acceptance_rate": delta["num_accepted_tokens"] / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1.0 + delta["num_accepted_tokens"] / drafts if drafts else None,
        "per_position_acceptance_rate": [value / drafts for value in per_position] if drafts else [],
    }


def format_spec_decode(summary: dict[str, Any] | None) -> str:
    """The printed speculative-decoding section."""
    lines = [table_header(" Speculative Decoding ", "=")]
    if summary is None:
        return "\n".join([*lines, "no drafts verified (speculation off, or the server exports no counters)"])
    rate = summary["acceptance_rate"]
    lines += [table_row("Drafts (verification steps):", summary["num_drafts"]),
              table_row("Draft tokens:", summary["num_draft_tokens"]),
              table_row("Accepted tokens:", summary["num_accepted_tokens"]),
              table_row("Acceptance rate (%):", "n/a" if rate is None else f"{100 * rate:.2f}"),
              table_row("Mean acceptance length:", "n/a" if summary["mean_acceptance_length"] is None
                        else f"{summary['mean_acceptance_length']:.2f}"),
              table_row("Per-position acceptance (%):",
                        " ".join(f"{100 * value:.1f}" for value in summary["per_position_acceptance_rate"])),
              table_row("Adaptive-off pauses:", summary["num_disables"]),
              table_row("Speed-gate closes:", summary["num_gate_closes"])]
    return "\n".join(lines)
