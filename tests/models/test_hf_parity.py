"""Paged-KV model outputs match transformers: prefill logits and 32 greedy tokens, per architecture.

Batches mix sequences of different lengths, prefills are split into chunks while other requests
decode, and block sizes do not divide the prompt lengths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.amx_moe import AMX_MOE, AVX512_MOE
from rapid_llm.ops.avx512_linear import avx512_missing
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.tiny_checkpoint import SUPPORTED_ARCHITECTURES
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import bf16_reference_fault, hf_greedy, hf_logits, hf_model
from tests.models.paged_generation import generate, prefill_logits

PROMPT_LENGTHS = (7, 21, 38)
NEW_TOKENS = 32


def _prompts(vocab_size: int, lengths: tuple[int, ...] = PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def _runner(checkpoint, block_size: int = 16, dtype: str = "auto") -> ModelRunner:
    model_config = ModelConfig.from_pretrained(str(checkpoint), dtype=dtype)
    return ModelRunner(model_config, CacheConfig(block_size=block_size, num_blocks=64), DeviceConfig("cpu"))


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_prefill_logits_match_transformers_float32(tiny_checkpoint, architecture: str) -> None:
    checkpoint = tiny_checkpoint(architecture)
    runner = _runner(checkpoint, block_size=16)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size)
    for ours, prompt in zip(prefill_logits(runner, prompts), prompts):
        assert (ours - hf_logits(hf, prompt)).abs().max().item() <= 1e-3


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_prefill_logits_bfloat16_no_worse_than_transformers(tiny_checkpoint, architecture: str) -> None:
    """bf16 has 8 mantissa bits, so the two engines' different GEMM groupings (merged qkv, batched
    attention) round differently. Our error against the float32 reference must stay within twice
    transformers' own bf16 error against it (plus a 0.05 floor for near-zero cases)."""
    if bf16_reference_fault(architecture):
        pytest.skip(bf16_reference_fault(architecture))
    _assert_bfloat16_no_worse_than_transformers(tiny_checkpoint(architecture, dtype=torch.bfloat16))


@pytest.mark.skipif(amx_missing("cpu", "bfloat16") is not None and avx512_missing("cpu", "bfloat16") is not None,
                    reason=f"cpu_amx: {amx_missing('cpu', 'bfloat16')}; "
                           f"cpu_avx512: {avx512_missing('cpu', 'bfloat16')}")
@pytest.mark.parametrize(("architecture", "widths"), [("Qwen3MoeForCausalLM", {"moe_intermediate_size": 64}),
                                                      ("Qwen2MoeForCausalLM", {"moe_intermediate_size": 64}),
                                                      ("MixtralForCausalLM", {"intermediate_size": 64})])
def test_bfloat16_packed_experts_no_worse_than_transformers(tiny_checkpoint, architecture: str,
                                                            widths: dict[str, int]) -> None:
    """Expert widths that are multiples of 32, so the experts run packed weights: cpu_amx's, or cpu_avx512's
    without AMX (bf16 Qwen routing weights, fp32 Mixtral ones)."""
    runner = _assert_bfloat16_no_worse_than_transformers(tiny_checkpoint(architecture, dtype=torch.bfloat16, **widths))
    selected = AMX_MOE if amx_missing("cpu", "bfloat16") is None else AVX512_MOE
    experts = [module for module in runner.model.modules() if isinstance(module, FusedExperts)]
    assert experts and all(module.kernel is selected and module.w13_weight.dim() == 4 for module in experts)


def _assert_bfloat16_no_worse_than_transformers(checkpoint: Path) -> ModelRunner:
    runner = _runner(checkpoint, block_size=16)
    assert runner.model_config.dtype == torch.bfloat16
    hf_bf16, hf_fp32 = hf_model(checkpoint, torch.bfloat16), hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size)
    for ours, prompt in zip(prefill_logits(runner, prompts), prompts):
        reference = hf_logits(hf_fp32, prompt)
        hf_error = (hf_logits(hf_bf16, prompt) - reference).abs().max().item()
        assert (ours - reference).abs().max().item() <= 2 * hf_error + 0.05
    return runner


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
@pytest.mark.parametrize("block_size,chunk_size", [(16, None), (5, 8)])
def test_greedy_decode_matches_transformers_generate(
    tiny_checkpoint, architecture: str, block_size: int, chunk_size: int | None
) -> None:
    checkpoint = tiny_checkpoint(architecture)
    runner = _runner(checkpoint, block_size=block_size)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    # Staggered arrivals put one request's prefill chunks in the same steps as others' decodes.
    sequences = generate(runner, prompts, params, chunk_size=chunk_size, stagger=3)
    assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)
    assert len({token for s in sequences for token in s.output}) > 5, "degenerate test: outputs barely vary"


# (rope parameters, max_position_embeddings): llama3 configs state the extended length, the others
# the original one, which the factor stretches to 64.
ROPE_VARIANTS = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, 32),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 32),
    "llama3": ({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}, 64),
    "yarn": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}, 32),
}


@pytest.mark.parametrize("rope", sorted(ROPE_VARIANTS))
def test_rope_scaling_variants_match_transformers(tiny_checkpoint, rope: str) -> None:
    """A 30-token prompt + 32 new tokens runs past the original 32-token context, where dynamic
    NTK rescales (unchunked prefill is where it matches HF exactly)."""
    parameters, max_positions = ROPE_VARIANTS[rope]
    checkpoint = tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=max_positions,
                                 rope_parameters={"rope_theta": 10000.0, **parameters})
    runner = _runner(checkpoint)
    assert runner.model_config.max_model_len == 64
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=(11, 30), seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    assert [s.output for s in generate(runner, prompts, params)] == hf_greedy(hf, prompts, NEW_TOKENS)


def test_sliding_window_matches_transformers(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("MistralForCausalLM", sliding_window=8)
    runner = _runner(checkpoint, block_size=4)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=(5, 19), seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    sequences = generate(runner, prompts, params, chunk_size=6, stagger=2)
    assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)


def test_garbage_in_unassigned_cache_memory_never_leaks(tiny_checkpoint) -> None:
    """The cache is allocated uninitialised; blocks are zeroed on assignment (the padding block, the
    last one, at start-up), so even NaN left in memory — read under the mask in a block's
    unwritten tail — cannot reach the outputs."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    runner = _runner(checkpoint, block_size=16)
    for layer in runner.kv_cache.layers:
        layer.kv_cache[:, : runner.padding_block].fill_(float("nan"))
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8)
    assert [s.output for s in generate(runner, prompts, params, stagger=1)] == hf_greedy(hf, prompts, 8)
