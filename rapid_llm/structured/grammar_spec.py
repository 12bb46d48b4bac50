"""GrammarSpec: one request's `StructuredOutputsParams` reduced to what xgrammar compiles, and checks of it.

Every kind becomes one of xgrammar's three inputs: a JSON schema (`json`; `json_object` is the schema
{"type": "object"}), a regex, or an EBNF grammar (`grammar`; `choice` is an EBNF alternation of its
strings as literals). JSON is generated without free whitespace (`, ` and `: ` separators, like vLLM's
`disable_any_whitespace`), so output length is bounded by the values, not by how much whitespace a
model emits; schemas are compiled in xgrammar's strict mode (no properties beyond the schema's unless
additionalProperties allows them). xgrammar 0.2.9 lets a string with minLength/maxLength hold raw control
characters, which JSON forbids (mlc-ai/xgrammar#800); such a string is compiled as a `pattern` over
printable ASCII without `"` and `\\` instead (a negated class would match single bytes of a multi-byte
character, so the decoded text could hold U+FFFD and exceed maxLength). The spec is hashable: it is the worker's
compile-cache key.
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
            return cls("json", _bounded_strings_as_patterns(params.json))
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


def _bounded_strings_as_patterns(schema_text: str) -> str:
    """The schema with each length-bounded plain string (no pattern, format, enum or const) as a pattern of
    that many printable ASCII characters other than `"` and `\\`; the text unchanged when there is none (or it is not JSON: check() says so)."""
    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError:
        return schema_text
    changed = False

    def visit(node: object) -> None:
        nonlocal changed
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            for item in node.values():
                visit(item)
            bounded = "minLength" in node or "maxLength" in node
            if (node.get("type") == "string" and bounded
                    and not {"pattern", "format", "enum", "const"} & node.keys()):
                low, high = node.pop("minLength", 0), node.pop("maxLength", "")
                node["pattern"] = f"^[ !#-\\[\\]-~]{{{low},{high}}}$"
                changed = True

    visit(schema)
    return json.dumps(schema) if changed else schema_text


def _reason(error: RuntimeError) -> str:
    """xgrammar's message without its C++ source location prefix ("[time] path.cc:123: ")."""
    message = str(error).strip()
    _, sep, rest = message.partition(".cc:")
    reason = rest.split(": ", 1)[-1].strip() if sep else message
    _, check, detail = reason.partition(" is false: ")  # "Check failed: (cond) is false: why"
    return detail if check else reason
