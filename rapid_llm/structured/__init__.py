"""Structured output (JSON schema, regex, choice, EBNF) with xgrammar: grammars compiled off the step loop,
one matcher per engine request in the worker, and a token bitmask applied right before sampling.
Submodules are imported directly: grammar_spec is torch-free (the frontend checks specs with it), the
worker-side modules are not. See docs/structured_output.md."""
