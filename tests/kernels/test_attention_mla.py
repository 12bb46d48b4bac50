"""The MLA backends (torch_ref, expanded; torch_absorbed) match naive per-sequence MLA over the expanded history.

Each sequence's context is written by a first step through the backend; the second step mixes a decode, a
fresh prefill and chunks after cached tokens over shuffled blocks of 3, and must equal float64 attention
whose keys and values are expanded from every latent (context and new) with kv_b_proj.
"""

from __future__ import annotations

from typing import Sequence

import pytest
import torch

from rapid_llm.ops.attention import MLABackend, MLADims, StepLayout
from rapid_llm.ops.attention.kv_cache_spec import MLALatentSpec
from rapid_llm.ops.attention.mla_absorbed import MLA_ABSORBED_BACKEND
from rapid_llm.ops.attention.mla_torch_ref import MLA_TORCH_REF_BACKEND
from tests.kernels.attention_cases import naive_attention

DIMS = MLADims(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
HEADS, BLOCK_SIZE, SCALE = 3, 3, 0.3
CPU = torch.device("cpu")


def naive_mla(query: torch.Tensor, latents: torch.Tensor, kv_b_weight: torch.Tensor, context_len: int) -> torch.Tensor:
    """query [q, H, qk_head_dim] at positions context_len.., latents [context_len + q, latent_dim]."""
    compressed, rope_key = latents.double().split([DIMS.kv_lora_rank, DIMS.qk_rope_head_dim], dim=-1)
    expanded = (compressed @ kv_b_weight.double().T).view(len(latents), HEADS, -1)
    nope_key, value = expanded.split([DIMS.qk_nope_head_dim, DIMS.v_head_dim], dim=-1)
    keys = torch.cat((nope_key, rope_key[:, None].expand(-1, HEADS, -1)), dim=-1)
    return naive_attention(query, keys, value, context_len, SCALE, None)


def _run(backend: MLABackend, shapes: Sequence[tuple[int, int]], dtype: torch.dtype,
         device: torch.device = CPU) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """shapes: per sequence (context already cached, new tokens). Returns (output, naive, cache), on the CPU."""
    kv_b_weight = torch.randn(HEADS * (DIMS.qk_nope_head_dim + DIMS.v_head_dim), DIMS.kv_lora_rank).to(dtype)

    num_blocks = sum(-(-(c + n) // BLOCK_SIZE) for c, n in shapes) + 3
    cache = MLALatentSpec(dtype, DIMS.kv_lora_rank, DIMS.qk_rope_head_dim).allocate(num_blocks, BLOCK_SIZE, device)
    cache.zero_()
    free = torch.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(-(-(c + n) // BLOCK_SIZE))] for c, n in shapes]
    latents = [torch.randn(c + n, DIMS.latent_dim).to(dtype) for c, n in shapes]
    cached = [i for i, (c, _) in enumerate(shapes) if c]
    if cached:
        prefill = StepLayout([shapes[i][0] for i in cached], [shapes[i][0] for i in cached],
                             [tables[i] for i in cached], BLOCK_SIZE)
        context = torch.cat([latents[i][: shapes[i][0]] for i in cached])
        backend.forward(torch.randn(len(context), HEADS, DIMS.qk_head_dim).to(dtype).to(device), context.to(device),
                        cache, kv_b_weight.to(device), DIMS, backend.build_metadata(prefill, device), SCALE)
    layout = StepLayout([n for _, n in shapes], [c + n for c, n in shapes], tables, BLOCK_SIZE)
    query = torch.randn(layout.num_tokens, HEADS, DIMS.qk_head_dim).to(dtype)
    new = torch.cat([latent[c:] for latent, (c, _) in zip(latents, shapes)])
    output = backend.forward(query.to(device), new.to(device), cache, kv_b_weight.to(device), DIMS,
                             backend.build_metadata(layout, device), SCALE).cpu()
    cache = cache.cpu()
    expected, start = [], 0
    for (context_len, num_new), latent in zip(shapes, latents):
        expected.append(naive_mla(query[start : start + num_new], latent, kv_b_weight, context_len))
        start += num_new
    flat_cache = cache.view(-1, DIMS.latent_dim)
    for table, latent in zip(tables, latents):
        slots = torch.tensor([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(latent))])
        torch.testing.assert_close(flat_cache[slots], latent, rtol=0, atol=0)  # every latent sits in its slot
    return output, torch.cat(expected), cache


BACKENDS = pytest.mark.parametrize("backend", [MLA_TORCH_REF_BACKEND, MLA_ABSORBED_BACKEND],
                                   ids=["torch_ref", "torch_absorbed"])


@BACKENDS
@pytest.mark.parametrize("shapes", [[(9, 1), (0, 7), (5, 4), (12, 1)], [(4, 1), (7, 1)], [(0, 5)]],
                         ids=["mixed", "decodes", "prefill"])
def test_mixed_batch_matches_naive_mla(backend: MLABackend, shapes: list[tuple[int, int]]) -> None:
    torch.manual_seed(0)
    output, expected, _ = _run(backend, shapes, torch.float32)
    assert output.shape == (sum(n for _, n in shapes), HEADS, DIMS.v_head_dim)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


@BACKENDS
def test_bfloat16_stays_close_to_naive_mla(backend: MLABackend) -> None:
    torch.manual_seed(1)
    output, expected, cache = _run(backend, [(9, 1), (0, 7), (5, 4)], torch.bfloat16)
    assert output.dtype == cache.dtype == torch.bfloat16
    torch.testing.assert_close(output.float(), expected, atol=5e-2, rtol=5e-2)
