"""The worker-side proposer seam (spec_decode/model_proposer.py): a mock ModelProposer is one class and one
registration; the runner hands it the target's hidden states of the layers it declares (equal to transformers'
hidden states and logits), the step's chunks and its drafting rows; its drafts are verified losslessly."""

from __future__ import annotations

import numpy as np
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.spec_decode.model_proposer import FINAL_LAYER, Drafts, ModelProposer, ProposerStep
from rapid_llm.spec_decode.registry import register_model_proposer, runs_in_worker
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_model
from tests.unit.worker_engine import Engine

PROMPTS = [[5, 9, 17, 33, 5, 9, 17], [40, 41, 42, 43, 44]]


class RepeatLast(ModelProposer):
    """Drafts the row's last token again; keeps every step it was handed."""

    hidden_state_layers = (0, FINAL_LAYER)
    steps: list[ProposerStep] = []

    def propose(self, step: ProposerStep) -> Drafts:
        RepeatLast.steps.append(step)
        slots, last = torch.from_numpy(step.slots[step.draft_rows]), torch.from_numpy(step.num_tokens - 1)
        width = int(step.max_drafts.max(initial=0))
        tokens = step.token_pool[slots, last].long().unsqueeze(1).repeat(1, width)
        tokens[torch.arange(width) >= torch.from_numpy(step.max_drafts).unsqueeze(1)] = -1
        return Drafts(tokens, None, np.zeros(step.draft_rows.size, dtype=bool))


register_model_proposer("test-repeat-last", RepeatLast)


def _serve(runner: ModelRunner, speculative: SpeculativeConfig | None, params: SamplingParams) -> list[list[int]]:
    engine = Engine(runner, speculative=speculative)
    requests = [GenerateRequest(f"r{i}", prompt, params) for i, prompt in enumerate(PROMPTS)]
    outcomes = engine.serve(requests, depth=2)
    assert engine.scheduler.stats().kv_blocks_used == 0
    return [outcome["token_ids"] for outcome in outcomes.values()]


def test_a_worker_proposer_gets_hidden_states_and_its_drafts_are_verified(tiny_checkpoint) -> None:
    checkpoint = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = SpeculativeConfig(method="test-repeat-last", num_speculative_tokens=2)
    assert runs_in_worker("test-repeat-last") and not runs_in_worker("ngram")
    config = ModelConfig.from_pretrained(checkpoint, dtype="float32", max_model_len=64)
    cache = CacheConfig(block_size=4, num_blocks=64)
    runner = ModelRunner(config, cache, DeviceConfig("cpu"), max_num_seqs=4, speculative=speculative)
    plain = ModelRunner(config, cache, DeviceConfig("cpu"), max_num_seqs=4)
    RepeatLast.steps = []
    for params in (SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                   SamplingParams(temperature=0.9, seed=4, max_tokens=12, ignore_eos=True)):
        assert _serve(runner, speculative, params) == _serve(plain, None, params)

    first = RepeatLast.steps[0]  # both prompts, whole
    assert first.query_lens.tolist() == [len(prompt) for prompt in PROMPTS]
    assert first.draft_rows.tolist() == [0, 1] and first.num_tokens.tolist() == [len(p) + 1 for p in PROMPTS]
    reference = hf_model(checkpoint)
    with torch.inference_mode():
        out = reference(torch.tensor([PROMPTS[0]]), output_hidden_states=True)
    rows = slice(0, len(PROMPTS[0]))
    torch.testing.assert_close(first.hidden_states[0][rows], out.hidden_states[1][0], rtol=1e-4, atol=1e-4)
    logits = runner.model.compute_logits(first.hidden_states[FINAL_LAYER][rows])
    torch.testing.assert_close(logits, out.logits[0], rtol=1e-4, atol=1e-4)
    assert any(step.max_drafts.size and step.max_drafts.max() == 2 for step in RepeatLast.steps)
