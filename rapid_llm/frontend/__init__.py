"""The HTTP frontend: OpenAI routes, validation, tokenization and streaming (never touches torch)."""
