"""Benchmarks for rapid_llm whose numbers are comparable with vLLM's and SGLang's benchmark tools."""
