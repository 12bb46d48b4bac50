"""What every model with a state cache group must show through the real server (recurrent double, LFM2)."""

from __future__ import annotations

from tests.e2e.server import ServerProcess


def check_served_state_model(server: ServerProcess, model: str, prompts: list[list[int]],
                             expected: list[list[int]], new_tokens: int) -> None:
    """The batch and a repeated prompt give the reference's greedy tokens; the repeated prompt started from a prefix
    hit (KV blocks and a state snapshot); the KV budget forced a preemption, whose request restarted its state."""
    assert server.greedy_token_ids(model, prompts, new_tokens) == expected
    # Sent alone twice: the second finds the first's KV blocks and the snapshot at its last block boundary (the
    # batch's own may have been evicted by the small cache).
    assert server.greedy_token_ids(model, prompts[1:2], new_tokens, timeout=60) == expected[1:2]
    hits = server.metrics()["rapid_llm:prefix_cache_hits_total"]
    assert server.greedy_token_ids(model, prompts[1:2], new_tokens, timeout=60) == expected[1:2]
    metrics = server.metrics()
    assert metrics["rapid_llm:prefix_cache_hits_total"] > hits, "the repeated prompt found no snapshot"
    assert sum(value for name, value in metrics.items() if "preemption" in name) > 0, metrics
