"""Worker-memory probe for the spec soak: scheduler + worker in one process (tests/unit/worker_engine.py) on the
demo target, waves of greedy requests of varied prompt and output lengths, with n-gram speculation on or off.

After each wave it prints the process RSS, the live Python object count and the bytes tracemalloc holds
(with --tracemalloc), then RSS again after glibc's malloc_trim(0) (with --trim). RSS that malloc_trim gives
back is freed heap the allocator kept, not live data. Run with MALLOC_ARENA_MAX etc. in the environment to
compare allocator settings.

    PYTHONPATH=$PWD python benchmark-results/soak-mem-20261202/rss_probe.py --spec ngram --waves 20 --trim
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import time
import tracemalloc

import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.unit.worker_engine import Engine


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", choices=["ngram", "off"], default="ngram")
    parser.add_argument("--waves", type=int, default=20)
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = ModelConfig.from_pretrained(model_dir_or_demo("demo-target"), dtype=args.dtype, max_model_len=512)
    runner = ModelRunner(model, CacheConfig(block_size=16, num_blocks=640), DeviceConfig("cpu"),
                         max_num_seqs=args.seqs)
    speculative = (SpeculativeConfig(method="ngram", num_speculative_tokens=3) if args.spec == "ngram" else None)
    engine = Engine(runner, max_num_batched_tokens=512, max_num_seqs=args.seqs, speculative=speculative)
    libc = ctypes.CDLL("libc.so.6")
    rng = random.Random(0)
    motifs = [[rng.randrange(3, model.vocab_size) for _ in range(rng.randrange(3, 12))] for _ in range(64)]
    if args.tracemalloc:
        tracemalloc.start(10)
    baseline = None
    print("wave\tseconds\trss_mib\trss_after_trim_mib\tobjects\ttraced_mib\taccepted/drafts", flush=True)
    for wave in range(args.waves):
        requests = []
        for index in range(args.seqs * 2):
            motif = motifs[rng.randrange(len(motifs))]
            # Repeated motifs with noise: drafts of every length 0..k get proposed and partly accepted.
            prompt = [token if rng.random() > 0.1 else rng.randrange(3, model.vocab_size)
                      for token in motif * rng.randrange(2, 30)][: rng.randrange(8, 300)]
            params = SamplingParams(temperature=0.0, max_tokens=rng.randrange(16, 128), ignore_eos=True)
            requests.append(GenerateRequest(f"w{wave}-{index}", prompt, params))
        start = time.perf_counter()
        engine.serve(requests)
        engine.outcomes.clear()  # the harness's own record of outcomes is not engine state
        seconds = time.perf_counter() - start
        gc.collect()
        rss = rss_mib()
        trimmed = (libc.malloc_trim(0), rss_mib())[1] if args.trim else float("nan")
        traced = tracemalloc.get_traced_memory()[0] / 2**20 if args.tracemalloc else float("nan")
        if args.tracemalloc and wave == 1:
            baseline = tracemalloc.take_snapshot()
        counters = engine.scheduler._speculation.counters if speculative else None
        ratio = f"{counters.num_accepted_tokens}/{counters.num_draft_tokens}" if counters else "-"
        print(f"{wave}\t{seconds:.1f}\t{rss:.1f}\t{trimmed:.1f}\t{len(gc.get_objects())}\t{traced:.2f}\t{ratio}",
              flush=True)
    if baseline is not None:
        for stat in tracemalloc.take_snapshot().compare_to(baseline, "lineno")[:8]:
            print(stat)


if __name__ == "__main__":
    main()
