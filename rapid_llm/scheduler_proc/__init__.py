"""The scheduler side: request state, the KV block pool and the batching policy (no torch)."""
