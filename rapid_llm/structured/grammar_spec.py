"""GrammarSpec: one request's `StructuredOutputsParams` reduced to what xgrammar compiles, and checks of it.

Every kind becomes one of xgrammar's three inputs: a JSON schema (`json`; `json_object` is the schema
{"type": "object"}), a regex, or an EBNF grammar (`grammar`; `choice` is an EBNF alternation of its
strings as literals). JSON is generated without free whitespace (`, ` and `: ` separators, like vLLM's
`disable_any_whitespace`), so output length is bounded by the values, not by how much whitespace a
model emits; schemas are compiled in xgrammar's strict mode (no properties beyond the schema's unless
additionalProperties allows them). The spec is hashable: it is the worker's compile-cache key.
Usage: `spec = GrammarSpec.of(params.structured_outputs); spec.check()` (the frontend, for a 400);
`spec.compile(compiler)` (the worker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rapid_llm.sampling.params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar

JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarSpecError(ValueError):
    """xgrammar refuses the spec; the message says why."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "json", "regex" or "grammar": the xgrammar input `text` is
    text: str

    @classmethod
    def of(cls, params: StructuredOutputsParams) -> GrammarSpec:
        if params.json is not None:
            return cls("json", params.json)
        if params.json_object:
            return cls("json", JSON_OBJECT_SCHEMA)
        if params.regex is not None:
            return cls("regex", params.regex)
        if params.choice is not None:
            if not params.choice:
                raise GrammarSpecError("choice must list at least one string")
            # JSON string escapes are what xgrammar's EBNF literals read (\", \\, \n, \uXXXX).
            return cls("grammar", "root ::= " + " | ".join(json.dumps(choice) for choice in params.choice))
        if params.grammar is not None:
            return cls("grammar", params.grammar)
        raise GrammarSpecError("structured_outputs sets no kind")

    def check(self) -> None:
        """Parse the spec without a tokenizer (fast): raise GrammarSpecError with xgrammar's reason."""
        import xgrammar

        try:
            if self.kind == "json":
                xgrammar.Grammar.from_json_schema(self.text, any_whitespace=False, strict_mode=True)
            elif self.kind == "regex":
                xgrammar.Grammar.from_regex(self.text)
            else:
                xgrammar.Grammar.from_ebnf(self.text)
        except RuntimeError as error:
            raise GrammarSpecError(_reason(error)) from None

    def compile(self, compiler: xgrammar.GrammarCompiler) -> xgrammar.CompiledGrammar:
        """The compiled grammar over the compiler's vocabulary; raises GrammarSpecError if xgrammar refuses."""
        try:
            if self.kind == "json":
                return compiler.compile_json_schema(self.text, any_whitespace=False, strict_mode=True)
            if self.kind == "regex":
                return compiler.compile_regex(self.text)
            return compiler.compile_grammar(self.text)
        except RuntimeError as error:
            raise GrammarSpecError(_reason(error)) from None


def _reason(error: RuntimeError) -> str:
    """xgrammar's message without its C++ source location prefix ("[time] path.cc:123: ")."""
    message = str(error).strip()
    _, sep, rest = message.partition(".cc:")
    reason = rest.split(": ", 1)[-1].strip() if sep else message
    _, check, detail = reason.partition(" is false: ")  # "Check failed: (cond) is false: why"
    return detail if check else reason
