"""Run a function on N CPU ranks of a fresh gloo group (torch.multiprocessing spawn, file rendezvous).

Each rank joins through `init_worker_group`, the engine's own entry, so the tests exercise the path the
workers take. `run_on_ranks` returns what each rank's function returned (JSON-able), rank order.
Usage: `results = run_on_ranks(check, 2, tmp_path, payload)`; `check(payload) -> dict` runs on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from rapid_llm.distributed.process_group import init_worker_group, leave_worker_group


def _rank_main(rank: int, world_size: int, directory: str, function: Callable[[Any], Any], payload: Any) -> None:
    # One thread per rank: the ranks share the machine's cores.
    torch.set_num_threads(1)
    init_worker_group(rank, world_size, f"file://{directory}/dist-init", "cpu")
    try:
        result = function(payload)
    finally:
        leave_worker_group()
    Path(directory, f"rank{rank}.json").write_text(json.dumps(result))


def run_on_ranks(function: Callable[[Any], Any], world_size: int, directory: Path, payload: Any = None) -> list[Any]:
    """`function(payload)` on each of `world_size` ranks; a rank's exception fails the call."""
    mp.spawn(_rank_main, args=(world_size, str(directory), function, payload), nprocs=world_size, join=True)
    return [json.loads(Path(directory, f"rank{rank}.json").read_text()) for rank in range(world_size)]
