"""The data-parallel Router's policies (round_robin, shortest_queue, minimum_tokens, cache_aware), its load
accounting, the approximate prefix index, the summed scheduler stats, and the flags that configure them."""

from __future__ import annotations

import pytest

from rapid_llm.config.parallel_config import ParallelConfig
from rapid_llm.frontend.dp_client import sum_stats
from rapid_llm.frontend.prefix_index import PrefixIndex
from rapid_llm.frontend.router import Router
from rapid_llm.ipc.messages import SchedulerStats
from rapid_llm.server_args import ServerArgs

BLOCK = 4


def prompt(start: int, length: int = 12) -> list[int]:
    return list(range(start, start + length))


def test_round_robin_cycles_whatever_the_load() -> None:
    router = Router(3, "round_robin", BLOCK, 64)
    chosen = [router.route(f"r{i}", prompt(0), 10_000 if i == 0 else 1) for i in range(7)]
    assert chosen == [0, 1, 2, 0, 1, 2, 0]
    assert [load.routed for load in router.loads] == [3, 2, 2]


def test_shortest_queue_picks_fewest_in_flight() -> None:
    router = Router(2, "shortest_queue", BLOCK, 64)
    assert router.route("a", prompt(0), 5) == 0
    assert router.route("b", prompt(0), 5) == 1
    assert router.route("c", prompt(0), 5) == 0  # a tie alternates
    router.finish("a")
    router.finish("c")
    assert router.route("d", prompt(0), 5) == 0  # replica 0 now holds none, replica 1 one
    assert [load.in_flight for load in router.loads] == [1, 1]


def test_minimum_tokens_follows_outstanding_tokens() -> None:
    router = Router(2, "minimum_tokens", BLOCK, 64)
    assert router.route("long", prompt(0, 100), 900) == 0  # 1000 outstanding on replica 0
    assert router.route("s1", prompt(0, 10), 10) == 1
    assert router.route("s2", prompt(0, 10), 10) == 1  # 20 vs 1000 -> 40 after
    assert router.loads[1].outstanding_tokens == 40
    router.progress("long", 970)
    assert router.loads[0].outstanding_tokens == 30
    assert router.route("s3", prompt(0, 10), 10) == 0
    router.finish("long")
    assert router.loads[0].outstanding_tokens == 20 and router.loads[0].in_flight == 1


def test_progress_never_counts_below_zero_and_unknown_ids_are_ignored() -> None:
    router = Router(2, "minimum_tokens", BLOCK, 64)
    router.route("a", prompt(0, 2), 3)
    router.progress("a", 50)
    assert router.loads[0].outstanding_tokens == 0
    router.progress("ghost", 5)
    router.finish("ghost")
    router.finish("a")
    assert router.loads[0].outstanding_tokens == 0 and router.loads[0].in_flight == 0


def test_cache_aware_sends_a_shared_prefix_to_the_replica_that_has_it() -> None:
    router = Router(2, "cache_aware", BLOCK, 64)
    system = prompt(1000, 16)
    assert router.route("a", system + [1, 2, 3, 4], 4) == 0  # nothing cached: least loaded (a tie -> 0)
    assert router.route("b", prompt(5000, 8), 4) == 1  # unrelated prompt, no match: least loaded (24 vs 0)
    # Replica 0 is busier (24 vs 12), but it holds the 4 system blocks: the prefix wins within the threshold.
    assert router.route("c", system + [9, 9, 9, 9], 4) == 0
    assert router.loads[0].cache_routed == 1
    assert router.loads[0].outstanding_tokens > router.loads[1].outstanding_tokens
    assert router.route("d", prompt(5000, 8) + [7], 4) == 1
    assert router.loads[1].cache_routed == 1


def test_cache_aware_falls_back_to_the_least_loaded_when_the_match_is_overloaded() -> None:
    router = Router(2, "cache_aware", BLOCK, 64, balance_tokens=100)
    system = prompt(1000, 16)
    assert router.route("a", system, 500) == 0
    assert router.route("b", system, 4) == 1  # replica 0 is 516 tokens ahead: over the threshold
    assert router.loads[1].cache_routed == 0


