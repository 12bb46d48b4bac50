"""A node other than 0 (`--node-rank K`, K > 0): run this node's worker ranks, serve no HTTP, exit with node 0.

Key design choice: a headless node is only a supervisor. Its ranks take plans from node 0's scheduler and
meet the others in the TCP group; this process waits until one of its ranks exits (it got Shutdown from
node 0's scheduler, or failed) or the node link to node 0 ends (with node 0's goodbye: it shut down in
order; without: it vanished), then stops every child. Exit code 0 when node 0 shut down in order (its
scheduler's Shutdown or the goodbye), 1 when a rank died or node 0 vanished.
"""

from __future__ import annotations

import logging
import threading

from rapid_llm.entrypoints.engine_processes import EngineProcesses, EngineStartupError

logger = logging.getLogger("rapid_llm.launch_server")


def serve_headless(engine: EngineProcesses) -> int:
    parallel = engine.config.parallel
    try:
        engine.start()
        engine.wait_until_ready()
    except (EngineStartupError, OSError, RuntimeError) as error:
        logger.error("start-up failed: %s", error)
        return 1
    ranks = list(parallel.local_ranks)
    logger.info("node %d of %d ready: worker ranks %d-%d, serving node 0 at %s", parallel.node_rank, parallel.nnodes,
                ranks[0], ranks[-1], parallel.dist_init_addr)
    ended = threading.Event()
    outcome: list[tuple[str, int | None]] = []

    def on_exit(name: str, exit_code: int | None) -> None:
        outcome.append((name, exit_code))
        ended.set()

    engine.watch(on_exit)
    try:
        ended.wait()
    finally:
        engine.shutdown()
    name, exit_code = outcome[0] if outcome else ("", 0)
    if exit_code == 0:
        logger.info("the %s stopped (node 0 shut down); node %d stops", name, parallel.node_rank)
        return 0
    what = ("the link to node 0 closed without a goodbye (node 0 died)" if exit_code is None
            else f"the {name} process died (exit code {exit_code})")
    logger.error("%s; node %d stops", what, parallel.node_rank)
    return 1
