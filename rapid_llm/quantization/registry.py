"""The quantization methods: checkpoint `quant_method` names and online `--quantization` names -> configs.

A method registers its parser for the `quant_method` values it reads and the online names it produces
(`register_quantization`, in rapid_llm/quantization/methods.py); `resolve_quantization` turns config.json's
`quantization_config` and the flag into one config, or None for an unquantized model. Torch-free, so the
launcher checks everything before any process starts; errors name the field or the flag.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from rapid_llm.quantization.base import QuantizationConfig, config_error
from rapid_llm.utils.registry import Registry

CHECKPOINT_PARSERS: Registry[Callable[[dict[str, Any]], QuantizationConfig]] = Registry("quant_method")
ONLINE_CONFIGS: Registry[QuantizationConfig] = Registry("--quantization method")


def register_quantization(checkpoint: dict[str, Callable[[dict[str, Any]], QuantizationConfig]],
                          online: dict[str, QuantizationConfig]) -> None:
    for name, parser in checkpoint.items():
        CHECKPOINT_PARSERS.register(name, parser)
    for name, config in online.items():
        ONLINE_CONFIGS.register(name, config)


def online_names() -> list[str]:
    importlib.import_module("rapid_llm.quantization.methods")  # registers the built-in methods, once
    return list(ONLINE_CONFIGS)


def resolve_quantization(quantization_config: Any, flag: str | None) -> QuantizationConfig | None:
    """The checkpoint's method (`flag` may only repeat its quant_method), else the online `flag`, else None."""
    names = online_names()
    if quantization_config is not None:
        if not isinstance(quantization_config, dict):
            raise ValueError(f"config.json quantization_config must be an object, got {quantization_config!r}")
        method = quantization_config.get("quant_method")
        if method not in CHECKPOINT_PARSERS:
            raise config_error("quant_method", f"{method!r} is not supported; supported: "
                               f"{', '.join(CHECKPOINT_PARSERS)}")
        if flag is not None and flag != method:
            raise ValueError(f"--quantization {flag}: the checkpoint is already quantized ({method}); "
                             f"drop the flag or pass --quantization {method}")
        return CHECKPOINT_PARSERS.get(method)(quantization_config)
    if flag is None:
        return None
    if flag not in names:
        raise ValueError(f"--quantization {flag!r} is not an online method; choose one of {', '.join(names)}")
    return ONLINE_CONFIGS.get(flag)
