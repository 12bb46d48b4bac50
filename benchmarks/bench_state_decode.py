"""Does a decode step's state-layer cost stay flat as the context grows? Per context length, one request is prefilled
and then decoded; the state layers' and the attention ops' time per decode step is measured with forward hooks.

    python benchmarks/bench_state_decode.py --architecture Qwen3NextForCausalLM --contexts 256 4096 [--steps 32]

Key design choice: a tiny random checkpoint of the architecture (the project's helper; nothing is downloaded) with
room for the longest context, run by ModelRunner alone (no scheduler or server), single-threaded per the caller's
--threads, so the two costs are the layers' own. Prints one JSON object: per context, the median decode step and the
median time per step spent in state layers (recurrent, short conv) and in attention ops (which read the context).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest

BLOCK_SIZE, PREFILL_CHUNK = 16, 512


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--architecture", default="Qwen3NextForCausalLM")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--steps", type=int, default=32, help="Decode steps timed per context.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    return parser.parse_args(argv)


class LayerClock:
    """Wall time spent in the hooked modules, per kind, since the last `take`."""

    def __init__(self, model: nn.Module) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._started: dict[int, float] = {}
        for module in model.modules():
            kind = "state" if isinstance(module, StateLayer) else "attention" if isinstance(
                module, PagedAttentionLayer) else None
            if kind is not None:
                module.register_forward_pre_hook(lambda m, _: self._started.__setitem__(id(m), time.perf_counter()))
                module.register_forward_hook(lambda m, _i, _o, kind=kind: self._stop(m, kind))

    def _stop(self, module: nn.Module, kind: str) -> None:
        self.spent[kind] += time.perf_counter() - self._started.pop(id(module))

    def take(self) -> dict[str, float]:
        spent, self.spent = dict(self.spent), defaultdict(float)
        return spent


def measure(runner: ModelRunner, clock: LayerClock, context: int, steps: int) -> dict[str, float]:
    vocab = runner.model_config.vocab_size
    prompt = [(7919 * i) % (vocab - 10) + 10 for i in range(context)]
    blocks = list(range(1, 1 + -(-(context + steps + 1) // BLOCK_SIZE)))
    params = SamplingParams(temperature=0.0)
    outputs: list[int] = []
    for start in range(0, context, PREFILL_CHUNK):
        new = min(PREFILL_CHUNK, context - start)
        result = runner.execute([ScheduledRequest("r", 0, prompt, [], start, new, blocks, params)])
    outputs.append(int(result.token_ids[0]))
    step_times, state, attention = [], [], []
    clock.take()
    for _ in range(steps):
        began = time.perf_counter()
        result = runner.execute([ScheduledRequest("r", 0, prompt, outputs, context + len(outputs) - 1, 1, blocks,
                                                  params)])
        step_times.append(time.perf_counter() - began)
        outputs.append(int(result.token_ids[0]))
        spent = clock.take()
        state.append(spent.get("state", 0.0))
        attention.append(spent.get("attention", 0.0))
    return {"context": context, "decode_step_ms": statistics.median(step_times) * 1e3,
            "state_layers_ms": statistics.median(state) * 1e3, "attention_ops_ms": statistics.median(attention) * 1e3}


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    longest = max(args.contexts) + args.steps + 1
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = build_tiny_checkpoint(Path(directory), args.architecture, max_position_embeddings=longest + 16)
        runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint), dtype="float32"),
                             CacheConfig(block_size=BLOCK_SIZE, num_blocks=-(-longest // BLOCK_SIZE) + 2),
                             DeviceConfig("cpu"), max_num_seqs=1)
        clock = LayerClock(runner.model)
        rows = []
        for context in args.contexts:
            runner.release([0])
            rows.append(measure(runner, clock, context, args.steps))
    report = {"architecture": args.architecture, "threads": torch.get_num_threads(), "rows": rows}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
