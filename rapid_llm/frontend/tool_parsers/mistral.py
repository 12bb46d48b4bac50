"""mistral: `[TOOL_CALLS]` then either a JSON array of `{"name", "arguments"}` objects (tokenizers
before v11) or `name[ARGS]{...}`, repeated with another `[TOOL_CALLS]` per call (v11 and later).

`[TOOL_CALLS]` is a special token, so requests parsed by this family keep special tokens in the
text (as vLLM does). Call ids are 9 letters and digits, the only shape Mistral's templates accept.
"""

from __future__ import annotations

import secrets

from rapid_llm.frontend.tool_parsers.base import (
    FUNCTION_NAME, ALPHANUMERIC, Malformed, ParsedCall, ParseResult, ToolParser, content_before, held_back, plain, skip_space)
from rapid_llm.frontend.tool_parsers.json_calls import arguments_text, json_value_end, read_call_sequence

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True

    def parse(self, text: str, final: bool) -> ParseResult:
        content, start = content_before(text, TOOL_CALLS, final)
        if start < 0:
            return ParseResult(content)
        index = skip_space(text, start + len(TOOL_CALLS))
        try:
            if index < len(text) and text[index] == "[":
                calls, end = read_call_sequence(text, index + 1, ("arguments", "parameters"), ",", "]", final)
            else:
                calls, end = self._named_calls(text, start, final)
        except Malformed:
            return plain(text)
        if end is None and final:
            return plain(text)
        return ParseResult(content, calls)

    def _named_calls(self, text: str, start: int, final: bool) -> tuple[list[ParsedCall], int | None]:
        calls: list[ParsedCall] = []
        while True:
            index = start + len(TOOL_CALLS)
            args_at = text.find(ARGS, index)
            if args_at < 0:
                partial_name = text[index:len(text) - held_back(text, ARGS)].strip()
                if partial_name and not FUNCTION_NAME.fullmatch(partial_name):
                    raise Malformed("not a function name")
                return calls, None
            name = text[index:args_at].strip()
            if not FUNCTION_NAME.fullmatch(name):
                raise Malformed("not a function name")
            call = ParsedCall(name)
            calls.append(call)
            value_at = skip_space(text, args_at + len(ARGS))
            if value_at >= len(text):
                return calls, None
            end = json_value_end(text, value_at, final)
            call.arguments = arguments_text(text, value_at, end)
            if end is None:
                return calls, None
            after = skip_space(text, end)
            if not text.startswith(TOOL_CALLS, after):
                return calls, after if after < len(text) or final else None
            start = after

    def make_call_id(self) -> str:
        return "".join(secrets.choice(ALPHANUMERIC) for _ in range(9))
