"""The HTTP frontend's EngineClient for a started engine: one TokenizerManager, or a router over D of them.

Key design choice: with one replica the frontend talks to its TokenizerManager directly (no router, no
per-replica families), exactly as before data parallelism existed; with `--data-parallel-size D` it gets a
`DataParallelClient` over one manager per replica and a `ReplicaCollector` for /metrics. /server_info
reports the first replica's KV-cache and rank-0 facts (every replica has the same) plus the layout.
Usage: `client, collectors = frontend_client(engine, tokenizer, model_dir)`.
"""

from __future__ import annotations

from typing import Any

import rapid_llm
from rapid_llm.entrypoints.engine_processes import EngineProcesses
from rapid_llm.frontend.dp_client import DataParallelClient
from rapid_llm.frontend.replica_metrics import ReplicaCollector
from rapid_llm.frontend.router import Router
from rapid_llm.frontend.tokenizer_manager import TokenizerManager


def frontend_client(engine: EngineProcesses, tokenizer: Any,
                    model_dir: str) -> tuple[TokenizerManager | DataParallelClient, list[ReplicaCollector]]:
    config = engine.config
    parallel = config.parallel
    scheduler_info, worker_info = engine.replica_info(0)
    server_info = {**config.summary(), "num_kv_blocks": scheduler_info["num_kv_blocks"],
                   "kv_cache_tokens": worker_info["kv_cache_tokens"], "kv_cache_bytes": worker_info["kv_cache_bytes"],
                   "weight_bytes": worker_info["weight_bytes"], "ops": worker_info["ops"],
                   "state_cache_bytes": worker_info["state_cache_bytes"],
                   "state_snapshots": worker_info["state_snapshots"],
                   "kv_offload_blocks": worker_info["kv_offload_blocks"],
                   "cpu_threads": worker_info["cpu_threads"],
                   "cpu_threads_long_steps": worker_info["cpu_threads_long_steps"], "version": rapid_llm.__version__,
                   "data_parallel_size": parallel.data_parallel_size, "nnodes": parallel.nnodes}
    managers = [TokenizerManager(paths, tokenizer, config.served_model_name, model_dir, config.model.max_model_len,
                                 config.model.vocab_size, engine.is_alive, config.scheduler.enable_prefix_caching,
                                 server_info, watchdog_timeout=config.scheduler.watchdog_timeout)
                for paths in engine.replica_paths]
    if len(managers) == 1:
        return managers[0], []
    server_info["load_balance_method"] = parallel.load_balance_method
    router = Router(len(managers), parallel.load_balance_method, config.cache.block_size,
                    index_blocks=scheduler_info["num_kv_blocks"])
    client = DataParallelClient(managers, router, server_info)
    return client, [ReplicaCollector(client)]
