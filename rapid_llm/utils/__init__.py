"""Small helpers shared across rapid_llm and its tests."""
