"""Time one long prefill step by step in-process (scheduler + worker, no HTTP), optionally beside decodes.

Why the chunked-prefill and long-context results in docs/benchmarks.md look as they do: the same engine
objects the server builds (`ServerArgs.engine_config`: its dtype, op backends and thread rule), driven
lock-step, so each step's wall time is the worker's alone. A run admits `--decodes` short requests, steps
until they decode, then admits `--prompts` prompts of `--prompt-len` random tokens at once (a fresh set per
repeat; prefix caching off unless `--prefix-caching on`) and steps until each has its first token. `--profile` adds the op time of those steps
(torch.profiler) split into attention, linear layers and the rest.

    python benchmarks/prefill_step_timing.py --model DIR --prompt-len 1500 --budgets 2048 256 --decodes 0 4
    python benchmarks/prefill_step_timing.py --model DIR --prompt-len 8000 --budgets 2048 --profile --threads 1 2
    python benchmarks/prefill_step_timing.py --model DIR --prompt-len 576 --prompts 8 --prefix-caching on off
    python benchmarks/prefill_step_timing.py --model DIR --prompt-len 8000 --op-backends attention=cpu_paged ""
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

import msgspec
import torch

from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.server_args import ServerArgs
from rapid_llm.worker_proc.cpu_threads import CpuThreadPolicy, cpu_thread_policy
from rapid_llm.worker_proc.host_malloc import keep_freed_activation_pages
from rapid_llm.worker_proc.model_runner import ModelRunner
from rapid_llm.worker_proc.worker import Worker

# Op names (torch.profiler, self time) by category; everything else is "other".
ATTENTION_OPS = ("attention", "sdpa", "paged_attention", "kv_cache_store", "softmax", "bmm", "baddbmm")
LINEAR_OPS = ("linear", "addmm", "aten::mm", "matmul", "onednn", "amx", "gemm")


class LockStep:
    """Scheduler + worker in one process, one step at a time; each step's wall time and prompt tokens."""

    def __init__(self, args: ServerArgs, model_dir: str) -> None:
        config = args.engine_config(model_dir)
        self.op_backends = config.op_backends  # the registry's overrides are global: set again before each run
        self.runner = ModelRunner(config.model, config.cache, config.device, config.op_backends,
                                  max_num_seqs=config.scheduler.max_num_seqs, compilation=config.compilation)
        self.scheduler = Scheduler(msgspec.structs.replace(config.scheduler, num_kv_blocks=self.runner.num_blocks,
                                                           async_scheduling=False))
        self.worker = Worker(self.runner)
        if self.runner.device.type == "cpu":
            keep_freed_activation_pages()  # as the server's worker process does
        self.first_token: set[str] = set()

    def step(self) -> tuple[float, int]:
        """One planned step: (seconds, tokens computed in it)."""
        plan = self.scheduler.schedule()
        if plan is None:
            return 0.0, 0
        started = time.perf_counter()
        result = self.worker.finish(self.worker.launch(plan))
        seconds = time.perf_counter() - started
        self.scheduler.process_result(result)
        batch = self.scheduler.take_outputs()
        for update in batch.updates if batch else []:
            if update.token_ids:
                self.first_token.add(update.request_id)
        return seconds, sum(chunk.num_new_tokens for chunk in plan.scheduled)


def run_once(engine: LockStep, prompt_len: int, prompts: int, decodes: int, seed: int, vocab: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    decode_params = SamplingParams(temperature=0.0, max_tokens=4096, ignore_eos=True)
    decode_ids = [f"decode-{seed}-{i}" for i in range(decodes)]
    for request_id in decode_ids:
        engine.scheduler.add_request(GenerateRequest(
            request_id, torch.randint(10, vocab, (64,), generator=generator).tolist(), decode_params))
    while not all(request_id in engine.first_token for request_id in decode_ids):
        engine.step()
    long_ids = [f"long-{seed}-{i}" for i in range(prompts)]
    for request_id in long_ids:
        engine.scheduler.add_request(GenerateRequest(
            request_id, torch.randint(10, vocab, (prompt_len,), generator=generator).tolist(),
            SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)))
    steps = []
    while not all(request_id in engine.first_token for request_id in long_ids):
        steps.append(engine.step())
    for request_id in decode_ids:
        engine.scheduler.abort_request(request_id)
    while engine.scheduler.has_unfinished_requests():
        engine.step()
    return {"prefill_s": sum(s for s, _ in steps), "steps": [{"ms": round(1000 * s, 2), "tokens": n} for s, n in steps]}


def categorize(profile: torch.profiler.profile) -> dict[str, float]:
    """Self CPU time in ms per category over the profiled steps."""
    totals = {"attention": 0.0, "linear": 0.0, "other": 0.0}
    for event in profile.key_averages():
        name = event.key.lower()
        category = ("attention" if any(key in name for key in ATTENTION_OPS)
                    else "linear" if any(key in name for key in LINEAR_OPS) else "other")
        totals[category] += event.self_cpu_time_total / 1000
    return {key: round(value, 1) for key, value in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-len", type=int, default=1500)
    parser.add_argument("--prompts", type=int, default=1, help="Long prompts admitted together.")
    parser.add_argument("--prefix-caching", nargs="+", choices=["on", "off"], default=["off"])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 256])
    parser.add_argument("--decodes", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[0],
                        help="0: the server's per-step thread rule (worker_proc/cpu_threads.py)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="Also split the last repeat's op time.")
    parser.add_argument("--top-ops", type=int, default=0, help="Print the N ops with the most self time.")
    parser.add_argument("--op-backends", nargs="+", default=[""],
                        help="--op-backend settings to compare, e.g. attention=cpu_paged \"\" (\"\": the defaults)")
    args = parser.parse_args()
    engines = {}
    for budget in args.budgets:
        for caching in args.prefix_caching:
            for op_backend in args.op_backends:
                server_args = ServerArgs(model=args.model, max_num_batched_tokens=budget,
                                         enable_prefix_caching=caching == "on", kv_cache_memory="1GiB",
                                         max_model_len=args.prompt_len + 64, log_level="warning",
                                         op_backend=op_backend or None)
                engines[budget, caching, op_backend] = LockStep(server_args, args.model)
    vocab = next(iter(engines.values())).runner.model_config.vocab_size
    available = torch.get_num_threads()
    seed = 0
    # Interleaved: every (threads, decodes, budget, caching) once per repeat, so load drifts hit all alike.
    for repeat in range(args.repeats):
        for threads in args.threads:
            for decodes in args.decodes:
                for (budget, caching, op_backend), engine in engines.items():
                    policy = (CpuThreadPolicy(threads, threads) if threads
                              else cpu_thread_policy(engine.runner.model, available)[0])
                    engine.worker.thread_policy = policy
                    REGISTRY.set_overrides(engine.op_backends)
                    seed += 1
                    profiling = args.profile and repeat == args.repeats - 1
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiling \
                            else contextlib.nullcontext() as profile:
                        result = run_once(engine, args.prompt_len, args.prompts, decodes, seed, vocab)
                    record = {"repeat": repeat, "threads": threads or "server rule",
                              "threads_short_steps": policy.short_step_threads,
                              "threads_long_steps": policy.long_step_threads, "decodes": decodes, "budget": budget,
                              "prefix_caching": caching, "op_backend": op_backend or "defaults",
                              "prefill_ms": round(1000 * result["prefill_s"], 1), "steps": result["steps"]}
                    if profiling:
                        record["op_ms"] = categorize(profile)
                        if args.top_ops:
                            print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top_ops))
                    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
