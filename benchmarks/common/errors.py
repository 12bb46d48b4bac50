"""The `errors` block of a result: how many requests failed, the rate, and why, grouped.

Key design choice: the reason is the part of `RequestOutcome.error` that names the cause and not the
request -- the HTTP status and the server's `error.message`, the message of an error event, or the last
line of a client-side traceback (the exception) -- so a thousand refusals of one kind are one row.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from benchmarks.common.metrics import RequestOutcome, table_header, table_row

_REASON_CHARS = 300
_HTTP_ERROR = re.compile(r"HTTP (\d{3})[^:]*: (.*)", re.DOTALL)


def error_reason(error: str) -> str:
    """The grouping key of one failed request's error text."""
    if match := _HTTP_ERROR.match(error):
        status, body = match.groups()
        return f"HTTP {status}: {_server_message(body)}"[:_REASON_CHARS]
    if error.startswith("error event: "):
        return f"error event: {_server_message(error.removeprefix('error event: '))}"[:_REASON_CHARS]
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "unknown error")[:_REASON_CHARS]


def _server_message(body: str) -> str:
    """`error.message` of an OpenAI-style error body, else the body itself."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body.strip()
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return body.strip()


def error_summary(outcomes: list[RequestOutcome]) -> dict[str, Any]:
    """`{"total", "rate", "reasons": [{"reason", "count"}, ...]}`, reasons most frequent first."""
    failed = [outcome for outcome in outcomes if not outcome.success]
    counts = Counter(error_reason(outcome.error) for outcome in failed)
    return {
        "total": len(failed),
        "rate": len(failed) / len(outcomes) if outcomes else 0.0,
        "reasons": [{"reason": reason, "count": count} for reason, count in counts.most_common()],
    }


def format_errors(errors: dict[str, Any]) -> str:
    """The printed errors section: the rate, then one line per reason with its count."""
    lines = [table_header(" Errors ", "="), table_row("Failed requests:", errors["total"]),
             table_row("Error rate:", errors["rate"], ".4f")]
    lines += [f"{reason['count']:>6} x {reason['reason']}" for reason in errors["reasons"]]
    return "\n".join(lines)
