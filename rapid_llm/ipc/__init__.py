"""Inter-process messages and ZeroMQ plumbing (ground floor: no torch, no engine imports)."""
