"""ModelConfig: what the engine needs to know about a checkpoint, resolved once.

It wraps the Hugging Face `AutoConfig` object rather than re-parsing config.json, so every
family-specific field (rope parameters, head_dim, sliding windows) means exactly what the
installed transformers says it means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from rapid_llm.config.dtypes import dtype_from_name

def rope_parameters(hf_config: PretrainedConfig) -> dict[str, Any]:
    """A copy of the flat rope dict as transformers 5.x sees it, or built from `rope_scaling` + `rope_theta`
    on 4.x; `hf_config` is only read (5.x standardizes its rope parameters when the config is built)."""
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        if getattr(hf_config, "partial_rotary_factor", None) is not None:
            params.setdefault("partial_rotary_factor", hf_config.partial_rotary_factor)
    if any(isinstance(value, dict) for value in params.values()):
        raise ValueError(f"per-layer-type rope parameters are not supported for this model: {params}")
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def attention_kv_heads(hf_config: PretrainedConfig) -> int:
    """KV heads of a grouped-query model; as many as attention heads when the config names none."""
    return int(getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads)


def attention_head_dim(hf_config: PretrainedConfig) -> int:
    """The explicit `head_dim` (Qwen3 sets one), else hidden_size / num_attention_heads."""
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit or hf_config.hidden_size // hf_config.num_attention_heads)


def derived_max_model_len(max_positions: int, rope: dict[str, Any]) -> int:
    """The longest sequence a checkpoint supports: `max_position_embeddings`, stretched by rope scaling."""
    factor = rope.get("factor")
    if rope["rope_type"] in ("linear", "dynamic") and factor:
        return int(max_positions * factor)
    if rope["rope_type"] == "yarn" and factor and rope.get("original_max_position_embeddings"):
        return max(max_positions, int(rope["original_max_position_embeddings"] * factor))
    return max_positions


def _checkpoint_dtype(hf_config: PretrainedConfig) -> torch.dtype:
    declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    return dtype_from_name(declared, "checkpoint dtype") if declared is not None else torch.float32


def _eos_token_ids(model_dir: Path, hf_config: PretrainedConfig) -> tuple[int, ...]:
    """EOS ids from generation_config.json when present (it is what HF generate stops on), else config."""
    generation_config = model_dir / "generation_config.json"
    eos: Any = None
    if generation_config.is_file():
        eos = json.loads(generation_config.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint directory plus the resolved settings the engine runs it with."""

    model: str
    hf_config: PretrainedConfig
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    rope_parameters: dict[str, Any]  # resolved once, from hf_config, when the config is built
    trust_remote_code: bool = False

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        dtype: str | torch.dtype = "auto",
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
    ) -> "ModelConfig":
        model_dir = Path(model)
        if not (model_dir / "config.json").is_file():
            raise ValueError(f"--model {model!r} is not a Hugging Face checkpoint directory (no config.json there)")
        hf_config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
        resolved_dtype = _checkpoint_dtype(hf_config) if dtype == "auto" else dtype_from_name(dtype, "--dtype")
        rope = rope_parameters(hf_config)
        supported_len = derived_max_model_len(int(hf_config.max_position_embeddings), rope)
        if max_model_len is None:
            max_model_len = supported_len
        elif max_model_len < 1:
            raise ValueError(f"--max-model-len must be positive, got {max_model_len}")
        elif max_model_len > supported_len:
            raise ValueError(
                f"--max-model-len {max_model_len} is more than the model supports ({supported_len}, from its "
                f"max_position_embeddings and rope scaling); lower --max-model-len to at most {supported_len}"
            )
        return cls(model, hf_config, resolved_dtype, max_model_len, _eos_token_ids(model_dir, hf_config), rope,
                   trust_remote_code)

    @property
    def architecture(self) -> str:
        architectures = getattr(self.hf_config, "architectures", None) or []
        if not architectures:
            raise ValueError(f"{self.model}/config.json names no 'architectures'; cannot pick a model class")
        return architectures[0]

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return attention_kv_heads(self.hf_config)

    @property
    def head_dim(self) -> int:
        return attention_head_dim(self.hf_config)
