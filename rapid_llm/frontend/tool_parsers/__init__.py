"""Tool-call parsers, one module per model family, chosen by `--tool-call-parser NAME` (vLLM's names).

Usage: `parser_class(name)(tools).parse(text, final=True)` for a whole response; `ToolCallStreamer`
for a stream. The `required` and named tool choices use `forced`, whatever the family.
"""

from __future__ import annotations

from rapid_llm.frontend.tool_parsers.base import ToolParser
from rapid_llm.frontend.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser
from rapid_llm.frontend.tool_parsers.hermes import HermesToolParser
from rapid_llm.frontend.tool_parsers.llama3_json import Llama3JsonToolParser
from rapid_llm.frontend.tool_parsers.mistral import MistralToolParser
from rapid_llm.frontend.tool_parsers.pythonic import PythonicToolParser
from rapid_llm.frontend.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, Qwen3CoderToolParser,
                   DeepSeekV3ToolParser, PythonicToolParser)
}
TOOL_PARSERS["deepseek_v31"] = DeepSeekV3ToolParser  # reads both layouts


def parser_class(name: str) -> type[ToolParser]:
    """The parser registered as `name`; a ValueError naming the flag and the choices otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"--tool-call-parser {name!r} is not one of {', '.join(sorted(TOOL_PARSERS))}") from None
