"""Multi-node layout: which ports of `--dist-init-addr host:port` carry what, and the checks on the flags.

Every node knows only node 0's address, so every channel that crosses nodes is bound on node 0 and
connected from the others: `port` is torch.distributed's TCP store, `port + 1` the node link (a plain TCP
connection per remote node, whose end tells each side that the other is gone), `port + 2 + rank` the
step-plan channel of each remote rank (the scheduler binds it, the worker connects), and `port + 2 + world`
the results channel when the answering rank is on another node (with pipeline stages it is the last stage's
first rank; the scheduler binds it). Ranks are laid out node-major: node k holds ranks [k * world / nnodes,
(k + 1) * world / nnodes), world = tp x pp, so with as many nodes as stages each node runs one stage.
See docs/parallelism.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.config.parallel_config import ParallelConfig


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError naming --dist-init-addr otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 - 64:
        raise ValueError(f"--dist-init-addr {address!r} must be HOST:PORT (node 0's address, a port below "
                         f"{65535 - 64} with the next ones free)")
    return host, int(port)


def check_node_layout(parallel: ParallelConfig) -> None:
    nnodes, node_rank, world = parallel.nnodes, parallel.node_rank, parallel.world_size
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} must be within 0-{nnodes - 1} for --nnodes {nnodes}")
    if parallel.dist_init_addr is None:
        raise ValueError(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (node 0's address, the same on "
                         "every node)")
    split_address(parallel.dist_init_addr)
    if world % nnodes:
        raise ValueError(f"--nnodes {nnodes} must divide the {world} ranks (--tensor-parallel-size x "
                         "--pipeline-parallel-size; each node runs the same number of ranks)")
    if parallel.data_parallel_size > 1:
        raise ValueError("--data-parallel-size > 1 with --nnodes > 1 is not built: the nodes split one "
                         "replica's tensor-parallel ranks")


def store_init_method(address: str) -> str:
    host, port = split_address(address)
    return f"tcp://{host}:{port}"


def node_link_address(address: str) -> tuple[str, int]:
    host, port = split_address(address)
    return host, port + 1


def plan_channel(address: str, rank: int) -> str:
    """The ZeroMQ address of remote rank `rank`'s step plans."""
    host, port = split_address(address)
    return f"tcp://{host}:{port + 2 + rank}"


def result_channel(address: str, world_size: int) -> str:
    """The ZeroMQ address the answering rank's results reach the scheduler on, when it is on another node."""
    host, port = split_address(address)
    return f"tcp://{host}:{port + 2 + world_size}"
