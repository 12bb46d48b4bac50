"""Structured output (JSON schema, regex, choice, EBNF) with xgrammar: grammars compiled off the step loop,
one matcher per engine request in the worker, and a token bitmask applied right before sampling.
See docs/structured_output.md."""

from rapid_llm.structured.compiler import GrammarCompilerPool
from rapid_llm.structured.grammar_spec import GrammarSpec, GrammarSpecError
from rapid_llm.structured.manager import StructuredOutputs

__all__ = ["GrammarCompilerPool", "GrammarSpec", "GrammarSpecError", "StructuredOutputs"]
