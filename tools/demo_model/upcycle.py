"""Sparse upcycling: a ``Qwen3MoeForCausalLM`` initialised from a trained ``LlamaForCausalLM``.

Embeddings, attention, norms and LM head are copied; every expert gets a copy of the layer's dense FFN
plus small noise (so the experts can drift apart), and the router starts with small random weights.
With ``norm_topk_prob`` the top-2 weights sum to one, so identical experts would compute the dense
FFN exactly. Qwen3 attention adds per-head RMSNorms on queries and keys that Llama lacks; they start
at one, which changes the attention temperature -- the fine-tuning that follows has to absorb that.

Usage:
    moe = upcycle(transformers.AutoModelForCausalLM.from_pretrained(draft_dir), PRESETS["moe"].config())
"""

from __future__ import annotations

import torch
import transformers

EXPERT_NOISE_STD = 1e-3
ROUTER_INIT_STD = 1e-2


@torch.no_grad()
def upcycle(dense: transformers.PreTrainedModel, moe_config: transformers.PretrainedConfig,
            generator: torch.Generator | None = None, **from_config_kwargs: object) -> transformers.PreTrainedModel:
    """Build a float32 MoE model of ``moe_config`` from ``dense``; ``generator`` draws the noise."""
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim"):
        if getattr(dense.config, field) != getattr(moe_config, field):
            raise ValueError(f"{field} differs: dense {getattr(dense.config, field)}, MoE {getattr(moe_config, field)}")
    if dense.config.intermediate_size != moe_config.moe_intermediate_size:
        raise ValueError("the MoE's moe_intermediate_size must equal the dense model's intermediate_size")
    moe = transformers.AutoModelForCausalLM.from_config(moe_config, dtype=torch.float32, **from_config_kwargs)
    dense_state = {name: tensor.float() for name, tensor in dense.state_dict().items()}
    moe_state = moe.state_dict()
    for name, tensor in dense_state.items():
        if ".mlp." not in name:
            moe_state[name].copy_(tensor)
    num_experts = moe_config.num_experts
    for layer in range(moe_config.num_hidden_layers):
        prefix = f"model.layers.{layer}.mlp."
        gate_up = torch.cat([dense_state[prefix + "gate_proj.weight"], dense_state[prefix + "up_proj.weight"]])
        for name, dense_weight in (("experts.gate_up_proj", gate_up),
                                   ("experts.down_proj", dense_state[prefix + "down_proj.weight"])):
            noise = torch.randn((num_experts, *dense_weight.shape), generator=generator) * EXPERT_NOISE_STD
            moe_state[prefix + name].copy_(dense_weight + noise * dense_weight.std())
        router = moe_state[prefix + "gate.weight"]
        router.copy_(torch.randn(router.shape, generator=generator) * ROUTER_INIT_STD)
    return moe
