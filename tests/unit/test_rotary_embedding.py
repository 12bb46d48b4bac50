"""RotaryEmbedding against transformers' own rope code (modeling_rope_utils + Llama's rotary module)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from rapid_llm.layers.rotary_embedding import RotaryEmbedding, get_rope

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, MAX_POS = 4, 2, 32, 64

ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    # original length 32 puts frequencies in all three llama3 bands (scaled, smoothed, untouched).
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
        "rope_theta": 500000.0,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e6},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
    },
    "yarn_attention_factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "attention_factor": 1.25,
    },
}


def make_config(rope_parameters: dict, max_pos: int = MAX_POS) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=NUM_HEADS * HEAD_DIM,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=max_pos,
        rope_parameters=dict(rope_parameters),
    )


def random_qk(num_tokens: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, NUM_HEADS * HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(num_tokens, NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype)
    return q, k


def rotate_at(
    rope: RotaryEmbedding, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
    seq_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's path: cos/sin for the batch's positions, then the rotation of q and k."""
    return rope.rotate(q, k, *rope.cos_sin(positions, seq_lens, q.dtype))


def hf_rotate(
    config: transformers.LlamaConfig, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence through a fresh HF rotary module (fresh: HF's dynamic rope is stateful)."""
    hf_rope = LlamaRotaryEmbedding(config)
    cos, sin = hf_rope(q, positions[None])
    q4, k4 = q.view(1, len(positions), -1, HEAD_DIM), k.view(1, len(positions), -1, HEAD_DIM)
    q_out, k_out = apply_rotary_pos_emb(q4, k4, cos, sin, unsqueeze_dim=2)
    return q_out.reshape(q.shape), k_out.reshape(k.shape)


@pytest.mark.parametrize("case", ROPE_CASES)
def test_inv_freq_and_attention_factor_match_hf(case: str) -> None:
    config = make_config(ROPE_CASES[case])
    rope = get_rope(config, HEAD_DIM)
    rope_type = ROPE_CASES[case]["rope_type"]
    if rope_type == "default":
        hf_inv_freq, hf_scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        hf_inv_freq, hf_scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    torch.testing.assert_close(rope.inv_freq, hf_inv_freq, rtol=1e-6, atol=0)
    assert rope.attention_scaling == pytest.approx(hf_scaling, rel=1e-12)
    assert rope.rope_type == rope_type and rope.rotary_dim == HEAD_DIM


def test_max_positions() -> None:
    assert get_rope(make_config(ROPE_CASES["default"]), HEAD_DIM).max_positions == MAX_POS
    assert get_rope(make_config(ROPE_CASES["linear"]), HEAD_DIM).max_positions == 2 * MAX_POS
    assert get_rope(make_config(ROPE_CASES["dynamic"]), HEAD_DIM).max_positions == 2 * MAX_POS
    assert get_rope(make_config(ROPE_CASES["llama3"]), HEAD_DIM).max_positions == MAX_POS
    assert get_rope(make_config(ROPE_CASES["yarn"]), HEAD_DIM).max_positions == 4 * 64


# bfloat16 is compared exactly: cos/sin come from the same float32 ops as HF, are rounded to bf16 once,
# and the rotation runs the same bf16 multiplies/adds in the same order, so every rounding step agrees.
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 0.0)])
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rotation_matches_hf(case: str, dtype: torch.dtype, atol: float) -> None:
    config = make_config(ROPE_CASES[case])
    rope = get_rope(config, HEAD_DIM)
    # Dynamic stays within the original length here (HF's whole-call rescaling is tested separately).
    high = MAX_POS if case == "dynamic" else rope.max_positions
    positions = torch.randint(0, high, (40,), generator=torch.Generator().manual_seed(1))
    q, k = random_qk(40, dtype)
    q_out, k_out = rotate_at(rope, positions, q, k)
    q_ref, k_ref = hf_rotate(config, positions, q, k)
    assert q_out.dtype == dtype and k_out.dtype == dtype
    assert q_out.shape == q.shape and k_out.shape == k.shape
    torch.testing.assert_close(q_out, q_ref, atol=atol, rtol=0)
    torch.testing.assert_close(k_out, k_ref, atol=atol, rtol=0)


def test_three_dim_inputs_keep_shape() -> None:
    rope = get_rope(make_config(ROPE_CASES["llama3"]), HEAD_DIM)
    positions = torch.arange(10)
    q, k = random_qk(10, torch.float32)
    q_flat, k_flat = rotate_at(rope, positions, q, k)
    q_3d, k_3d = rotate_at(rope, positions, q.view(10, NUM_HEADS, HEAD_DIM), k.view(10, NUM_KV_HEADS, HEAD_DIM))
    assert q_3d.shape == (10, NUM_HEADS, HEAD_DIM) and k_3d.shape == (10, NUM_KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(q_3d.reshape(q.shape), q_flat, atol=0, rtol=0)
    torch.testing.assert_close(k_3d.reshape(k.shape), k_flat, atol=0, rtol=0)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 0.0)])
