"""The same paged-KV parity checks on a CUDA device (skipped without one), with chunked prefill and
mixed lengths: float32 greedy tokens equal transformers'; bfloat16 is held, for every one of the
32 tokens, to the float32-reference error bound of the CPU bf16 test (tests/models/test_hf_parity.py).
The MoE models run the bf16 check a second time with the experts pinned to torch_ref, which tells a
Triton fused_moe fault from one elsewhere when the first check fails."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.tiny_checkpoint import SUPPORTED_ARCHITECTURES
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import bf16_reference_fault, hf_greedy, hf_logits, hf_model
from tests.models.paged_generation import generate, prefill_logits
from tests.op_pins import pinned_backends

NEW_TOKENS = 32
DEVICE = "cuda"


MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM")


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_decode_matches_transformers_on_cuda(tiny_checkpoint, architecture: str, dtype: torch.dtype) -> None:
    checkpoint = tiny_checkpoint(architecture, dtype=dtype)
    if dtype == torch.float32:
        runner, prompts, sequences = _generate(checkpoint)
        hf = hf_model(checkpoint, dtype).to(DEVICE)
        assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)
        return
    if bf16_reference_fault(architecture):
        pytest.skip(bf16_reference_fault(architecture))
    _assert_bf16_within_transformers_error(checkpoint)


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", MOE_ARCHITECTURES)
def test_bf16_with_reference_experts_on_cuda(tiny_checkpoint, architecture: str) -> None:
    with pinned_backends({"fused_moe": "torch_ref"}):
        _assert_bf16_within_transformers_error(tiny_checkpoint(architecture, dtype=torch.bfloat16))


def _generate(checkpoint) -> tuple[ModelRunner, list[list[int]], list]:
    runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint)), CacheConfig(block_size=16, num_blocks=64),
                         DeviceConfig(DEVICE))
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (7, 21, 38)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    return runner, prompts, generate(runner, prompts, params, chunk_size=8, stagger=3)


def _assert_bf16_within_transformers_error(checkpoint) -> None:
    """bf16 kernels round differently from transformers', so where two logits nearly tie the tokens may
    part ways. Over each sequence we generated: our logits stay within twice transformers' own bf16
    error against the float32 reference (+0.05), and each token we picked is then within twice that
    bound of the reference's best (EOS excluded: min_tokens masks it for both)."""
    runner, prompts, sequences = _generate(checkpoint)
    hf, hf_fp32 = hf_model(checkpoint, torch.bfloat16).to(DEVICE), hf_model(checkpoint, torch.float32).to(DEVICE)
    generated = [prompt + sequence.output for prompt, sequence in zip(prompts, sequences)]
    eos = list(runner.model_config.eos_token_ids)
    for ours, token_ids, prompt in zip(prefill_logits(runner, generated), generated, prompts):
        reference = hf_logits(hf_fp32, token_ids)
        bound = 2 * (hf_logits(hf, token_ids) - reference).abs().max().item() + 0.05
        assert (ours - reference).abs().max().item() <= bound
        choices = reference[len(prompt) - 1 : -1].clone()  # the logits each output token was picked from
        choices[:, eos] = float("-inf")
        picked = choices.gather(1, torch.tensor(token_ids[len(prompt) :], device=choices.device)[:, None])[:, 0]
        assert len(picked) == NEW_TOKENS
        assert (choices.max(dim=1).values - picked).max().item() <= 2 * bound
