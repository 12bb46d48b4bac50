"""Offline LLM and scheduling golden tests: greedy tokens are identical (and equal transformers')
with async scheduling on and off, with a tiny and a large token budget, with so few KV blocks
that preemption happens versus plenty, and with every op forced to its torch reference versus
the implementations dispatch picks (`auto`), in fp32 and in bf16."""

from __future__ import annotations

import pytest
import torch

from rapid_llm import LLM, SamplingParams
from tests.e2e.server import wait_gone
from tests.hf_reference import hf_greedy, hf_model
from tests.op_pins import ALL_REFERENCE, BF16_PINNED

NEW_TOKENS = 24
PROMPT_LENGTHS = (5, 13, 29, 40)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def expected(checkpoint, prompts) -> list[list[int]]:
    return hf_greedy(hf_model(checkpoint), prompts, NEW_TOKENS)


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
SCHEDULES = {
    "async-default": {},
    "lock-step": {"disable_async_scheduling": True},
    "tiny-budget-chunked": {"max_num_batched_tokens": 8},
    "preemption": {"num_kv_blocks": 20, "block_size": 4, "max_model_len": 80},
}


@pytest.mark.parametrize(
    "engine_args",
    [
        pytest.param({}, id="async-default"),
        pytest.param({"disable_async_scheduling": True}, id="lock-step"),
        pytest.param({"max_num_batched_tokens": 8}, id="tiny-budget-chunked"),
        pytest.param({"max_num_batched_tokens": 8, "disable_async_scheduling": True}, id="tiny-budget-lock-step"),
        pytest.param({"num_kv_blocks": 20, "block_size": 4, "max_model_len": 80}, id="preemption"),
        pytest.param({**ALL_REFERENCE}, id="reference-ops"),
        pytest.param({**ALL_REFERENCE, "disable_async_scheduling": True}, id="reference-ops-lock-step"),
        pytest.param({**ALL_REFERENCE, "max_num_batched_tokens": 8}, id="reference-ops-chunked"),
    ],
)
def test_greedy_tokens_match_transformers(checkpoint, prompts, expected, engine_args, capfd) -> None:
    args = {"num_kv_blocks": 128, "log_level": "info", **engine_args}
    with LLM(model=str(checkpoint), **args) as llm:
        outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    assert all(o.finish_reason == "length" for o in outputs)
    if "block_size" in engine_args:
        assert "preempt" in capfd.readouterr().err.lower()


def _generate(checkpoint, prompts, engine_args: dict) -> list[list[int]]:
    with LLM(model=str(checkpoint), **{"num_kv_blocks": 128, **engine_args}) as llm:
        return [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_bf16_auto_ops_match_reference_ops(tiny_checkpoint, prompts, schedule: str) -> None:
    """In bf16 dispatch picks other implementations than the references (oneDNN-packed linear, the fused
    C++ ops); with each schedule they must give the reference ops' greedy tokens."""
    checkpoint = tiny_checkpoint(dtype=torch.bfloat16)
    reference = _generate(checkpoint, prompts, {**SCHEDULES[schedule], **ALL_REFERENCE})
    assert _generate(checkpoint, prompts, {**SCHEDULES[schedule], "op_backend": BF16_PINNED}) == reference


def test_llm_generates_text_and_leaves_no_process(checkpoint) -> None:
    llm = LLM(model=str(checkpoint), num_kv_blocks=64)
    pids = [p.pid for p in llm._engine.processes.values()]
    outputs = llm.generate(["Hello there", [5, 6, 7]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(outputs) == 2
    assert all(len(o.token_ids) == 6 and o.finish_reason == "length" and isinstance(o.text, str) for o in outputs)
    assert outputs[0].text == llm.tokenizer.decode(outputs[0].token_ids, skip_special_tokens=True)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["fine", [5] * 600], SamplingParams(max_tokens=4))
    # A token id past the vocabulary is refused by the scheduler; the engine keeps serving.
    rejected, ok = llm.generate([[5, 100_000], [5, 6]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert rejected.finish_reason == "abort" and rejected.token_ids == []
    assert len(ok.token_ids) == 3
    assert llm._engine.is_alive()
    llm.shutdown()
    assert wait_gone(pids) == []
