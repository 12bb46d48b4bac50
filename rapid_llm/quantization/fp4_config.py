"""FP4 weight quantization settings (NVFP4, MXFP4): from ModelOpt and gpt-oss `quantization_config`s, or online.

Checkpoints: `quant_method: modelopt` with `quant_algo: NVFP4` (flat, or nested under `quantization` as ModelOpt's
hf_quant_config.json writes it; `group_size` 16; `exclude_modules` / `ignore`): W4A4, activations fake-quantized
to NVFP4 under the checkpoint's `input_scale`. `quant_method: mxfp4` (gpt-oss; `modules_to_not_convert`): weight
only (W4A16). compressed-tensors' NVFP4 configs are parsed in compressed_tensors_config.py into this same config.
`layout` names the tensor names and scale conventions the linear method loads (see fp4_linear.py).
Online names (`--quantization nvfp4 | mxfp4`) quantize model-dtype weights after loading, weight only.
Torch-free: the launcher parses this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rapid_llm.quantization.base import config_error
from rapid_llm.utils.lazy_import import import_target

# "deepseek": DeepSeek-V4's FP4 experts (`expert_dtype: fp4` of an fp8 config, fp4_moe.py), experts only.
LAYOUTS = ("modelopt", "compressed-tensors", "gpt-oss", "deepseek", "online")


@dataclass(frozen=True)
class Fp4Config:
    fmt: str  # "nvfp4" or "mxfp4"
    layout: str  # one of LAYOUTS
    activation: str = "none"  # "none" (W4A16) or "nvfp4" (W4A4 with a static per-tensor input scale)
    ignored: tuple[str, ...] = ()
    method: str = "nvfp4"

    @property
    def online(self) -> bool:
        return self.layout == "online"

    @property
    def group_size(self) -> int:
        return 16 if self.fmt == "nvfp4" else 32

    @property
    def name(self) -> str:
        scales = "fp8 e4m3 scales per 16 + fp32 per tensor" if self.fmt == "nvfp4" else "e8m0 scales per 32"
        activations = "W4A4, nvfp4 activations" if self.activation == "nvfp4" else "W4A16, weight only"
        source = "online" if self.online else f"{self.layout} checkpoint"
        return f"{self.fmt} ({scales}, {activations}, {source})"

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "name": self.name, "format": self.fmt, "layout": self.layout,
                "group_size": self.group_size, "activation": self.activation, "online": self.online,
                "ignored": list(self.ignored)}

    def linear_method(self) -> Any:
        return import_target("rapid_llm.quantization.fp4_linear:Fp4LinearMethod")(self)

    def moe_method(self) -> Any:
        return import_target("rapid_llm.quantization.fp4_moe:Fp4MoEMethod")(self)


def module_names(values: dict[str, Any], field: str, prefix: str = "") -> tuple[str, ...]:
    names = values.get(field) or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise config_error(f"{prefix}{field}", f"must be a list of module names, got {names!r}")
    return tuple(names)


def check_group_size(values: dict[str, Any], expected: int, field: str = "group_size") -> None:
    group = values.get(field.rsplit(".", 1)[-1], expected)
    if group != expected:
        raise config_error(field, f"must be {expected} for this format, got {group!r}")


def parse_modelopt(values: dict[str, Any]) -> Fp4Config:
    """`quant_method: modelopt`, `quant_algo: NVFP4` (the fields flat or under `quantization`)."""
    prefix = ""
    if isinstance(values.get("quantization"), dict):
        values, prefix = values["quantization"], "quantization."
    algo = values.get("quant_algo")
    if algo != "NVFP4":
        raise config_error(f"{prefix}quant_algo", f"{algo!r} is not supported; only NVFP4 (ModelOpt FP8 checkpoints "
                           "are not read yet)")
    check_group_size(values, 16, f"{prefix}group_size")
    kv_algo = values.get("kv_cache_quant_algo")
    if kv_algo not in (None, "NVFP4", "FP8"):
        raise config_error(f"{prefix}kv_cache_quant_algo", f"{kv_algo!r} is not supported; use FP8, NVFP4 or null")
    ignored = module_names(values, "exclude_modules", prefix) + module_names(values, "ignore", prefix)
    return Fp4Config("nvfp4", "modelopt", "nvfp4", ignored, method="modelopt")


def parse_mxfp4(values: dict[str, Any]) -> Fp4Config:
    """`quant_method: mxfp4` (gpt-oss): `<proj>.weight_blocks` and `<proj>.weight_scales` per linear layer."""
    return Fp4Config("mxfp4", "gpt-oss", ignored=module_names(values, "modules_to_not_convert"), method="mxfp4")


ONLINE_FP4: dict[str, Fp4Config] = {
    "nvfp4": Fp4Config("nvfp4", "online"),
    "mxfp4": Fp4Config("mxfp4", "online", method="mxfp4"),
}
