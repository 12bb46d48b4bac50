"""FP8 (e4m3) weight quantization settings: read from a checkpoint's `quantization_config`, or named online.

Checkpoints: `quant_method: fp8` as DeepSeek-V3 and Qwen3-FP8 write it (`weight_block_size` [n, k] -> block
scales `weight_scale_inv`; absent -> one `weight_scale` per matrix; `activation_scheme` dynamic or static
with `input_scale`; `scale_fmt: ue8m0` power-of-two scales; `ignored_layers` / `modules_to_not_convert`), and
`quant_method: fbgemm_fp8` (per-row `weight_scale` [out, 1], dynamic per-token activations, optional
`activation_scale_ub`). Online names (`--quantization`) quantize model-dtype weights after loading.
Mixed precision: `expert_dtype` (transformers' FineGrainedFP8Config field; DeepSeek-V4 writes "fp4") gives the
routed experts their own format: "fp8" (default: as the dense layers), "fp4" or "mxfp4" (DeepSeek-V4's FP4
experts: `weight` + e8m0 `weight_scale_inv` per 32), "nvfp4" (ModelOpt's per-expert tensors), "bf16" (kept).
Dynamic activations are quantized per token (tensor and row weights) or per group of block_k (block weights).
Torch-free: the launcher parses this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rapid_llm.quantization.base import config_error
from rapid_llm.quantization.fp4_config import Fp4Config
from rapid_llm.utils.lazy_import import import_target

GRANULARITIES = ("tensor", "row", "block")
# expert_dtype -> the experts' FP4 format (fp4_moe.py), weight only
_DEEPSEEK_FP4 = Fp4Config("mxfp4", "deepseek", method="fp8")
EXPERT_FP4 = {"fp4": _DEEPSEEK_FP4, "mxfp4": _DEEPSEEK_FP4, "nvfp4": Fp4Config("nvfp4", "modelopt", method="fp8")}
EXPERT_DTYPES = ("fp8", *EXPERT_FP4, "bf16")


@dataclass(frozen=True)
class Fp8Config:
    granularity: str  # one of GRANULARITIES
    block: tuple[int, int] | None  # (rows, columns) of a scale block when granularity is "block"
    activation: str  # "dynamic" or "static" (a checkpoint `input_scale` per matrix)
    ue8m0: bool = False  # scales are powers of two
    online: bool = False
    ignored: tuple[str, ...] = ()
    activation_scale_ub: float | None = None  # fbgemm_fp8: dynamic activation amax is clamped to this
    method: str = "fp8"
    block_scale_name: str = "weight_scale_inv"  # compressed-tensors names block scales weight_scale
    expert_dtype: str = "fp8"  # one of EXPERT_DTYPES: the routed experts' format

    @property
    def name(self) -> str:
        weights = f"block {self.block[0]}x{self.block[1]}" if self.block else f"per-{self.granularity}"
        scales = ", ue8m0 scales" if self.ue8m0 else ""
        source = "online" if self.online else "checkpoint"
        experts = f", experts {self.expert_dtype}" if self.expert_dtype != "fp8" else ""
        return f"{self.method} ({weights}{scales}, {self.activation} activations{experts}, {source})"

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "name": self.name, "weight_granularity": self.granularity,
                "weight_block_size": list(self.block) if self.block else None, "activation_scheme": self.activation,
                "scale_fmt": "ue8m0" if self.ue8m0 else None, "expert_dtype": self.expert_dtype, "online": self.online,
                "ignored": list(self.ignored)}

    def linear_method(self) -> Any:
        return import_target("rapid_llm.quantization.fp8_linear:Fp8LinearMethod")(self)

    def moe_method(self) -> Any:
        if self.expert_dtype == "bf16":
            return None
        if self.expert_dtype in EXPERT_FP4:
            return EXPERT_FP4[self.expert_dtype].moe_method()
        return import_target("rapid_llm.quantization.fp8_moe:Fp8MoEMethod")(self)


def _names(values: dict[str, Any], field: str) -> tuple[str, ...]:
    names = values.get(field) or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise config_error(field, f"must be a list of module names, got {names!r}")
    return tuple(names)


def _block(values: dict[str, Any]) -> tuple[int, int] | None:
    block = values.get("weight_block_size")
    if block is None:
        return None
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in block)):
        raise config_error("weight_block_size", f"must be two positive integers [rows, columns], got {block!r}")
    return block[0], block[1]


def parse_fp8(values: dict[str, Any]) -> Fp8Config:
    """`quant_method: fp8` (DeepSeek-V3 / Qwen3-FP8 layout)."""
    fmt = values.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise config_error("fmt", f"{fmt!r} is not supported; only e4m3 FP8 weights load")
    activation = values.get("activation_scheme", "dynamic")
    if activation not in ("dynamic", "static"):
        raise config_error("activation_scheme", f"must be 'dynamic' or 'static', got {activation!r}")
    block = _block(values)
    if block is not None and activation == "static":
        raise config_error("activation_scheme", "block-wise FP8 (weight_block_size) needs dynamic activations")
    scale_fmt = values.get("scale_fmt")
    if scale_fmt not in (None, "ue8m0"):
        raise config_error("scale_fmt", f"{scale_fmt!r} is not supported; only ue8m0 or absent")
    ignored = _names(values, "ignored_layers") + _names(values, "modules_to_not_convert")
    expert_dtype = values.get("expert_dtype", "fp8")
    if expert_dtype not in EXPERT_DTYPES:
        raise config_error("expert_dtype", f"{expert_dtype!r} is not supported; one of {', '.join(EXPERT_DTYPES)}")
    return Fp8Config("block" if block else "tensor", block, activation, scale_fmt == "ue8m0", ignored=ignored,
                     expert_dtype=expert_dtype)


def parse_fbgemm_fp8(values: dict[str, Any]) -> Fp8Config:
    """`quant_method: fbgemm_fp8` (per-row weight scales, per-token dynamic activations)."""
    bound = values.get("activation_scale_ub")
    if bound is not None and (not isinstance(bound, (int, float)) or isinstance(bound, bool) or bound <= 0):
        raise config_error("activation_scale_ub", f"must be a positive number, got {bound!r}")
    return Fp8Config("row", None, "dynamic", ignored=_names(values, "modules_to_not_convert"),
                     activation_scale_ub=None if bound is None else float(bound), method="fbgemm_fp8")


# Online names -> the format produced from model-dtype weights (always dynamic activations).
ONLINE_FP8: dict[str, Fp8Config] = {
    "fp8": Fp8Config("tensor", None, "dynamic", online=True),
    "fp8-rowwise": Fp8Config("row", None, "dynamic", online=True),
    "fp8-block128": Fp8Config("block", (128, 128), "dynamic", online=True),
    "fp8-block32": Fp8Config("block", (32, 32), "dynamic", online=True),
    "fp8-block128-ue8m0": Fp8Config("block", (128, 128), "dynamic", ue8m0=True, online=True),
    "fp8-block32-ue8m0": Fp8Config("block", (32, 32), "dynamic", ue8m0=True, online=True),
}
