"""A model with recurrent layers served by the scheduler and the worker in one process (tests/unit/worker_engine.py).

The recurrent test double (tests/models/recurrent_double.py) must give its full-sequence reference's greedy tokens
with chunked prefill (8-token budget), lock-step and async scheduling, preemption (a KV budget too small for every
request at once: a preempted request restarts its state at token 0), and prefix caching on (it finds no hits: a
state group caches nothing per block, and these runners keep no state snapshots). Speculative decoding keeps the
reference tokens (the state after the accepted drafts is restored); beam search is refused at admission.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.models import registry
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.admission import RequestRejected
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.recurrent_double import (ARCHITECTURE, MODEL_CLASS, build_recurrent_double, reference_greedy,
                                           reference_model)
from tests.models.oracle_proposer import register_oracle
from tests.unit.worker_engine import Engine

BLOCK_SIZE, MAX_MODEL_LEN, NEW_TOKENS = 4, 64, 10
LAYOUTS = {"hybrid": (1,), "all-recurrent": (0, 1)}  # which of the two layers are recurrent


@pytest.fixture(autouse=True)
def double_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The double registered in a copy of the model registry, so no other test sees it."""
    monkeypatch.setattr(registry, "_MODELS", copy.deepcopy(registry._MODELS))
    registry.register_model(ARCHITECTURE, MODEL_CLASS)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_recurrent_double(tmp_path_factory.mktemp(name), layers) for name, layers in LAYOUTS.items()}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (23, 30, 9, 17)]
    prompts.append(prompts[1][:16] + prompts[3][:10])  # shares four full blocks with the second prompt
    return prompts


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path], prompts: list[list[int]]) -> dict[str, list[list[int]]]:
    eos = ModelConfig.from_pretrained(str(checkpoints["hybrid"])).eos_token_ids
    return {name: reference_greedy(reference_model(path), prompts, NEW_TOKENS, eos)
            for name, path in checkpoints.items()}


def runner_for(checkpoint: Path, **options: object) -> ModelRunner:
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32", max_model_len=MAX_MODEL_LEN)
    return ModelRunner(model, CacheConfig(block_size=BLOCK_SIZE, num_blocks=128), DeviceConfig("cpu"),
                       max_num_seqs=4, **options)


def serve(engine: Engine, prompts: list[list[int]], depth: int, round_name: str = "r",
          params: SamplingParams | None = None) -> list[list[int]]:
    params = params or SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    requests = [GenerateRequest(f"{round_name}{i}", prompt, params) for i, prompt in enumerate(prompts)]
    outcomes = engine.serve(requests, depth=depth, overlap=depth == 2)
    return [outcomes[request.request_id]["token_ids"] for request in requests]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_chunked_prefill_gives_the_reference_tokens(checkpoints, prompts, references, layout: str, depth: int) -> None:
    runner = runner_for(checkpoints[layout])
    assert runner.cache_groups.num_state_layers == len(LAYOUTS[layout])
    assert [group.op for group in runner.cache_groups.paged] == ([] if layout == "all-recurrent" else ["attention"])
    engine = Engine(runner, max_num_batched_tokens=8, max_num_seqs=4, enable_prefix_caching=False)
    assert serve(engine, prompts, depth) == references[layout]


def test_preempted_requests_restart_their_state_and_give_the_reference_tokens(checkpoints, prompts,
                                                                              references) -> None:
    engine = Engine(runner_for(checkpoints["hybrid"]), max_num_batched_tokens=8, max_num_seqs=4,
                    num_kv_blocks=MAX_MODEL_LEN // BLOCK_SIZE)
    assert serve(engine, prompts, depth=2) == references["hybrid"]
    assert engine.scheduler.stats().num_preemptions > 0, "the requests should not fit the KV budget at once"


def test_prefix_caching_finds_no_hits_for_a_model_with_state(checkpoints, prompts, references) -> None:
    engine = Engine(runner_for(checkpoints["hybrid"]), max_num_batched_tokens=8, max_num_seqs=4)
    assert engine.scheduler.config.recurrent_state
    # The second round repeats every prompt: a model of paged layers only would start from cached blocks.
    assert serve(engine, prompts, depth=2) == references["hybrid"]
    assert serve(engine, prompts, depth=2, round_name="again") == references["hybrid"]
    stats = engine.scheduler.stats()
    assert stats.prefix_cache_queries > 0 and stats.prefix_cache_hits == 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_speculative_decoding_keeps_the_tokens_of_plain_decoding(monkeypatch, checkpoints, prompts, references,
                                                         layout: str) -> None:
    """On/off golden. Drafts two right then one wrong: each verification folds a rejected draft into the state, and
    the state after the accepted ones is restored, so the tokens are those of decoding without drafts (min_tokens
    would block drafting, so EOS is ignored instead)."""
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    plain = Engine(runner_for(checkpoints[layout]), max_num_batched_tokens=8, max_num_seqs=4)
    expected = serve(plain, prompts, depth=2, params=params)
    speculative = register_oracle(monkeypatch, prompts, expected)
    engine = Engine(runner_for(checkpoints[layout], speculative=speculative), max_num_batched_tokens=8,
                    max_num_seqs=4, speculative=speculative)
    assert serve(engine, prompts, depth=2, params=params) == expected
    stats = engine.scheduler.stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_beam_search_is_refused_at_admission(checkpoints, prompts) -> None:
    engine = Engine(runner_for(checkpoints["hybrid"]))
    beams = SamplingParams(n=2, use_beam_search=True, temperature=0.0, max_tokens=4)
    with pytest.raises(RequestRejected, match="beam search is refused.*cannot be forked"):
        engine.scheduler.add_request(GenerateRequest("beams", prompts[0], beams))
