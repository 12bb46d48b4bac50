"""deepseek_v3: DeepSeek's calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each one
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + the arguments in a ```json fence (V3, R1) or
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}` (V3.1, registered also as deepseek_v31), then
`<｜tool▁call▁end｜>`. Content is the text before the first call block.
"""

from __future__ import annotations


from rapid_llm.frontend.tool_parsers.base import (
    FUNCTION_NAME, Incomplete, Malformed, ParsedCall, ParseResult, ToolParser, content_before, held_back, is_prefix_at, plain,
    skip_space)
from rapid_llm.frontend.tool_parsers.json_calls import arguments_text, json_value_end

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json", "```"



class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"

    def parse(self, text: str, final: bool) -> ParseResult:
        content, start = content_before(text, CALLS_BEGIN, final)
        if start < 0:
            return ParseResult(content)
        result = ParseResult(content)
        index = start + len(CALLS_BEGIN)
        try:
            while True:
                index = skip_space(text, index)
                if text.startswith(CALL_BEGIN, index):
                    index = self._call(text, index + len(CALL_BEGIN), result, final)
                elif not final and is_prefix_at(text, index, CALL_BEGIN):
                    raise Incomplete
                elif result.calls:
                    return result  # CALLS_END or whatever follows the last call
                else:
                    raise Malformed("a call block without calls")
        except Malformed:
            return plain(text)
        except Incomplete:
            return plain(text) if final else result

    def _call(self, text: str, index: int, result: ParseResult, final: bool) -> int:
        """Read one call after its CALL_BEGIN into `result`; return the index after its CALL_END."""
        sep = text.find(SEP, index)
        if sep < 0:
            head = text[index:len(text) - held_back(text, SEP)].strip()
            if head and not FUNCTION_NAME.fullmatch(head):
                raise Malformed("not a function name")
            raise Incomplete
        head = text[index:sep].strip()
        if head == "function":  # V3: the name on the rest of the line, the arguments fenced
            line_end = text.find("\n", sep)
            if line_end < 0:
                raise Incomplete
            name, index, closing = text[sep + len(SEP):line_end].strip(), line_end, (FENCE_CLOSE, CALL_END)
        else:  # V3.1: the name before the separator, the arguments right after it
            name, index, closing = head, sep + len(SEP), (CALL_END,)
        if not FUNCTION_NAME.fullmatch(name):
            raise Malformed("not a function name")
        call = ParsedCall(name)
        result.calls.append(call)
        index = skip_space(text, index)
        if len(closing) == 2:
            if is_prefix_at(text, index, FENCE_OPEN):
                raise Incomplete
            if not text.startswith(FENCE_OPEN, index):
                raise Malformed("no ```json fence")
            index = skip_space(text, index + len(FENCE_OPEN))
        if index >= len(text):
            raise Incomplete
        if text[index] != "{":
            raise Malformed("the arguments are not an object")
        end = json_value_end(text, index, final)
        call.arguments = arguments_text(text, index, end)
        if end is None:
            raise Incomplete
        for marker in closing:
            index = skip_space(text, end)
            if index >= len(text) or is_prefix_at(text, index, marker):
                if final:
                    return len(text)  # ended right after the arguments: the call is complete
                raise Incomplete
            if not text.startswith(marker, index):
                raise Malformed(f"expected {marker}")
            end = index + len(marker)
        return end
