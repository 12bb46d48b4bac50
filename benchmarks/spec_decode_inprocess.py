"""Speculative decoding in one process: scheduler + worker lock-step, methods interleaved, no server.

    python benchmarks/spec_decode_inprocess.py --pairs 3 --methods off,ngram,draft_model --k 3 [--threads 1]

Key design choice: the same scheduler and worker the server runs, driven in a loop without IPC or HTTP
(one plan at a time), so the numbers are the engine's own cost of each method: what the proposer and the
verification add per step against the tokens they save. Workload A of issue 15 (greedy code completion):
each prompt is a held-out CPython file's header and ~`--prompt-chars` characters of lines from its middle
(`tools/demo_model/data/held_out.txt`), on the demo target (draft model: demo-draft). Every method runs
once unmeasured, then `--pairs` rounds in rotating order; each round prints per method the wall time, the
process CPU time (steadier than wall time on a shared machine, with one thread), TPOT (mean over requests
of (last token - first token) / (tokens - 1)), output throughput, steps, acceptance, and the time, CPU and
TPOT ratios against the first method.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402 (after the path set-up)
from transformers import AutoTokenizer  # noqa: E402

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig  # noqa: E402
from rapid_llm.config.scheduler_config import SchedulerConfig  # noqa: E402
from rapid_llm.config.speculative_config import SpeculativeConfig  # noqa: E402
from rapid_llm.ipc.messages import GenerateRequest  # noqa: E402
from rapid_llm.sampling import SamplingParams  # noqa: E402
from rapid_llm.scheduler_proc.scheduler import Scheduler  # noqa: E402
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo  # noqa: E402
from rapid_llm.worker_proc.model_runner import ModelRunner  # noqa: E402
from rapid_llm.worker_proc.worker import Worker  # noqa: E402
from tools.demo_model.data import SEPARATOR, load_held_out  # noqa: E402

BLOCK_SIZE = 16


def code_prompts(count: int, prompt_chars: int) -> list[str]:
    """From the first `count` held-out files of at least 3 x prompt_chars: the file's header and the lines from
    its middle on, about prompt_chars characters (a file's start is often a license or docstring)."""
    prompts = []
    for path, text in sorted(load_held_out().items()):
        if len(text) >= 3 * prompt_chars and len(prompts) < count:
            start = text.index("\n", len(text) // 2 - prompt_chars) + 1
            prompts.append(SEPARATOR.format(path=path) + text[start: text.index("\n", start + prompt_chars) + 1])
    if len(prompts) < count:
        raise ValueError(f"only {len(prompts)} held-out files hold {3 * prompt_chars} characters")
    return prompts


def speculative_config(method: str, k: int, draft: str, extra: dict[str, object]) -> SpeculativeConfig | None:
    if method == "off":
        return None
    return SpeculativeConfig(method=method, num_speculative_tokens=k, **({"model": draft} if method != "ngram" else {}),
                             **extra)


def run(runner: ModelRunner, spec: SpeculativeConfig | None, prompts: list[list[int]], output_len: int,
        tag: str) -> dict[str, float]:
    model = runner.model_config
    scheduler = Scheduler(SchedulerConfig(
        max_model_len=model.max_model_len, block_size=BLOCK_SIZE, max_num_seqs=len(prompts),
        max_num_batched_tokens=sum(map(len, prompts)) + 64, num_kv_blocks=runner.num_blocks,
        eos_token_ids=model.eos_token_ids, vocab_size=model.vocab_size, speculative=spec))
    worker = Worker(runner)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        scheduler.add_request(GenerateRequest(f"{tag}-{index}", prompt, params))
    first, last, counts = {}, {}, {}
    start, cpu_start = time.perf_counter(), time.process_time()
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        if plan is None:
            raise RuntimeError("the scheduler planned nothing while requests are unfinished")
        scheduler.process_result(worker.execute_plan(plan))
        now = time.perf_counter()
        batch = scheduler.take_outputs()
        for update in batch.updates if batch else []:
            if update.token_ids:
                first.setdefault(update.request_id, now)
                last[update.request_id] = now
                counts[update.request_id] = counts.get(update.request_id, 0) + len(update.token_ids)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stats = scheduler.stats()
    tpot = sum((last[r] - first[r]) / (counts[r] - 1) for r in counts) / len(counts)
    acceptance = (stats.spec_decode_num_accepted_tokens / stats.spec_decode_num_draft_tokens
                  if stats.spec_decode_num_draft_tokens else float("nan"))
    return {"time": elapsed, "cpu": cpu, "tpot": tpot, "throughput": sum(counts.values()) / elapsed,
            "steps": stats.num_steps, "acceptance": acceptance}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="demo-target", help="Target checkpoint directory or demo name.")
    parser.add_argument("--draft", default="demo-draft", help="Draft checkpoint for draft_model.")
    parser.add_argument("--methods", default="off,ngram,draft_model", help="Comma-separated; the first is the base.")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens.")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-chars", type=int, default=600)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3, help="Measured rounds.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--spec-extra", default="{}", help='JSON fields for every speculative config, e.g. '
                        '\'{"acceptance_threshold": 0}\'.')
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    if len(methods) < 2 or args.pairs < 1 or args.output_len < 2:
        parser.error("--methods needs two methods or more, --pairs >= 1, --output-len >= 2")
    torch.set_num_threads(args.threads)
    model_dir = model_dir_or_demo(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(text) for text in code_prompts(args.prompts, args.prompt_chars)]
    config = ModelConfig.from_pretrained(model_dir, max_model_len=max(map(len, prompts)) + args.output_len + 64)
    specs = {method: speculative_config(method, args.k, args.draft, json.loads(args.spec_extra)) for method in methods}
    blocks = len(prompts) * (-(-config.max_model_len // BLOCK_SIZE)) + 8
    runners = {method: ModelRunner(config, CacheConfig(block_size=BLOCK_SIZE, num_blocks=blocks),
                                   DeviceConfig("cpu"), max_num_seqs=len(prompts), speculative=spec)
               for method, spec in specs.items()}
    print(f"prompt tokens {[len(p) for p in prompts]}, {args.output_len} tokens each, k={args.k}, "
          f"{args.threads} thread(s)")
    for method in methods:
        run(runners[method], specs[method], prompts, args.output_len, f"warm-{method}")
    for pair in range(args.pairs):
        order = methods[pair % len(methods):] + methods[: pair % len(methods)]
        results = {method: run(runners[method], specs[method], prompts, args.output_len, f"{pair}-{method}")
                   for method in order}
        base = results[methods[0]]
        for method in methods:
            r = results[method]
            print(f"pair {pair} {method:12s} time {r['time']:.3f} s  cpu {r['cpu']:.3f} s  "
                  f"tpot {r['tpot'] * 1000:.2f} ms  {r['throughput']:.0f} tok/s  steps {r['steps']}  "
                  f"acceptance {r['acceptance']:.2f}  time/base {r['time'] / base['time']:.3f}  "
                  f"cpu/base {r['cpu'] / base['cpu']:.3f}  tpot/base {r['tpot'] / base['tpot']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
