"""Sampling through the worker's persistent rows, end to end with the scheduler: penalised greedy tokens equal
transformers' (repetition penalty over prompt and output), and seeded sampling with every feature on gives each
request the tokens it gets alone -- with preemption (rows reloaded from prompt + outputs), async scheduling,
lock-step, and the next step launched before the previous one's tokens are read (as on CUDA)."""

from __future__ import annotations

import msgspec
import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_model
from tests.unit.worker_engine import Engine

NEW_TOKENS = 14
LENGTHS = (9, 14, 20, 6)
SCHEDULES = {"async": {"depth": 2}, "async-overlapped": {"depth": 2, "overlap": True}, "lock-step": {"depth": 1}}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


def _runner(checkpoint, num_blocks: int) -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), max_model_len=64)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=num_blocks), DeviceConfig("cpu"), max_num_seqs=4)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(8)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in LENGTHS]


def _serve(runner: ModelRunner, params: list[SamplingParams], schedule: dict[str, object]) -> tuple[list, int]:
    engine = Engine(runner, max_num_batched_tokens=16, max_num_seqs=4)
    requests = [GenerateRequest(f"r{i}", prompt, p) for i, (prompt, p) in enumerate(zip(_prompts(), params))]
    outcomes = engine.serve(requests, **schedule)
    return [outcomes[r.request_id]["token_ids"] for r in requests], engine.scheduler.stats().num_preemptions


@pytest.fixture(scope="module")
def small_runner(checkpoint) -> ModelRunner:
    """20 blocks of 4 tokens: the four requests (up to 34 tokens each) cannot all stay, so some are preempted."""
    return _runner(checkpoint, 20)


@pytest.fixture(scope="module")
def hf_penalised(checkpoint) -> list[list[int]]:
    hf = hf_model(checkpoint)
    expected = []
    with torch.inference_mode():
        for prompt in _prompts():
            generated = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                    min_new_tokens=NEW_TOKENS, repetition_penalty=1.3, pad_token_id=0)
            expected.append(generated[0, len(prompt):].tolist())
    return expected


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_repetition_penalised_greedy_tokens_match_transformers_through_preemption(small_runner, hf_penalised,
                                                                                  schedule) -> None:
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    tokens, preemptions = _serve(small_runner, [params] * len(LENGTHS), schedule)
    assert preemptions > 0
    assert tokens == hf_penalised


MIXED = [
    SamplingParams(temperature=0.9, top_k=20, seed=1, frequency_penalty=0.8, presence_penalty=0.4),
    SamplingParams(temperature=1.1, top_p=0.9, min_p=0.05, seed=2, repetition_penalty=1.2),
    SamplingParams(temperature=0.0, frequency_penalty=1.5),
    SamplingParams(temperature=0.7, seed=4, min_tokens=NEW_TOKENS, stop_token_ids=[3, 4], logprobs=2),
]


PARAMS = [msgspec.structs.replace(p, max_tokens=NEW_TOKENS) for p in MIXED]


@pytest.fixture(scope="module")
def alone(checkpoint) -> list[list[int]]:
    """Each request served by itself, lock-step, in a cache with room to spare."""
    roomy = _runner(checkpoint, 200)
    tokens = []
    for i, (prompt, params) in enumerate(zip(_prompts(), PARAMS)):
        outcome = Engine(roomy, max_num_batched_tokens=16, max_num_seqs=4).serve(
            [GenerateRequest(f"alone{i}", prompt, params)], depth=1)
        tokens.append(outcome[f"alone{i}"]["token_ids"])
    return tokens


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_seeded_penalised_sampling_is_what_each_request_gets_alone(small_runner, alone, schedule) -> None:
    crowded, preemptions = _serve(small_runner, PARAMS, schedule)
    assert preemptions > 0
    assert crowded == alone
