"""What every quantization method provides: a torch-free config, and the linear method it builds in the worker.

A `QuantizationConfig` is parsed in the launcher (from config.json's `quantization_config`, or built for an
online `--quantization` name), so a malformed config fails before any process starts. In the worker,
`linear_method()` returns the object that owns one linear layer's weight format (rapid_llm/quantization/
linear_method.py) and `moe_method()` the one for a layer of routed experts (moe_method.py), which may be
another format (`expert_dtype`); layers that `ignored` names stay in the model dtype.
"""

from __future__ import annotations

import re
from typing import Any, Protocol


class QuantizationConfig(Protocol):
    name: str  # as /server_info reports it, e.g. "fp8 (block 128x128, dynamic activations)"
    online: bool  # quantizes model-dtype weights after loading rather than loading quantized tensors
    ignored: tuple[str, ...]  # checkpoint module names left unquantized (see `ignored_by`)

    def linear_method(self) -> Any:
        """A LinearMethod for one linear layer."""

    def moe_method(self) -> Any:
        """A MoEMethod for one layer of routed experts, or None to keep them in the model dtype."""

    def summary(self) -> dict[str, Any]:
        """The settings a benchmark result should record."""


def config_error(field: str, problem: str) -> ValueError:
    """A refusal naming the config.json field at fault."""
    return ValueError(f"config.json quantization_config.{field}: {problem}")


def ignored_by(module_name: str, ignored: tuple[str, ...]) -> bool:
    """Whether an entry of `modules_to_not_convert` / `ignored_layers` names the module: the whole name, or a
    dotted run of its components ("lm_head", "model.layers.0.mlp", "down_proj"), where `*` stands for one
    component (gpt-oss: "model.layers.*.self_attn"); a `re:` entry (compressed-tensors) matches from the start."""
    for entry in ignored:
        if entry.startswith("re:"):
            matched = re.match(entry[3:], module_name) is not None
        else:
            run = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in entry.split("."))
            matched = re.search(rf"(^|\.){run}(\.|$)", module_name) is not None
        if matched:
            return True
    return False
