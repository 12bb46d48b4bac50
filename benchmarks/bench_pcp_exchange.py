"""Prefill context parallelism's K/V exchange, timed two ways: one all-gather vs a ring of point-to-point steps.

    python benchmarks/bench_pcp_exchange.py [--ranks 2] [--tokens 1024,8192] [--kv-heads 4 --head-dim 64]

Each of N ranks (CPU processes on gloo, or one GPU each on NCCL with --device cuda) holds 1/N of a step's new
K/V for one layer ([tokens / N, 2, kv_heads, head_dim]) and needs all of them, since every PCP rank stores every
token (distributed/prefill_context.py). all-gather: `all_gather_into_tensor` once. ring: N - 1 steps, each rank
sending the block it last received to the next rank and receiving from the previous one (`batch_isend_irecv`),
the exchange ring attention overlaps with its compute. Both move the same bytes; the table gives the median
milliseconds per layer over --repeats exchanges after --warmup, and ring / all-gather.
Key design choice: the collective alone, without the model, so the choice between the two rests on the exchange.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def all_gather_exchange(share: torch.Tensor, size: int) -> torch.Tensor:
    gathered = share.new_empty((size * share.shape[0], *share.shape[1:]))
    dist.all_gather_into_tensor(gathered, share)
    return gathered


def ring_exchange(share: torch.Tensor, size: int) -> torch.Tensor:
    rank = dist.get_rank()
    blocks = [share.new_empty(share.shape) for _ in range(size)]
    blocks[rank] = share
    for step in range(size - 1):
        outgoing, incoming = (rank - step) % size, (rank - step - 1) % size
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, blocks[outgoing], (rank + 1) % size),
                                           dist.P2POp(dist.irecv, blocks[incoming], (rank - 1) % size)])
        for request in requests:
            request.wait()
    return torch.cat(blocks)


def _worker(rank: int, args: argparse.Namespace, init: str, queue: mp.Queue) -> None:
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init, rank=rank,
                            world_size=args.ranks)
    results = {}
    for tokens in args.tokens:
        share = torch.randn(tokens // args.ranks, 2, args.kv_heads, args.head_dim, device=device).to(args.dtype)
        expected = all_gather_exchange(share, args.ranks)
        if not torch.equal(ring_exchange(share, args.ranks), expected):
            raise RuntimeError("the ring exchange gathered other blocks than the all-gather")
        for name, exchange in (("all_gather", all_gather_exchange), ("ring", ring_exchange)):
            times = []
            for repeat in range(args.warmup + args.repeats):
                dist.barrier()
                start = time.perf_counter()
                exchange(share, args.ranks)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if repeat >= args.warmup:
                    times.append(time.perf_counter() - start)
            results[(tokens, name)] = statistics.median(times) * 1e3
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[tuple[int, str], float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=lambda text: [int(item) for item in text.split(",")],
                        default=[1024, 4096, 8192], help="New tokens of the step, comma-separated.")
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", type=lambda name: getattr(torch, name), default=torch.bfloat16)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if args.ranks < 2:
        parser.error("--ranks must be at least 2")
    queue: mp.Queue = mp.get_context("spawn").Queue()
    with tempfile.TemporaryDirectory() as directory:
        init = f"file://{os.path.join(directory, 'init')}"
        mp.spawn(_worker, args=(args, init, queue), nprocs=args.ranks, join=True)
    results = queue.get()
    print("| new tokens | K/V bytes per layer | all-gather ms | ring ms | ring / all-gather |\n|---|---|---|---|---|")
    element = torch.empty((), dtype=args.dtype).element_size()
    for tokens in args.tokens:
        gather, ring = results[(tokens, "all_gather")], results[(tokens, "ring")]
        size = tokens * 2 * args.kv_heads * args.head_dim * element
        print(f"| {tokens} | {size} | {gather:.3f} | {ring:.3f} | {ring / gather:.2f} |")
    return results


if __name__ == "__main__":
    main()
