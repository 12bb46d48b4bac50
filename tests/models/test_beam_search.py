"""Beam search end to end (scheduler + worker in one process) against transformers `generate(num_beams=W)`:
the n returned beams and their scores equal HF's for each early_stopping mode and length penalties of both
signs, with a likely stop token so that beams end at different lengths, with async scheduling on and off, and
every KV block free at the end. Non-beam requests served beside a beam group keep their greedy tokens."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.unit.worker_engine import Engine

PROMPT_LENGTHS = (7, 12)
MAX_TOKENS = 10
WIDTH = 4
CASES = [  # (length_penalty, early_stopping)
    (1.0, False), (1.0, True), (2.0, "never"), (-0.5, False), (0.0, "never"),
]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="module")
def hf(checkpoint):
    return hf_model(checkpoint)


@pytest.fixture(scope="module")
def runner(checkpoint) -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), max_model_len=64)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=96), DeviceConfig("cpu"), max_num_seqs=10)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def stop_tokens(hf) -> list[list[int]]:
    """Per prompt, tokens the model is likely to produce, standing in for EOS (a random model rarely picks its
    EOS): greedy tokens 2-4, so that beams end at different lengths and some searches stop early. With EOS that
    makes HF rank (1 + 4) x 4 = 20 candidates per beam, the most a step returns."""
    return [sorted(set(tokens[2:])) for tokens in hf_greedy(hf, _prompts(), 5)]


def _hf_beams(hf, prompt: list[int], stop: list[int], length_penalty: float, early_stopping: bool | str, n: int):
    eos = [hf.config.eos_token_id, *stop]
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), num_beams=WIDTH, num_return_sequences=n, do_sample=False,
                          max_new_tokens=MAX_TOKENS, length_penalty=length_penalty, early_stopping=early_stopping,
                          eos_token_id=eos, pad_token_id=eos[0], return_dict_in_generate=True, output_scores=True)
    beams = []
    for sequence, score in zip(out.sequences[:, len(prompt):].tolist(), out.sequences_scores.tolist()):
        end = next((i + 1 for i, token in enumerate(sequence) if token in eos), len(sequence))
        beams.append((sequence[:end], score))
    return beams


def _params(stop: list[int], length_penalty: float, early_stopping: bool | str, n: int) -> SamplingParams:
    return SamplingParams(n=n, beam_width=WIDTH, use_beam_search=True, temperature=0.0, max_tokens=MAX_TOKENS,
                          stop_token_ids=stop, length_penalty=length_penalty, early_stopping=early_stopping)


@pytest.mark.parametrize("depth", [2, 1], ids=["async", "lock-step"])
@pytest.mark.parametrize("length_penalty,early_stopping", CASES)
def test_beams_equal_transformers(runner, hf, stop_tokens, depth, length_penalty, early_stopping):
    prompts = _prompts()
    engine = Engine(runner, max_num_batched_tokens=16, max_num_seqs=10)
    requests = [GenerateRequest(f"b{i}", prompt, _params(stop, length_penalty, early_stopping, WIDTH))
                for i, (prompt, stop) in enumerate(zip(prompts, stop_tokens))]
    outcomes = engine.serve(requests, depth=depth)
    for request, prompt, stop in zip(requests, prompts, stop_tokens):
        expected = _hf_beams(hf, prompt, stop, length_penalty, early_stopping, WIDTH)
        beams = outcomes[request.request_id]["beams"]
        assert [beam.token_ids for beam in beams] == [tokens for tokens, _ in expected]
        assert [beam.score for beam in beams] == pytest.approx([score for _, score in expected], abs=1e-4)
        assert outcomes[request.request_id]["token_ids"] == []
    assert engine.scheduler.stats().kv_blocks_used == 0


def test_beam_group_beside_greedy_requests(runner, hf, stop_tokens):
    """A beam group shares steps with plain requests: theirs stay greedy-identical, its beams HF's."""
    prompts = _prompts()
    engine = Engine(runner, max_num_batched_tokens=16, max_num_seqs=10)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = [GenerateRequest("g0", prompts[0], greedy),
                GenerateRequest("beam", prompts[1], _params(stop_tokens[1], 1.0, False, 2)),
                GenerateRequest("g1", prompts[1], greedy)]
    outcomes = engine.serve(requests, depth=2, overlap=True)
    assert [outcomes[name]["token_ids"] for name in ("g0", "g1")] == hf_greedy(hf, prompts, MAX_TOKENS)
    expected = _hf_beams(hf, prompts[1], stop_tokens[1], 1.0, False, 2)
    assert [beam.token_ids for beam in outcomes["beam"]["beams"]] == [tokens for tokens, _ in expected]
    assert engine.scheduler.stats().kv_blocks_used == 0


@pytest.mark.parametrize("depth", [2, 1], ids=["async", "lock-step"])
def test_beams_survive_preemption(checkpoint, hf, stop_tokens, depth):
    """12 blocks of 4 tokens cannot hold a beam group and a greedy request at once: the newer is preempted
    (a group restarts from its prompt), and both still end with transformers' tokens."""
    config = ModelConfig.from_pretrained(str(checkpoint), max_model_len=48)
    small = ModelRunner(config, CacheConfig(block_size=4, num_blocks=12), DeviceConfig("cpu"), max_num_seqs=10)
    prompts = _prompts()
    engine = Engine(small, max_num_batched_tokens=16, max_num_seqs=10)
    greedy = SamplingParams(temperature=0.0, max_tokens=3 * MAX_TOKENS, ignore_eos=True)
    requests = [GenerateRequest("g", prompts[0], greedy),
                GenerateRequest("beam", prompts[1], _params(stop_tokens[1], 1.0, False, WIDTH))]
    outcomes = engine.serve(requests, depth=depth)
    assert engine.scheduler.stats().num_preemptions >= 1
    assert outcomes["g"]["token_ids"] == hf_greedy(hf, prompts[:1], 3 * MAX_TOKENS)[0]
    expected = _hf_beams(hf, prompts[1], stop_tokens[1], 1.0, False, WIDTH)
    assert [beam.token_ids for beam in outcomes["beam"]["beams"]] == [tokens for tokens, _ in expected]
    assert engine.scheduler.stats().kv_blocks_used == 0
