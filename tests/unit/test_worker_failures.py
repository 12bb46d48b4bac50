"""A request that fails in the worker aborts alone: the step runs on, the next requests get the right tokens.

Scheduler and Worker run in one process over a tiny random checkpoint on the CPU, plans and results
round-tripping through msgpack as they would between processes, two plans in flight (async
scheduling). Every surviving request's greedy tokens must equal those it gets when served alone.
"""

from __future__ import annotations

import pytest

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from rapid_llm.worker_proc.worker import Worker
from tests.unit.worker_engine import Engine

BLOCK_SIZE = 4
SHARED_PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # two full blocks, cached for the requests after the first


@pytest.fixture(scope="module")
def runner(tiny_checkpoint) -> ModelRunner:
    model = ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")))
    return ModelRunner(model, CacheConfig(block_size=BLOCK_SIZE, num_blocks=128), DeviceConfig("cpu"), max_num_seqs=8)


def greedy(request_id: str, prompt: list[int], **params: object) -> GenerateRequest:
    return GenerateRequest(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                                              **params))


def alone(runner: ModelRunner, request: GenerateRequest) -> list[int]:
    return Engine(runner).serve([request])[request.request_id]["token_ids"]


def check_only_the_failing_request_aborts(runner: ModelRunner, failing: GenerateRequest) -> str:
    """Serve `failing` among good requests, then a second wave; returns the failing request's error."""
    first = [greedy("first", SHARED_PROMPT), failing, greedy("third", [20, 21, 22, 23, 24])]
    # The second wave reuses the failing request's prompt: the prefix cache must not hand out its blocks.
    second = [greedy("again", SHARED_PROMPT + [30]), greedy("fresh", [40, 41, 42])]
    engine = Engine(runner)
    outcomes = {**engine.serve(first), **engine.serve(second)}
    failed = outcomes.pop(failing.request_id)
    assert (failed["finish_reason"], failed["kind"], failed["token_ids"]) == ("abort", "internal", [])
    for request in first + second:
        if request is not failing:
            outcome = outcomes[request.request_id]
            assert (outcome["finish_reason"], outcome["error"]) == ("length", None)
            assert outcome["token_ids"] == alone(runner, request), request.request_id
    assert engine.worker.failed_slots == {}, "the failed slot is forgotten once the scheduler releases it"
    return failed["error"]


def test_an_injected_preparation_failure_aborts_only_that_request(runner, monkeypatch) -> None:
    prepare = Worker.add_request

    def add_request(self: Worker, new) -> None:
        if new.request_id == "failing":
            raise RuntimeError("injected failure")
        prepare(self, new)

    monkeypatch.setattr(Worker, "add_request", add_request)
    error = check_only_the_failing_request_aborts(runner, greedy("failing", SHARED_PROMPT))
    assert error == "RuntimeError: injected failure"


def test_a_parameter_the_sampler_cannot_take_aborts_only_that_request(runner, monkeypatch) -> None:
    # The probe that used to end the server, with the scheduler's own check bypassed (a buggy client).
    monkeypatch.setattr("rapid_llm.scheduler_proc.scheduler.check_admissible", lambda *args: None)
    failing = greedy("failing", SHARED_PROMPT, stop_token_ids=[2**64 - 1], min_tokens=2)
    error = check_only_the_failing_request_aborts(runner, failing)
    assert "overflow" in error.lower()
