"""What every model with a state cache group must show through the real server (recurrent double, LFM2)."""

from __future__ import annotations

from tests.e2e.server import ServerProcess


def check_served_state_model(server: ServerProcess, model: str, prompts: list[list[int]],
                             expected: list[list[int]], new_tokens: int) -> None:
    """The batch and a repeated prompt give the reference's greedy tokens; prefix caching looked up and found
    nothing (state is not kept per block); the KV budget forced a preemption, whose request restarted its state."""
    assert server.greedy_token_ids(model, prompts, new_tokens) == expected
    # Repeated: cached blocks would be hits for a model of paged layers only; this one finds none.
    assert server.greedy_token_ids(model, prompts[1:2], new_tokens, timeout=60) == expected[1:2]
    metrics = server.metrics()
    assert metrics["rapid_llm:prefix_cache_queries_total"] > 0
    assert metrics["rapid_llm:prefix_cache_hits_total"] == 0
    assert sum(value for name, value in metrics.items() if "preemption" in name) > 0, metrics
