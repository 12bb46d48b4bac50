"""Layers that see the batch (layers/step_rows.py): per-request values read per token inside a wrapped module.

The runner-level test wraps one linear layer of a tiny model in a test double that adds each token's column
value to its output, as a LoRA wrapper would add its adapter's delta. Served together (mixed prefill chunks and
decodes in one step, async scheduling), each request must get exactly the tokens it gets when served alone:
a value routed to the wrong rows would change another request's greedy tokens.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rapid_llm.config import CacheConfig, CompilationConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.layers.step_rows import StepRows
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.unit.worker_engine import Engine

SHIFTED_SEED = 7  # the test double's carrier: a request with this seed gets column value 1 (seeds do not change greedy)


def shift_of(params: SamplingParams) -> int:
    return 1 if params.seed == SHIFTED_SEED else 0


def test_columns_follow_slots_to_the_step_tokens() -> None:
    rows = StepRows(max_num_seqs=4, device=torch.device("cpu"))
    assert not rows.active
    rows.add_column("shift", shift_of, default=-1)
    assert rows.active
    rows.start(2, SamplingParams(seed=SHIFTED_SEED))
    rows.start(0, SamplingParams())
    # A step with slot 2 (three tokens) then slot 0 (one token).
    rows.begin_step(torch.tensor([2, 0]), torch.tensor([0, 0, 0, 1]))
    assert rows.values("shift").tolist() == [1, 1, 1, 0]
    rows.release([2])
    rows.begin_step(torch.tensor([2]), torch.tensor([0]))
    assert rows.values("shift").tolist() == [-1]
    with pytest.raises(ValueError, match="exists already"):
        rows.add_column("shift", shift_of)
    with pytest.raises(KeyError, match="no step row column 'other'"):
        rows.values("other")


def test_logit_rows_pick_the_tokens_whose_logits_are_computed() -> None:
    rows = StepRows(max_num_seqs=4, device=torch.device("cpu"))
    rows.add_column("shift", shift_of)
    rows.start(1, SamplingParams(seed=SHIFTED_SEED))
    rows.begin_step(torch.tensor([0, 1]), torch.tensor([0, 0, 1, 1]))
    assert rows.logit_values("shift").tolist() == [0, 0, 1, 1]  # none selected: every token
    rows.select_logit_rows(torch.tensor([1, 3]))  # each sequence's last token
    assert rows.logit_values("shift").tolist() == [0, 1]
    rows.select_logit_rows(slice(1, 3))  # a piece of prompt rows
    assert rows.logit_values("shift").tolist() == [0, 1]
    rows.begin_step(torch.tensor([1]), torch.tensor([0]))  # a new step forgets the selection
    assert rows.logit_values("shift").tolist() == [1]


def test_a_column_is_not_read_outside_a_step() -> None:
    rows = StepRows(max_num_seqs=2, device=torch.device("cpu"))
    rows.add_column("shift", shift_of)
    with pytest.raises(RuntimeError, match="outside a step"):
        rows.values("shift")


class ShiftedLinear(nn.Module):
    """Test double of a batch-aware wrapper: the wrapped layer's output plus each token's column value."""

    def __init__(self, inner: nn.Module, rows: StepRows) -> None:
        super().__init__()
        self.inner, self.rows = inner, rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        return out + self.rows.values("shift").to(out.dtype)[:, None]


@pytest.fixture(scope="module")
def runner(tiny_checkpoint) -> ModelRunner:
    model = ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")))
    # Eager decode steps: the wrapper below comes after the runner is built, and the CPU decode program (like a
    # CUDA graph) runs the modules it found at construction.
    runner = ModelRunner(model, CacheConfig(block_size=4, num_blocks=256), DeviceConfig("cpu"), max_num_seqs=8,
                         compilation=CompilationConfig(enforce_eager=True))
    runner.step_rows.add_column("shift", shift_of)
    attention = runner.model.model.layers[0].self_attn
    attention.o_proj = ShiftedLinear(attention.o_proj, runner.step_rows)
    return runner


def request(request_id: str, prompt: list[int], seed: int | None) -> GenerateRequest:
    return GenerateRequest(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                                              seed=seed))


def serve(runner: ModelRunner, requests: list[GenerateRequest]) -> dict[str, list[int]]:
    # No prefix caching: a prompt's KV depends on its column value here (a LoRA feature keys the cache by it).
    engine = Engine(runner, max_num_batched_tokens=16, enable_prefix_caching=False)
    return {rid: outcome["token_ids"] for rid, outcome in engine.serve(requests).items()}


def test_each_request_reads_its_own_value_in_mixed_steps(runner: ModelRunner) -> None:
    prompts = {"a": list(range(5, 30)), "b": list(range(40, 52)), "c": list(range(60, 91))}
    seeds = {"a": None, "b": SHIFTED_SEED, "c": SHIFTED_SEED}
    together = serve(runner, [request(rid, prompts[rid], seeds[rid]) for rid in prompts])
    for rid in prompts:
        assert together[rid] == serve(runner, [request(rid, prompts[rid], seeds[rid])])[rid], rid
    # The value has an effect, so the check above could fail.
    assert serve(runner, [request("b", prompts["b"], None)])["b"] != together["b"]
