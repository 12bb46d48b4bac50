"""The model registry: HF architecture name -> "module:Class", imported when that model is built.

A `utils.registry.Registry`, so importing the engine imports no model and a broken optional model can never
break the others. Adding a model is one line here; an out-of-tree model calls `register_model` from a plugin
module that every engine process imports at start (`RAPID_LLM_PLUGINS`, utils/plugins.py), as vLLM's
`ModelRegistry.register_model`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rapid_llm.utils.registry import Registry

if TYPE_CHECKING:
    import torch

# Architectures that look related to a supported one but are not served, with what is missing. DeepSeek-V4.1's
# config (vLLM's `deepseek_v41`) nests the text model under `text_config` and adds fields V4 has no
# counterpart for, so it cannot be read as a V4 config.
_REFUSED: dict[str, str] = {
    "DeepseekV41ForCausalLM": (
        "DeepSeek-V4.1 (model_type deepseek_v41) is not DeepSeek-V4 and is not supported: its text config "
        "(nested under text_config, next to a vision_config) has per-layer compress_ratios of 1 and 2 with "
        "compressed KV and indexer top-k shared across layers (kv_source_layer_ids, index_source_layer_ids), a "
        "two-level candidate top-k (candidate_source_layer_id, candidate_topk_blocks, candidate_block_size), "
        "engram hash-embedding layers (engram_layer_ids, engram_*), a router temperature (gate_temp) and a vision "
        "tower; rapid_llm implements none of these (DeepseekV4ForCausalLM checkpoints are served)"),
    **{f"Qwen3_5{moe}ForConditionalGeneration": (
        f"Qwen3.5's vision-language checkpoint layout (Qwen3_5{moe}ForConditionalGeneration: the text model's config "
        "nested under text_config, its weights under model.language_model, a vision tower) is not read; rapid_llm "
        f"serves the text model, Qwen3_5{moe}ForCausalLM (config model_type qwen3_5{'_moe' if moe else ''}_text, "
        "weights under model.)") for moe in ("", "Moe")},
}


_MODELS: Registry[type[torch.nn.Module]] = Registry("architecture", {
    "DeepseekV2ForCausalLM": "rapid_llm.models.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "rapid_llm.models.deepseek:DeepseekV3ForCausalLM",
    "DeepseekV4ForCausalLM": "rapid_llm.models.deepseek_v4:DeepseekV4ForCausalLM",
    "Lfm2ForCausalLM": "rapid_llm.models.lfm2:Lfm2ForCausalLM",
    "LlamaForCausalLM": "rapid_llm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "rapid_llm.models.mistral:MistralForCausalLM",
    "MixtralForCausalLM": "rapid_llm.models.mixtral:MixtralForCausalLM",
    "NemotronHForCausalLM": "rapid_llm.models.nemotron_h:NemotronHForCausalLM",
    "Qwen2ForCausalLM": "rapid_llm.models.qwen2:Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM": "rapid_llm.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM": "rapid_llm.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "rapid_llm.models.qwen3_moe:Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM": "rapid_llm.models.qwen3_next:Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM": "rapid_llm.models.qwen3_5:Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": "rapid_llm.models.qwen3_5:Qwen3_5MoeForCausalLM",
}, refused=_REFUSED)


def register_model(architecture: str, model_class: str | type[torch.nn.Module]) -> None:
    """Serve checkpoints whose config.json names `architecture` with `model_class`: a "module:Class" target, imported
    when the model is built (keeps the launcher, which imports plugins too, free of torch), or the class itself. A
    name already served (built in or registered) is refused."""
    if not architecture:
        raise ValueError("register_model needs the architecture name a checkpoint's config.json lists")
    if isinstance(model_class, str) and model_class.count(":") != 1:
        raise ValueError(f"register_model({architecture!r}, {model_class!r}): the model class must be a "
                         "'module:Class' string or the class itself")
    _MODELS.register(architecture, model_class)


def refusal_reason(architecture: str) -> str | None:
    """Why `architecture` is refused, for the related architectures named in _REFUSED; else None."""
    return _MODELS.refusal_reason(architecture)


def supported_architectures() -> list[str]:
    return _MODELS.names()


def check_supported(architecture: str) -> None:
    """Raise ValueError, listing what is supported, unless `architecture` is (imports no model)."""
    if architecture not in _MODELS and refusal_reason(architecture) is None:
        raise ValueError(
            f"Model architecture {architecture!r} is not supported by rapid_llm. "
            f"Supported architectures: {', '.join(supported_architectures())}"
        )
    _MODELS.check(architecture)  # raises the refusal's reason


def resolve_model_class(architecture: str) -> type[torch.nn.Module]:
    """Import and return the class for `architecture`; unknown names list what is supported."""
    check_supported(architecture)
    return _MODELS.get(architecture)
