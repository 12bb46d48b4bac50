"""The per-step CPU thread policy on/off: the trained demo model gives the same greedy tokens (and the same
logprobs) whether prompt chunks of 64+ tokens and steps over long contexts run on two threads and the other
decodes on one, or every step on one; chunked prefill and staggered arrivals mix the kinds of step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import DEMO_ROOT
from rapid_llm.worker_proc.cpu_threads import MIN_PARALLEL_STEP_TOKENS, CpuThreadPolicy
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.paged_generation import generate

HELD_OUT = Path(__file__).resolve().parents[2] / "tools" / "demo_model" / "data" / "held_out.txt"
NEW_TOKENS = 16


def _greedy(policy: CpuThreadPolicy) -> tuple[list[list[int]], set[int]]:
    """Greedy tokens and logprobs per prompt, with `policy` applied before each step; the thread counts used."""
    checkpoint = DEMO_ROOT / "target"
    runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint), dtype="bfloat16"),
                         CacheConfig(block_size=16, num_blocks=96), DeviceConfig("cpu"), max_num_seqs=4)
    execute, used = runner.execute, set()

    def execute_with_policy(scheduled):  # type: ignore[no-untyped-def]
        policy.apply(sum(request.num_new_tokens for request in scheduled),
                     sum(request.num_computed_tokens + request.num_new_tokens for request in scheduled))
        used.add(torch.get_num_threads())
        return execute(scheduled)

    runner.execute = execute_with_policy  # type: ignore[method-assign]
    tokens = AutoTokenizer.from_pretrained(str(checkpoint))(HELD_OUT.read_text()[:12000])["input_ids"]
    prompts = [tokens[:300], tokens[500:620], tokens[900:930]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)
    sequences = generate(runner, prompts, params, chunk_size=2 * MIN_PARALLEL_STEP_TOKENS, stagger=2)
    return [s.output + [round(top.logprob, 4) for top in s.logprobs] for s in sequences], used


def test_long_steps_on_two_threads_keep_the_greedy_tokens() -> None:
    previous = torch.get_num_threads()
    try:
        per_step, used = _greedy(CpuThreadPolicy(1, 2))
        one_thread, _ = _greedy(CpuThreadPolicy(1, 1))
    finally:
        torch.set_num_threads(previous)
    assert used == {1, 2}
    assert per_step == one_thread
