"""How a chat request's `tools` and `tool_choice` shape its generation: which parser reads the output,
and which JSON schema (if any) constrains it.

Key design choice: vLLM's semantics. "none" renders the tools but parses nothing; "auto" reads the
model's own call syntax with the `--tool-call-parser` family and needs `--enable-auto-tool-choice`
(a 400 naming `tool_choice` otherwise); "required" and a named function constrain the output to a
JSON schema (`SamplingParams.structured_outputs`) and read it as JSON, whatever the family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.protocol import ChatCompletionRequest
from rapid_llm.frontend.tool_parsers import ToolParser, parser_class
from rapid_llm.frontend.tool_parsers.forced import (
    NamedToolParser, RequiredToolParser, named_schema, required_schema, schema_text)
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams


@dataclass(frozen=True)
class ToolPlan:
    make_parser: Callable[[], ToolParser] | None = None  # None: the output is plain content
    structured_outputs: StructuredOutputsParams | None = None
    keeps_special_tokens: bool = False

    def apply(self, params: SamplingParams) -> SamplingParams:
        """`params` with the plan's constraint and detokenization needs."""
        if self.structured_outputs is not None:
            if params.structured_outputs is not None:
                raise bad_request("tool_choice \"required\" or a named function constrains the output already; "
                                  "it cannot be combined with response_format or structured outputs",
                                  param="tool_choice")
            params = msgspec.structs.replace(params, structured_outputs=self.structured_outputs)
        if self.keeps_special_tokens:
            params = msgspec.structs.replace(params, skip_special_tokens=False)
        return params


def plan_tools(body: ChatCompletionRequest, options: FrontendOptions) -> ToolPlan:
    tools = body.tool_dicts or []
    choice = body.resolved_tool_choice
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice needs tools: the request has none", param="tool_choice")
        return ToolPlan()
    if choice == "none":
        return ToolPlan()
    if choice == "auto":
        if not options.enable_auto_tool_choice or options.tool_call_parser is None:
            raise bad_request('tool_choice "auto" (the default when tools are given) needs the server started '
                              'with --enable-auto-tool-choice and --tool-call-parser', param="tool_choice")
        family = parser_class(options.tool_call_parser)
        return ToolPlan(lambda: family(tools), keeps_special_tokens=family.keeps_special_tokens)
    if choice == "required":
        schema = required_schema(tools, body.parallel_tool_calls)
        return ToolPlan(lambda: RequiredToolParser(tools), _json_constraint(schema))
    name = choice.function.name
    schema = named_schema(tools, name)
    return ToolPlan(lambda: NamedToolParser(tools, name), _json_constraint(schema))


def _json_constraint(schema: dict[str, Any]) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=schema_text(schema))
