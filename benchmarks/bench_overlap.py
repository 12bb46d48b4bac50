"""Two-batch overlap and AFD on a simulated network: step time and exposed communication, overlap off and on.

    sudo python benchmarks/bench_overlap.py --links 10gbit:0.1 1gbit:1 [--model DIR] [--layout ep-a2a ep tp afd] \
        [--prefill 256 1024 2048] [--decode 16 64] [--trace] --out benchmark-results/tbo

Two ranks, each in a network namespace behind a shaped link (benchmarks/common/sim_network.py): `--tp 2` (ep, ep-a2a
add `--enable-expert-parallel`, ep-a2a pins the all-to-all dispatcher) or afd (one attention rank, one FFN rank).
Each builds the worker's ModelRunner from `ServerArgs` and replays fully described steps, overlap off then on with
every step split: prefills of N tokens (four prompts) and decodes of B requests at 64 tokens of context. Per step:
median wall time, exposed communication (the collective timer: all of it off, issue plus wait on; under afd the wait
for the FFN rank, its compute included) and tokens/s per rank, over --repeats after a warm-up; one more step runs under
the timeline (rapid_llm/distributed/timeline.py), split into compute, exposed communication per collective and idle
(`--trace`: Chrome traces). Without --model: a random Qwen3-MoE (hidden 512, 8 experts top-2, 4 layers).
Key design choice: steps replayed in-process, not served: the step is what the overlap changes, timed without the
scheduler's and the HTTP path's noise on two shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.sim_network import Link, SimulatedNetwork, delay_collectives  # noqa: E402

DECODE_CONTEXT = 64
# ep-a2a: expert parallelism with the all-to-all dispatcher, not the default replicated-routing one.
LAYOUT_PINS = {"ep-a2a": "expert_all_to_all=torch_ref"}
BENCH_MODEL = {"hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 8,
               "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 4096}


def _requests(shape: str, size: int, block_size: int) -> tuple[list[Any], list[Any]]:
    """(setup steps, the timed step) of a shape: 'prefill' of `size` tokens or 'decode' of `size` requests."""
    from rapid_llm.worker_proc.model_runner import ScheduledRequest

    prompts = 4 if shape == "prefill" else size
    length = size // 4 if shape == "prefill" else DECODE_CONTEXT
    blocks_each = -(-length // block_size)
    requests = []
    for index in range(prompts):
        tokens = [(7 * index + 13 * position) % 2000 + 10 for position in range(length)]
        table = list(range(index * blocks_each, (index + 1) * blocks_each))
        requests.append(ScheduledRequest(f"{shape}-{index}", index, tokens, (), 0, length, table))
    if shape == "prefill":
        return [], requests
    setup = [ScheduledRequest(r.request_id, r.slot, r.prompt_token_ids, (), 0, length - 1, r.block_table)
             for r in requests]
    timed = [ScheduledRequest(r.request_id, r.slot, r.prompt_token_ids, (), length - 1, 1, r.block_table)
             for r in requests]
    return setup, timed


def breakdown(spans: list[Any], wall: float) -> dict[str, float]:
    """Milliseconds of one traced step: exposed communication per collective (issue + wait), compute (micro-batch
    turns, or the whole step without them, less the exposed parts) and idle (the step outside every turn: baton
    hand-overs)."""
    exposed: dict[str, float] = {}
    for item in spans:
        if item.kind in ("issue", "wait"):
            exposed[item.name] = exposed.get(item.name, 0.0) + 1000 * (item.end - item.start)
    turns = [item for item in spans if item.kind == "turn"]
    busy = 1000 * (sum(item.end - item.start for item in turns) if turns else wall)
    return {"wall": 1000 * wall, "compute": busy - sum(exposed.values()), "idle": 1000 * wall - busy,
            **{f"exposed {name}": value for name, value in sorted(exposed.items())}}


def _layout_args(layout: str) -> dict[str, Any]:
    """ServerArgs fields of a layout: two ranks either way (afd: one attention rank and one FFN rank)."""
    if layout == "afd":
        return {"afd_config": {"num_ffn_ranks": 1}}
    return {"tensor_parallel_size": 2, "enable_expert_parallel": layout != "tp"}


def run_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from rapid_llm.distributed.collective_timer import collective_totals
    from rapid_llm.distributed.expert_parallel import ExpertParallelLayout, building_expert_parallel
    from rapid_llm.distributed.ffn_exchange import ATTENTION, STOP, announce_step, building_afd
    from rapid_llm.distributed.parallel_state import get_tp_group
    from rapid_llm.distributed.process_group import init_worker_group
    from rapid_llm.distributed.timeline import chrome_trace, start_timeline, stop_timeline
    from rapid_llm.server_args import ServerArgs
    from rapid_llm.worker_proc.ffn_worker import load_ffn_blocks, serve
    from rapid_llm.worker_proc.model_runner import ModelRunner

    delay_collectives()
    torch.set_num_threads(1)  # two ranks on two cores
    shapes = [("prefill", n) for n in args.prefill] + [("decode", n) for n in args.decode]
    blocks = max(4 * -(-max(args.prefill, default=0) // 64), max(args.decode, default=0) * 4) + 8
    overlap = {"enable_two_batch_overlap": True, "dbo_decode_token_threshold": 2, "dbo_prefill_token_threshold": 2}
    pins = [pin for pin in (args.op_backend, LAYOUT_PINS.get(args.layout)) if pin]
    server_args = ServerArgs(model=args.model, num_kv_blocks=blocks, max_num_seqs=max([4, *args.decode]),
                             op_backend=",".join(pins) or None, **_layout_args(args.layout),
                             **(overlap if args.overlap == "on" else {}))
    config = server_args.engine_config(args.model)
    parallel = config.parallel
    init_worker_group(args.rank, parallel.world_size, args.init, "cpu", ffn_ranks=parallel.afd_ffn_ranks)
    if args.rank >= parallel.world_size:
        serve(config, load_ffn_blocks(config))
        dist.destroy_process_group()
        return
    layout = ExpertParallelLayout() if parallel.enable_expert_parallel and not parallel.afd_ffn_ranks else None
    with building_expert_parallel(layout), building_afd(ATTENTION if parallel.afd_ffn_ranks else None):
        runner = ModelRunner(config.model, config.cache, config.device, config.op_backends,
                             max_num_seqs=config.scheduler.max_num_seqs, compilation=config.compilation)
    results = {}
    for shape, size in shapes:
        setup, step = _requests(shape, size, config.cache.block_size)
        if setup:
            runner.forward(setup)
        runner.forward(step)  # warm-up
        seconds, exposed = [], []
        for _ in range(args.repeats):
            dist.barrier(group=get_tp_group())
            comm, started = collective_totals()[0], time.perf_counter()
            runner.forward(step)
            seconds.append(time.perf_counter() - started)
            exposed.append(collective_totals()[0] - comm)
        dist.barrier(group=get_tp_group())
        start_timeline()
        started = time.perf_counter()
        runner.forward(step)
        wall, spans = time.perf_counter() - started, stop_timeline()
        if args.trace_dir and args.rank == 0:
            chrome_trace(spans, f"{args.trace_dir}/{args.layout}-{shape}{size}-{args.overlap}.json")
        tokens = sum(request.num_new_tokens for request in step)
        results[f"{shape} {size}"] = {"step_ms": 1000 * statistics.median(seconds),
                                      "exposed_comm_ms": 1000 * statistics.median(exposed),
                                      "tokens_per_s_per_rank": tokens / statistics.median(seconds) / 2,
                                      "traced_step": breakdown(spans, wall)}
    if parallel.afd_ffn_ranks:
        announce_step([STOP], runner.device)
    if args.rank == 0:
        Path(args.result).write_text(json.dumps(results))
    dist.destroy_process_group()


def _run_pair(args: argparse.Namespace, net: SimulatedNetwork, layout: str, overlap: str, workdir: Path
              ) -> dict[str, Any]:
    result = workdir / f"{layout}-{overlap}.json"
    # A fresh file per pair: a FileStore left by an earlier pair would hand out its stale addresses.
    init = f"file://{workdir}/rendezvous-{net.link.rate}-{net.link.delay_ms:g}-{layout}-{overlap}"
    processes = []
    for rank in range(2):
        argv = [sys.executable, __file__, "--rank", str(rank), "--init", init, "--model", args.model,
                "--layout", layout, "--overlap", overlap, "--op-backend", args.op_backend or "",
                "--result", str(result), "--repeats", str(args.repeats),
                "--prefill", *map(str, args.prefill), "--decode", *map(str, args.decode)]
        if args.trace:
            trace_dir = Path(args.out).resolve() / f"trace-{net.link.rate}-{net.link.delay_ms:g}ms"
            trace_dir.mkdir(exist_ok=True)
            argv += ["--trace-dir", str(trace_dir)]
        processes.append(subprocess.Popen(net.command(rank, argv), env={**os.environ, **net.environment()}))
    deadline = time.monotonic() + args.timeout
    for process in processes:
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise RuntimeError(f"{layout} overlap {overlap}: the ranks ran past --timeout {args.timeout} s")
    if any(process.returncode for process in processes):
        raise RuntimeError(f"{layout} overlap {overlap}: a rank failed ({[p.returncode for p in processes]})")
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", nargs="+", default=["10gbit:0.1", "1gbit:1"], help="rate:one-way delay ms")
    parser.add_argument("--model", help="checkpoint directory (default: a random Qwen3-MoE, BENCH_MODEL)")
    parser.add_argument("--layout", nargs="+", default=["ep-a2a", "ep", "tp", "afd"],
                        choices=["ep-a2a", "ep", "tp", "afd"])
    parser.add_argument("--prefill", nargs="*", type=int, default=[256, 1024, 2048])
    parser.add_argument("--decode", nargs="*", type=int, default=[16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one pair of ranks may run")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--op-backend", help="the server's --op-backend, e.g. expert_all_to_all=torch_ref")
    parser.add_argument("--out", default="benchmark-results/tbo")
    # A rank's own arguments (the driver passes them).
    for flag in ("--rank", "--init", "--overlap", "--result", "--trace-dir"):
        parser.add_argument(flag, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        args.rank, args.layout = int(args.rank), args.layout[0]
        run_rank(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        if args.model is None:
            from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint

            args.model = str(build_tiny_checkpoint(workdir / "model", "Qwen3MoeForCausalLM", **BENCH_MODEL))
        os.chmod(scratch, 0o755)
        report: dict[str, Any] = {}
        for text in args.links:
            link = Link.parse(text)
            with SimulatedNetwork(2, link) as net:
                for layout in args.layout:
                    off, on = (_run_pair(args, net, layout, mode, workdir) for mode in ("off", "on"))
                    report[f"{link} {layout}"] = {"netem": net.netem, "off": off, "on": on}
                    for step in off:
                        print(f"{str(link):16} {layout}  {step:13}  step {off[step]['step_ms']:8.1f} -> "
                              f"{on[step]['step_ms']:8.1f} ms ({off[step]['step_ms'] / on[step]['step_ms']:.2f}x)  "
                              f"exposed comm {off[step]['exposed_comm_ms']:7.1f} -> {on[step]['exposed_comm_ms']:7.1f}"
                              " ms", flush=True)
                        for mode, result in (("off", off), ("on", on)):
                            traced = ", ".join(f"{key} {value:.1f}"
                                               for key, value in result[step]["traced_step"].items())
                            print(f"    traced step, overlap {mode}: {traced}", flush=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
