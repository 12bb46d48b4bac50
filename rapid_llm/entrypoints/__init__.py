"""Top-level wiring: start the engine processes for the HTTP server or the offline LLM class."""
