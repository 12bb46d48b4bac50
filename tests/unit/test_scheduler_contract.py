"""What the scheduler refuses and what it never loads: requests that cannot run, a KV cache that cannot hold
one full-length request, results out of plan order; importing it loads no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rapid_llm.ipc.messages import StepResult
from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import make_config, request


@pytest.mark.parametrize(("prompt", "message"), [([], "at least 1"), ([1] * 64, "fewer than max_model_len")])
def test_add_request_rejects_prompts_that_cannot_run(prompt: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(make_config()).add_request(request("r", prompt))


@pytest.mark.parametrize("prompt", [[1, 600], [-1, 2]])
def test_add_request_rejects_token_ids_outside_the_vocabulary(prompt: list[int]) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 512\)"):
        Scheduler(make_config(vocab_size=512)).add_request(request("r", prompt))


def test_add_request_rejects_max_tokens_below_one() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Scheduler(make_config()).add_request(request("r", [1], max_tokens=0))


def test_add_request_rejects_a_duplicate_id() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add_request(request("r", [1]))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(request("r", [2]))


@pytest.mark.parametrize(("num_kv_blocks", "message"), [(0, "num_kv_blocks"), (15, "fewer than max_model_len")])
def test_config_must_fit_one_full_length_request(num_kv_blocks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(make_config(num_kv_blocks=num_kv_blocks))


def test_results_must_match_the_oldest_plan() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add_request(request("r", [1, 2]))
    with pytest.raises(ValueError, match="no step is in flight"):
        scheduler.process_result(StepResult(0, [0], [5]))
    plan = scheduler.schedule()
    assert plan is not None
    with pytest.raises(ValueError, match="expected step 0"):
        scheduler.process_result(StepResult(1, [0], [5]))
    with pytest.raises(ValueError, match="planned"):
        scheduler.process_result(StepResult(0, [3], [5]))
    with pytest.raises(ValueError, match="differ in length"):
        scheduler.process_result(StepResult(0, [0], [5, 6]))


def test_scheduler_imports_no_torch() -> None:
    code = "import sys, rapid_llm.scheduler_proc.scheduler; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
