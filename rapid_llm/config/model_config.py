"""ModelConfig: what the engine needs to know about a checkpoint, resolved once.

The launcher reads config.json as plain JSON (any transformers config class imports torch) for the
few fields it resolves: architecture, vocabulary, supported length, dtype, EOS. The worker builds
the Hugging Face `AutoConfig` object on first use of `hf_config`, so every family-specific field
(rope parameters, head_dim, sliding windows) means exactly what the installed transformers says it
means, and refuses to start if transformers reads those launcher fields differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from rapid_llm.config.dtypes import dtype_from_name, dtype_name
from rapid_llm.models.registry import refusal_reason
from rapid_llm.quantization.base import QuantizationConfig
from rapid_llm.quantization.registry import resolve_quantization

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

# Fields the launcher needs that config.json must spell out (no class default fills them in there).
_REQUIRED_JSON_FIELDS = ("vocab_size", "max_position_embeddings")


def rope_parameters(hf_config: PretrainedConfig) -> dict[str, Any]:
    """A copy of the flat rope dict as transformers 5 sees it (or built from `rope_scaling` + `rope_theta`
    where a config has no `rope_parameters`); `hf_config` is only read (transformers 5 standardizes its
    rope parameters when the config is built)."""
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


def _supported_len(config: Any) -> int:
    """derived_max_model_len of the config's rope; with per-rope-type parameters (DeepSeek-V4's "main" and
    "compress"), the longest any of them supports."""
    max_positions = int(config.max_position_embeddings)
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(value, dict) for value in params.values()):
        return max(derived_max_model_len(max_positions, {"rope_type": "default", **value}) for value in params.values())
    return derived_max_model_len(max_positions, rope_parameters(config))


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


@dataclass(frozen=True)
class CheckpointFields:
    """The checkpoint config's fields the launcher resolves, read through getattr, so config.json's JSON
    and transformers' config object give comparable values."""

    architectures: tuple[str, ...]
    vocab_size: int
    supported_len: int  # max_position_embeddings, stretched by rope scaling
    declared_dtype: str | None  # as written ("bfloat16"); None when the checkpoint declares none
    eos_token_ids: tuple[int, ...]

    @classmethod
    def of(cls, config: Any) -> "CheckpointFields":
        declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        return cls(
            architectures=tuple(getattr(config, "architectures", None) or ()),
            vocab_size=int(config.vocab_size),
            supported_len=_supported_len(config),
            declared_dtype=None if declared is None else str(declared).removeprefix("torch."),
            eos_token_ids=_token_ids(getattr(config, "eos_token_id", None)),
        )


def _read_config_json(model: str) -> SimpleNamespace:
    path = Path(model) / "config.json"
    if not path.is_file():
        raise ValueError(f"--model {model!r} is not a Hugging Face checkpoint directory (no config.json there)")
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--model {model!r}: cannot read config.json ({error})") from None
    for architecture in values.get("architectures") or ():
        # Before the field checks: a refused layout (DeepSeek-V4.1 nests its fields) would fail them unclearly.
        reason = refusal_reason(architecture)
        if reason is not None:
            raise ValueError(f"--model {model!r}: {reason}")
    missing = [name for name in _REQUIRED_JSON_FIELDS if name not in values]
    if missing:
        raise ValueError(f"{path} names no {', '.join(missing)}; add it to the checkpoint's config")
    return SimpleNamespace(**values)


def _eos_token_ids(model_dir: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    """EOS ids from generation_config.json when present (it is what HF generate stops on), else config."""
    generation_config = model_dir / "generation_config.json"
    if generation_config.is_file():
        eos = json.loads(generation_config.read_text()).get("eos_token_id")
        if eos is not None:
            return _token_ids(eos)
    return config_eos


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint directory plus the resolved settings the engine runs it with (no torch needed)."""

    model: str
    checkpoint: CheckpointFields
    dtype_name: str
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    trust_remote_code: bool = False
    # The checkpoint's quantization_config or the --quantization method (rapid_llm/quantization/); None: none.
    quantization: QuantizationConfig | None = None

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        dtype: str | torch.dtype = "auto",
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
        quantization: str | None = None,
    ) -> "ModelConfig":
        values = _read_config_json(model)
        checkpoint = CheckpointFields.of(values)
        quantization_config = resolve_quantization(getattr(values, "quantization_config", None), quantization)
        if dtype == "auto":
            resolved_dtype = dtype_name(checkpoint.declared_dtype or "float32", "checkpoint dtype")
        else:
            resolved_dtype = dtype_name(dtype, "--dtype")
        supported_len = checkpoint.supported_len
        if max_model_len is None:
            max_model_len = supported_len
        elif max_model_len < 1:
            raise ValueError(f"--max-model-len must be positive, got {max_model_len}")
        elif max_model_len > supported_len:
            raise ValueError(
                f"--max-model-len {max_model_len} is more than the model supports ({supported_len}, from its "
                f"max_position_embeddings and rope scaling); lower --max-model-len to at most {supported_len}"
            )
        return cls(model, checkpoint, resolved_dtype, max_model_len,
                   _eos_token_ids(Path(model), checkpoint.eos_token_ids), trust_remote_code, quantization_config)

    @cached_property
    def hf_config(self) -> PretrainedConfig:
        """transformers' config object, built on first use (in the worker: it imports torch)."""
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(self.model, trust_remote_code=self.trust_remote_code)
        seen = CheckpointFields.of(hf_config)
        if seen != self.checkpoint:
            raise ValueError(f"{self.model}/config.json read as JSON gives {self.checkpoint}, but transformers "
                             f"reads {seen} (class defaults filling in what the file leaves out?); write those "
                             "fields into config.json")
        return hf_config

    @cached_property
    def rope_parameters(self) -> dict[str, Any]:
        return rope_parameters(self.hf_config)

    @property
    def dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype_name)

    @property
    def architecture(self) -> str:
        if not self.checkpoint.architectures:
            raise ValueError(f"{self.model}/config.json names no 'architectures'; cannot pick a model class")
        return self.checkpoint.architectures[0]

    @property
    def vocab_size(self) -> int:
        return self.checkpoint.vocab_size

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return attention_kv_heads(self.hf_config)

    @property
    def head_dim(self) -> int:
        return attention_head_dim(self.hf_config)
