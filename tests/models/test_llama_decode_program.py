"""The CPU decode program (models/llama_decode_program.py): decode steps through it give exactly the eager
forward's tokens and log-probabilities (`--enforce-eager` turns it off), for the Llama block and its variants
(Qwen2's qkv bias, Qwen3's q/k norms, a MoE MLP called as a module) in bf16 (packed kernels, the gated MLP form)
and fp32; a model it cannot mirror gets none, with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rapid_llm.config import CacheConfig, CompilationConfig, DeviceConfig, ModelConfig
from rapid_llm.models import llama_decode_program
from rapid_llm.models.llama_decode_program import LlamaDecodeProgram, build_decode_program
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.paged_generation import generate

NEW_TOKENS = 10


def _runner(checkpoint: str, dtype: str, enforce_eager: bool) -> ModelRunner:
    return ModelRunner(ModelConfig.from_pretrained(checkpoint, dtype=dtype), CacheConfig(block_size=16, num_blocks=32),
                       DeviceConfig("cpu"), max_num_seqs=4, compilation=CompilationConfig(enforce_eager=enforce_eager))


def _tokens_and_logprobs(runner: ModelRunner) -> list[tuple[list[int], list]]:
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (7, 19, 30)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3)
    return [(s.output, s.logprobs) for s in generate(runner, prompts, params, chunk_size=16, stagger=2)]


@pytest.mark.parametrize("architecture,dtype", [
    ("LlamaForCausalLM", "bfloat16"), ("LlamaForCausalLM", "float32"), ("Qwen2ForCausalLM", "bfloat16"),
    ("Qwen3ForCausalLM", "bfloat16"), ("Qwen3MoeForCausalLM", "bfloat16"),
])
def test_program_gives_the_eager_tokens_and_logprobs(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch,
                                                     architecture: str, dtype: str) -> None:
    checkpoint = str(tiny_checkpoint(architecture))
    eager = _runner(checkpoint, dtype, enforce_eager=True)
    assert eager.decode_model is eager.model
    expected = _tokens_and_logprobs(eager)

    runs = []
    program_call = LlamaDecodeProgram.__call__
    monkeypatch.setattr(LlamaDecodeProgram, "__call__", lambda self, batch: runs.append(1) or program_call(self, batch))
    programmed = _runner(checkpoint, dtype, enforce_eager=False)
    assert isinstance(programmed.decode_model, LlamaDecodeProgram)
    assert _tokens_and_logprobs(programmed) == expected
    assert len(runs) >= NEW_TOKENS - 1  # the decode steps ran through the program


def test_a_model_the_program_cannot_mirror_gets_none_and_why(tiny_checkpoint) -> None:
    runner = _runner(str(tiny_checkpoint("LlamaForCausalLM")), "float32", enforce_eager=True)
    model = runner.model
    program, reason = build_decode_program(model)
    assert program is not None, reason

    handle = model.model.layers[1].register_forward_hook(lambda *args: None)
    try:
        assert build_decode_program(model) == (None, llama_decode_program.HOOKS_REASON)
    finally:
        handle.remove()

    norm = model.model.layers[0].input_layernorm
    model.model.layers[0].input_layernorm = nn.LayerNorm(norm.weight.shape[0])
    try:
        program, reason = build_decode_program(model)
        assert program is None and reason.startswith("layer 0: input_layernorm is a LayerNorm")
    finally:
        model.model.layers[0].input_layernorm = norm
    assert build_decode_program(nn.Linear(2, 2)) == (None, "Linear is not a Llama-block model")
