"""rapid_llm: an OpenAI-compatible LLM inference server that runs on CPU and GPU."""

__version__ = "0.1.0"
