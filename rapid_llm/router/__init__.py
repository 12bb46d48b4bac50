"""The prefill/decode router: `python -m rapid_llm.router --prefill URL... --decode URL... --port N`."""
