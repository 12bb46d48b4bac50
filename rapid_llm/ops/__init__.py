"""The op layer: layers call ops by name (`ops.rms_norm(x, weight, eps)`) and the registry dispatches.

Implementations are registered in `catalog.py` (imported here, torch-free); each name below is the
registry's dispatcher for that op. Attention is the exception: the worker selects its backend once
(`REGISTRY.select("attention", ...)`) because it also builds per-step metadata.
"""

from rapid_llm.ops import catalog  # registers the built-in implementations
from rapid_llm.ops.registry import REGISTRY

rms_norm = REGISTRY.op("rms_norm")
fused_add_rms_norm = REGISTRY.op("fused_add_rms_norm")
silu_and_mul = REGISTRY.op("silu_and_mul")
rotary_embedding = REGISTRY.op("rotary_embedding")
linear = REGISTRY.op("linear")
kv_cache_store = REGISTRY.op("kv_cache_store")
fused_moe = REGISTRY.op("fused_moe")
top_k_top_p_filter = REGISTRY.op("top_k_top_p_filter")
apply_token_bitmask = REGISTRY.op("apply_token_bitmask")
causal_conv = REGISTRY.op("causal_conv")
gated_delta_rule = REGISTRY.op("gated_delta_rule")
ssd_scan = REGISTRY.op("ssd_scan")
lora = REGISTRY.op("lora")
attention_lse = REGISTRY.op("attention_lse")

__all__ = ["REGISTRY", "apply_token_bitmask", "attention_lse", "catalog", "causal_conv", "fused_add_rms_norm", "fused_moe",
           "gated_delta_rule", "kv_cache_store", "linear", "lora", "rms_norm", "rotary_embedding", "silu_and_mul",
           "ssd_scan", "top_k_top_p_filter"]