def test_dynamic_single_long_sequence_matches_hf(dtype: torch.dtype, atol: float) -> None:
    config = make_config(ROPE_CASES["dynamic"])
    rope = get_rope(config, HEAD_DIM)
    length = 100  # > max_position_embeddings, so HF rescales the base for this call
    positions = torch.arange(length)
    q, k = random_qk(length, dtype)
    q_out, k_out = rotate_at(rope, positions, q, k, seq_lens=torch.full((length,), length))
    q_ref, k_ref = hf_rotate(config, positions, q, k)
    torch.testing.assert_close(q_out, q_ref, atol=atol, rtol=0)
    torch.testing.assert_close(k_out, k_ref, atol=atol, rtol=0)


def test_dynamic_mixed_batch_scales_each_sequence_by_its_own_length() -> None:
    config = make_config(ROPE_CASES["dynamic"])
    rope = get_rope(config, HEAD_DIM)
    # A long prefill, a decode step of a longer sequence, and a prefill shorter than the original length.
    sequences = [torch.arange(100), torch.tensor([149]), torch.arange(40)]
    positions = torch.cat(sequences)
    seq_lens = torch.cat([torch.full_like(p, int(p.max()) + 1) for p in sequences])
    q, k = random_qk(len(positions), torch.float32)
    q_out, k_out = rotate_at(rope, positions, q, k, seq_lens=seq_lens)

    start = 0
    for seq_positions in sequences:
        end = start + len(seq_positions)
        q_ref, k_ref = hf_rotate(config, seq_positions, q[start:end], k[start:end])
        torch.testing.assert_close(q_out[start:end], q_ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(k_out[start:end], k_ref, atol=1e-5, rtol=0)
        start = end

    # The decode token really used its own length: scaling it by the first sequence's length differs.
    q_wrong, _ = rotate_at(rope, positions[100:101], q[100:101], k[100:101], seq_lens=torch.tensor([100]))
    assert not torch.allclose(q_wrong, q_out[100:101], atol=1e-3)


def test_dynamic_defaults_seq_lens_to_position_plus_one() -> None:
    config = make_config(ROPE_CASES["dynamic"])
    rope = get_rope(config, HEAD_DIM)
    positions = torch.tensor([149, 10, 70])
    q, k = random_qk(3, torch.float32)
    q_default, k_default = rotate_at(rope, positions, q, k)
    q_explicit, k_explicit = rotate_at(rope, positions, q, k, seq_lens=positions + 1)
    torch.testing.assert_close(q_default, q_explicit, atol=0, rtol=0)
    torch.testing.assert_close(k_default, k_explicit, atol=0, rtol=0)


def test_partial_rotary_factor_rotates_only_the_leading_dims() -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = make_config(params)
    rope = get_rope(config, HEAD_DIM)
    rotary_dim = HEAD_DIM // 2
    assert rope.rotary_dim == rotary_dim
    # HF's linear init honours partial_rotary_factor; factor 1 makes it the default frequencies.
    hf_inv_freq, _ = ROPE_INIT_FUNCTIONS["linear"](make_config({**params, "rope_type": "linear", "factor": 1.0}))
    torch.testing.assert_close(rope.inv_freq, hf_inv_freq, rtol=1e-6, atol=0)

    positions = torch.randint(0, MAX_POS, (12,), generator=torch.Generator().manual_seed(2))
    q, k = random_qk(12, torch.float32)
    q_out, k_out = rotate_at(rope, positions, q, k)
    q_heads, q_out_heads = q.view(12, NUM_HEADS, HEAD_DIM), q_out.view(12, NUM_HEADS, HEAD_DIM)
    k_heads, k_out_heads = k.view(12, NUM_KV_HEADS, HEAD_DIM), k_out.view(12, NUM_KV_HEADS, HEAD_DIM)
    assert torch.equal(q_out_heads[..., rotary_dim:], q_heads[..., rotary_dim:])
    assert torch.equal(k_out_heads[..., rotary_dim:], k_heads[..., rotary_dim:])

    freqs = positions[:, None].float() * hf_inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    q_ref, k_ref = apply_rotary_pos_emb(
        q_heads[..., :rotary_dim], k_heads[..., :rotary_dim], emb.cos(), emb.sin(), unsqueeze_dim=1
    )
    torch.testing.assert_close(q_out_heads[..., :rotary_dim], q_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(k_out_heads[..., :rotary_dim], k_ref, atol=1e-5, rtol=0)


def _gptj_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Pair (x[2i], x[2i+1]) rotated by angle i, one pair at a time, in float64."""
    out = x.double().clone()
    for i in range(rotary_dim // 2):
        even, odd = x[..., 2 * i].double(), x[..., 2 * i + 1].double()
        c, s = cos[..., i].double(), sin[..., i].double()
        out[..., 2 * i], out[..., 2 * i + 1] = even * c - odd * s, odd * c + even * s
    return out


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_gptj_style_rotates_interleaved_pairs(partial: float) -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    rope = get_rope(make_config(params), HEAD_DIM, is_neox_style=False)
    rotary_dim = rope.rotary_dim
    positions = torch.randint(0, MAX_POS, (9,), generator=torch.Generator().manual_seed(3))
    q, k = random_qk(9, torch.float32)
    cos, sin = rope.cos_sin(positions, None, q.dtype)
    q_out, k_out = rope.rotate(q, k, cos, sin)
    q_heads, k_heads = q.view(9, NUM_HEADS, HEAD_DIM), k.view(9, NUM_KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(q_out.view_as(q_heads).double(), _gptj_formula(q_heads, cos, sin, rotary_dim),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(k_out.view_as(k_heads).double(), _gptj_formula(k_heads, cos, sin, rotary_dim),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gptj_style_matches_hf_interleaved_helper(dtype: torch.dtype) -> None:
    # HF's DeepSeek-V3 helper returns the rotated pairs de-interleaved ([evens | odds]), a fixed permutation
    # of the head dims that q.k is invariant to; undo it to compare.
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    rope = get_rope(make_config(ROPE_CASES["default"]), HEAD_DIM, is_neox_style=False)
    positions = torch.arange(11)
    q, k = random_qk(11, dtype)
    q_out, k_out = rope.rotate(q, k, *rope.cos_sin(positions, None, dtype))
    freqs = positions[:, None].float() * rope.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    q_ref, k_ref = apply_rotary_pos_emb_interleave(
        q.view(11, NUM_HEADS, HEAD_DIM).transpose(0, 1), k.view(11, NUM_KV_HEADS, HEAD_DIM).transpose(0, 1),
        emb.cos().to(dtype), emb.sin().to(dtype), unsqueeze_dim=0)
    for out, ref, heads in ((q_out, q_ref, NUM_HEADS), (k_out, k_ref, NUM_KV_HEADS)):
        out = out.view(11, heads, HEAD_DIM).transpose(0, 1)
        deinterleaved = torch.cat((out[..., 0::2], out[..., 1::2]), dim=-1)
        torch.testing.assert_close(deinterleaved, ref, atol=0, rtol=0)


def test_neox_is_the_default_style() -> None:
    assert get_rope(make_config(ROPE_CASES["default"]), HEAD_DIM).is_neox_style


def test_unknown_rope_type_raises_naming_it() -> None:
    config = SimpleNamespace(
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0}, max_position_embeddings=MAX_POS
    )
    with pytest.raises(ValueError, match="longrope") as excinfo:
        get_rope(config, HEAD_DIM)
    assert "yarn" in str(excinfo.value)  # lists the supported types


def test_per_layer_rope_parameters_are_rejected() -> None:
    layer_params = {"rope_type": "default", "rope_theta": 10000.0}
    config = SimpleNamespace(
        rope_parameters={"full_attention": layer_params, "sliding_attention": layer_params},
        max_position_embeddings=MAX_POS,
    )
    with pytest.raises(ValueError, match="per-layer"):
        get_rope(config, HEAD_DIM)


def test_transformers_4_style_config_falls_back_to_rope_scaling() -> None:
    legacy = SimpleNamespace(
        rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=10000.0, max_position_embeddings=MAX_POS
    )
    rope = get_rope(legacy, HEAD_DIM)
    expected = get_rope(make_config(ROPE_CASES["linear"]), HEAD_DIM)
    assert rope.rope_type == "linear" and rope.max_positions == 2 * MAX_POS
    torch.testing.assert_close(rope.inv_freq, expected.inv_freq, atol=0, rtol=0)


def test_tables_stay_float32_when_module_is_cast() -> None:
    rope = get_rope(make_config(ROPE_CASES["yarn"]), HEAD_DIM)
    reference = {name: buffer.clone() for name, buffer in rope.named_buffers()}
    model = torch.nn.Sequential(rope).to(torch.bfloat16)  # the way a whole model gets cast
    assert isinstance(model[0], RotaryEmbedding)
    for name, buffer in rope.named_buffers():
        assert buffer.dtype == torch.float32 and torch.equal(buffer, reference[name]), name


def test_module_apply_reaches_every_submodule_of_a_built_model() -> None:
    # `nn.Module.apply(fn)` is how weights get initialised; a layer must not shadow it.
    from rapid_llm.models.llama import LlamaForCausalLM

    config = make_config(ROPE_CASES["default"])
    config.num_hidden_layers, config.intermediate_size, config.vocab_size = 2, 64, 128
    model = LlamaForCausalLM(config)
    visited: list[torch.nn.Module] = []
    assert model.apply(visited.append) is model
    # The rotary module is shared by every layer: `apply` visits it once per layer, `modules()` once.
    assert {id(module) for module in visited} == {id(module) for module in model.modules()}
    assert any(isinstance(module, RotaryEmbedding) for module in visited)
