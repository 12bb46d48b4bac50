"""The Mooncake data plane of the KV connector (`kv_connector: MooncakeConnector`): blocks read straight from the
producer's cache memory into the consumer's by Mooncake's transfer engine (its TCP transport; RDMA where the build
and the hardware have it), while leases, confirmations and refusals stay on the built-in ZeroMQ control plane
(kv_transfer.py).

Key design choice: each side registers its cache tensors with its engine once, at start; a read's answer names the
producer's byte segments of the leased blocks (`KVCache.block_segments`) and its engine's session, and the consumer
pulls them into its own blocks' segments in one batch, so no KV byte passes through Python or ZeroMQ. Only whole
caches of one layout move (no head slicing for tensor-parallel readers).
Usage: `plane = MooncakeDataPlane(cache, "10.0.0.1")`; the producer answers with `plane.session` and
`plane.segments(block_ids)`, the consumer calls `plane.read(session, segments, block_ids)`.
"""

from __future__ import annotations

import importlib
from typing import Sequence

from rapid_llm.worker_proc.kv_cache import KVCache

INSTALL_HINT = "pip install mooncake-transfer-engine-non-cuda (CPU caches) or mooncake-transfer-engine (CUDA)"


def mooncake_missing() -> str | None:
    """Why Mooncake cannot run here (its import fails: not installed, or a system library it loads is missing), with
    how to install it; None when it can."""
    try:
        importlib.import_module("mooncake.engine")
    except ImportError as error:
        return f"{error}; {INSTALL_HINT}"
    return None


class MooncakeDataPlane:
    def __init__(self, cache: KVCache, hostname: str) -> None:
        try:
            from mooncake.engine import TransferEngine
        except ImportError as error:
            raise RuntimeError(f"kv_connector MooncakeConnector needs mooncake ({error}); {INSTALL_HINT}") from None
        self.cache = cache
        self.engine = TransferEngine()
        # P2PHANDSHAKE: peers exchange segment metadata directly, no metadata server to run.
        if self.engine.initialize(hostname, "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError(f"Mooncake's transfer engine did not start on {hostname}")
        self.session = f"{hostname}:{self.engine.get_rpc_port()}"
        for address, size in cache.memory_regions():
            if self.engine.register_memory(address, size) != 0:
                raise RuntimeError(f"Mooncake could not register {size} bytes of KV cache")

    def segments(self, block_ids: Sequence[int]) -> list[list[tuple[int, int]]]:
        """Per distinct tensor, the (address, bytes) segments of `block_ids` in this cache."""
        return [self.cache.block_segments(tensor, block_ids) for tensor in range(self.cache.num_tensors)]

    def read(self, session: str, remote: list[list[tuple[int, int]]], block_ids: Sequence[int]) -> int:
        """Pull the producer's segments `remote` (its `segments` of as many blocks) into `block_ids` here; the bytes
        read. ValueError when the layouts disagree or the engine reports a failure."""
        local = self.segments(block_ids)
        if [[size for _, size in tensor] for tensor in local] != [[size for _, size in tensor] for tensor in remote]:
            raise ValueError("the producer's block segments differ from this cache's (another layout or block count)")
        pairs = [(mine[0], theirs[0], mine[1]) for mine_tensor, their_tensor in zip(local, remote)
                 for mine, theirs in zip(mine_tensor, their_tensor)]
        status = self.engine.batch_transfer_sync_read(session, [pair[0] for pair in pairs],
                                                      [pair[1] for pair in pairs], [pair[2] for pair in pairs])
        if status != 0:
            raise ValueError(f"Mooncake's read from {session} failed (status {status})")
        return sum(pair[2] for pair in pairs)
