"""Incremental server-sent-events parser: bytes from the network in, complete event payloads out.

Key design choice: it follows the SSE wire format (line-based fields, events ended by a blank line)
instead of splitting on b"\\n\\n", so events split at any byte -- inside a UTF-8 character, or
between the \\r and \\n of a CRLF -- comment lines, CRLF/CR line ends and multi-line data all work.
Lines are cut with str.split rather than scanned one by one: the client parses every chunk of every
stream, and its CPU time per chunk is time it cannot spend reading the next one.
"""

from __future__ import annotations

import codecs

DONE = "[DONE]"


class SSEParser:
    """Feed network chunks with `feed`; each call returns the `data` of the events it completed."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._partial_line = ""
        self._data_lines: list[str] = []
        # The last chunk ended in \r: a \n opening the next one belongs to the same line end.
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[str]:
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if self._after_cr and text[0] == "\n":
            text = text[1:]
        self._after_cr = text.endswith("\r")
        return self._take(text)

    def close(self) -> list[str]:
        """Events still pending when the stream ends without its final blank line."""
        return self._take(self._decoder.decode(b"", final=True) + "\n\n")

    def _take(self, text: str) -> list[str]:
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = (self._partial_line + text).split("\n")
        self._partial_line = lines.pop()
        events: list[str] = []
        for line in lines:
            if not line:
                if self._data_lines:
                    events.append("\n".join(self._data_lines))
                    self._data_lines = []
            elif line.startswith("data"):
                name, _, value = line.partition(":")
                if name == "data":
                    self._data_lines.append(value[1:] if value.startswith(" ") else value)
            # Comments (":...") and the event/id/retry fields carry nothing a benchmark reads.
        return events
