"""The incremental SSE parser on OpenAI-style streams, whole and split at every byte position."""

from __future__ import annotations

import json

import pytest

from benchmarks.common.sse import DONE, SSEParser

TEXT_EVENT = {"id": "cmpl-1", "choices": [{"index": 0, "text": "héllo"}]}
USAGE_EVENT = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
STREAM = (
    b": keep-alive ping\n\n"
    + b"data: " + json.dumps(TEXT_EVENT, ensure_ascii=False).encode() + b"\r\n\r\n"
    + b"event: message\ndata: {\"a\":\ndata: 1}\n\n"
    + b"data: " + json.dumps(USAGE_EVENT).encode() + b"\n\n"
    + b"data: [DONE]\n\n"
)
EXPECTED = [json.dumps(TEXT_EVENT, ensure_ascii=False), '{"a":\n1}', json.dumps(USAGE_EVENT), DONE]


def parse(chunks: list[bytes]) -> list[str]:
    parser = SSEParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events + parser.close()


def test_whole_stream() -> None:
    events = parse([STREAM])
    assert events == EXPECTED
    assert json.loads(events[2])["choices"] == [] and json.loads(events[2])["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("split", range(1, len(STREAM)))
def test_split_at_every_byte(split: int) -> None:
    assert parse([STREAM[:split], STREAM[split:]]) == EXPECTED


def test_one_byte_at_a_time() -> None:
    assert parse([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_events_complete_only_at_their_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]\n") == []
    assert parser.feed(b"\n") == [DONE]


def test_bare_cr_line_ends_and_unterminated_tail() -> None:
    assert parse([b"data: x\r\rdata:y\r", b"\rdata: tail"]) == ["x", "y", "tail"]
