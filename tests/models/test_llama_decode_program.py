"""The CPU decode program (models/llama_decode_program.py): decode steps through it give exactly the eager
forward's tokens and log-probabilities (`--enforce-eager` turns it off), for the Llama block and its variants
(Qwen2's qkv bias, Qwen3's q/k norms, Mistral's sliding window, a MoE MLP called as a module) in bf16 (packed
kernels, the gated MLP form) and fp32, with its layer loop in C++ (models/llama_decode_native.py) where the CPU
has the packed linears and in Python; a model it cannot mirror gets none, with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rapid_llm.config import CacheConfig, CompilationConfig, DeviceConfig, ModelConfig
from rapid_llm.models import llama_decode_program
from rapid_llm.models.llama_decode_native import NativeDecodeLayers
from rapid_llm.models.llama_decode_program import LlamaDecodeProgram, build_decode_program
from rapid_llm.ops.registry import REGISTRY
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


def _packed_linears_here() -> bool:
    return REGISTRY.select("linear", torch.device("cpu"), torch.bfloat16).backend in ("cpu_amx", "cpu_avx512")


@pytest.mark.parametrize("architecture,dtype,overrides", [
    ("LlamaForCausalLM", "bfloat16", {}), ("LlamaForCausalLM", "float32", {}), ("Qwen2ForCausalLM", "bfloat16", {}),
    ("Qwen3ForCausalLM", "bfloat16", {}), ("MistralForCausalLM", "bfloat16", {"sliding_window": 12}),
    ("Qwen3MoeForCausalLM", "bfloat16", {}),
])
@pytest.mark.parametrize("native", [True, False], ids=["cpp-loop", "python-loop"])
def test_program_gives_the_eager_tokens_and_logprobs(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch,
                                                     architecture: str, dtype: str, overrides: dict,
                                                     native: bool) -> None:
    checkpoint = str(tiny_checkpoint(architecture, **overrides))
    eager = _runner(checkpoint, dtype, enforce_eager=True)
    assert eager.decode_model is eager.model
    expected = _tokens_and_logprobs(eager)

    runs, native_runs = [], []
    program_call, native_call = LlamaDecodeProgram.__call__, NativeDecodeLayers.__call__
    monkeypatch.setattr(LlamaDecodeProgram, "__call__", lambda self, batch: runs.append(1) or program_call(self, batch))
    monkeypatch.setattr(NativeDecodeLayers, "__call__", lambda self, *args: native_runs.append(1) or native_call(self, *args))
    monkeypatch.setattr(llama_decode_program, "build_native_layers", _with_native(native))
    programmed = _runner(checkpoint, dtype, enforce_eager=False)
    program = programmed.decode_model
    assert isinstance(program, LlamaDecodeProgram)
    mirrored = native and dtype == "bfloat16" and "Moe" not in architecture and _packed_linears_here()
    assert (program.native is not None) == mirrored, program.native_reason
    assert _tokens_and_logprobs(programmed) == expected
    assert len(runs) >= NEW_TOKENS - 1  # the decode steps ran through the program
    assert len(native_runs) == (len(runs) if mirrored else 0)


def _with_native(native: bool):
    """build_native_layers as it is, or one that refuses every model (the Python loop)."""
    build = llama_decode_program.build_native_layers
    return build if native else lambda *args: (None, "layers in Python: turned off by the test")


def test_the_cpp_loop_says_why_it_does_not_take_a_model(tiny_checkpoint) -> None:
    cases = [("LlamaForCausalLM", "float32", "layers in Python: the weights are not bf16"),
             ("Qwen3MoeForCausalLM", "bfloat16", "layers in Python: an MLP is not the plain gated MLP")]
    for architecture, dtype, reason in cases:
        model = _runner(str(tiny_checkpoint(architecture)), dtype, enforce_eager=True).model
        program, why = build_decode_program(model)
        assert program is not None and program.native is None and program.native_reason == reason
        assert why.endswith(reason)
    model = _runner(str(tiny_checkpoint("LlamaForCausalLM")), "bfloat16", enforce_eager=True).model
    program, why = build_decode_program(model, native=False)
    assert program.native is None and why.endswith("layers in Python: the C++ loop is off")


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