def test_cache_aware_prefers_the_longer_match() -> None:
    router = Router(2, "cache_aware", BLOCK, 64)
    short, long = prompt(0, 4), prompt(0, 12)
    router.route("a", short, 1)                      # replica 0 knows block 0
    router.route("b", prompt(500, 4), 1)             # replica 1: unrelated
    router.route("c", long, 1)                       # replica 0 by its 1-block match; now knows 3 blocks
    assert router.route("d", long + [1], 1) == 0


def test_prefix_index_matches_leading_blocks_and_evicts_least_recently_used() -> None:
    index = PrefixIndex(BLOCK, capacity_blocks=3)
    first = index.block_hashes(prompt(0, 10))  # 2 full blocks; the 2-token tail is not hashed
    assert len(first) == 2
    index.insert(first)
    assert index.match(index.block_hashes(prompt(0, 8) + [99] * 4)) == 2
    assert index.match(index.block_hashes([99] * 4 + prompt(4, 4))) == 0  # chained: block 1 alone is no match
    index.insert(index.block_hashes(prompt(100, 8)))  # 4 blocks in a 3-block index: the oldest goes
    assert len(index) == 3
    assert index.match(first) == 0


def test_stats_are_summed_over_replicas() -> None:
    one = SchedulerStats(num_running=1, num_waiting=2, kv_blocks_used=3, kv_blocks_total=10, prefix_cache_hits=4,
                         spec_decode_num_accepted_tokens_per_pos=[1, 2], collective_seconds=0.5)
    two = SchedulerStats(num_running=5, num_waiting=0, kv_blocks_used=1, kv_blocks_total=10,
                         spec_decode_num_accepted_tokens_per_pos=[3], collective_seconds=0.25)
    total = sum_stats([one, None, two])
    assert (total.num_running, total.num_waiting, total.kv_blocks_used, total.kv_blocks_total) == (6, 2, 4, 20)
    assert total.prefix_cache_hits == 4 and total.collective_seconds == 0.75
    assert total.spec_decode_num_accepted_tokens_per_pos == [4, 2]
    assert sum_stats([None, None]) is None


@pytest.mark.parametrize("spelling", ["--data-parallel-size", "--dp", "--dp-size", "-dp"])
def test_dp_flag_spellings(spelling: str) -> None:
    args = ServerArgs.from_cli([spelling, "3", "--load-balance-method", "minimum_tokens"])
    assert (args.data_parallel_size, args.load_balance_method) == (3, "minimum_tokens")


@pytest.mark.parametrize(("fields", "message"), [
    ({"data_parallel_size": 0}, "--data-parallel-size must be at least 1, got 0"),
    ({"load_balance_method": "random"}, "--load-balance-method 'random' must be one of round_robin"),
    ({"nnodes": 2}, "--nnodes 2 needs --dist-init-addr HOST:PORT"),
    ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "h:5000"}, "--node-rank 2 must be within 0-1"),
    ({"nnodes": 2, "tensor_parallel_size": 3, "dist_init_addr": "h:5000"}, "--nnodes 2 must divide"),
    ({"nnodes": 2, "tensor_parallel_size": 2, "dist_init_addr": "h"}, "--dist-init-addr 'h' must be HOST:PORT"),
    ({"nnodes": 2, "tensor_parallel_size": 2, "data_parallel_size": 2, "dist_init_addr": "h:5000"},
     "--data-parallel-size > 1 with --nnodes > 1 is not built"),
    ({"node_rank": 1}, "--nnodes 1 --node-rank 1"),
])
def test_bad_layouts_name_the_flag(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        ParallelConfig(**fields)
    assert message in str(error.value)


def test_node_ranks_and_devices_are_laid_out_node_major() -> None:
    node1 = ParallelConfig(tensor_parallel_size=4, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:29500")
    assert node1.local_ranks == range(2, 4)
    assert [node1.device_index(rank) for rank in node1.local_ranks] == [0, 1]
    replica1 = ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel_rank=1)
    assert [replica1.device_index(rank) for rank in replica1.local_ranks] == [2, 3]
