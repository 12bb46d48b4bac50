"""Int4 weight quantization settings (GPTQ, AWQ, online round-to-nearest): parsed from `quantization_config` or named.

Checkpoints: `quant_method: gptq` as AutoGPTQ / GPTQModel / vLLM read it (`bits` 4, `group_size` (-1: one group
per row), `sym`, `desc_act`, `checkpoint_format` gptq (v1 zeros) or absent, `modules_to_not_convert`) and
`quant_method: awq` in its GEMM layout (`bits`/`w_bit` 4, `group_size`/`q_group_size`, `zero_point` true,
`version` gemm, `modules_to_not_convert`). `activation_bits: 8` (a rapid_llm key, default 16) turns either into
W4A8: each token's input quantized to int8 on the fly. Online names (`--quantization w4a16 | w4a8`) quantize
model-dtype weights after loading by round-to-nearest, asymmetric, groups of 128. Torch-free: the launcher
parses this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rapid_llm.quantization.base import config_error
from rapid_llm.utils.lazy_import import import_target

ONLINE_GROUP_SIZE = 128


@dataclass(frozen=True)
class Int4Config:
    layout: str  # "gptq", "awq" or "online" (model-dtype weights quantized after loading)
    group_size: int  # input channels per scale; -1: the whole row
    sym: bool  # zero point fixed at 8 (GPTQ sym); else one zero per group
    desc_act: bool = False  # GPTQ act-order: `g_idx` assigns input channels to groups
    activation_bits: int = 16  # 8: int8 per-token dynamic activations (W4A8)
    ignored: tuple[str, ...] = ()

    @property
    def online(self) -> bool:
        return self.layout == "online"

    @property
    def name(self) -> str:
        mode = "w4a8" if self.activation_bits == 8 else "w4a16"
        group = "per-channel" if self.group_size == -1 else f"group {self.group_size}"
        zeros = "symmetric" if self.sym else "asymmetric"
        order = ", act-order" if self.desc_act else ""
        source = "online" if self.online else "checkpoint"
        method = "int4" if self.online else self.layout
        return f"{method} {mode} ({group}, {zeros}{order}, {source})"

    def summary(self) -> dict[str, Any]:
        return {"method": "int4" if self.online else self.layout, "name": self.name, "bits": 4,
                "group_size": self.group_size, "sym": self.sym, "desc_act": self.desc_act,
                "activation_bits": self.activation_bits, "online": self.online, "ignored": list(self.ignored)}

    def linear_method(self) -> Any:
        return import_target("rapid_llm.quantization.int4_linear:Int4LinearMethod")(self)

    def moe_method(self) -> Any:
        """Int4 experts are not built: online, they stay in the model dtype (None); a checkpoint's are refused."""
        if self.online:
            return None
        raise ValueError(f"{self.layout} MoE experts are not supported: int4 quantized experts are not built")


def _integer(values: dict[str, Any], field: str, default: Any) -> Any:
    value = values.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise config_error(field, f"must be an integer, got {value!r}")
    return value


def _flag(values: dict[str, Any], field: str, default: bool) -> bool:
    value = values.get(field, default)
    if not isinstance(value, bool):
        raise config_error(field, f"must be true or false, got {value!r}")
    return value


def _common(values: dict[str, Any], bits_field: str, group_field: str) -> tuple[int, int, tuple[str, ...]]:
    bits = _integer(values, bits_field, None)
    if bits != 4:
        raise config_error(bits_field, f"{bits} is not supported; only 4-bit weights load")
    group_size = _integer(values, group_field, 128)
    if group_size != -1 and (group_size <= 0 or group_size % 8):
        raise config_error(group_field, f"must be -1 (one group per row) or a positive multiple of 8, got {group_size}")
    activation_bits = _integer(values, "activation_bits", 16)
    if activation_bits not in (8, 16):
        raise config_error("activation_bits", f"must be 16 (W4A16) or 8 (int8 per-token activations), got "
                           f"{activation_bits}")
    ignored = values.get("modules_to_not_convert") or []
    if not isinstance(ignored, list) or not all(isinstance(name, str) for name in ignored):
        raise config_error("modules_to_not_convert", f"must be a list of module names, got {ignored!r}")
    return group_size, activation_bits, tuple(ignored)


def parse_gptq(values: dict[str, Any]) -> Int4Config:
    """`quant_method: gptq` (v1 checkpoint format: stored zero = zero - 1)."""
    group_size, activation_bits, ignored = _common(values, "bits", "group_size")
    checkpoint_format = values.get("checkpoint_format", "gptq")
    if checkpoint_format != "gptq":
        raise config_error("checkpoint_format", f"{checkpoint_format!r} is not supported; only gptq (v1 zeros) loads")
    return Int4Config("gptq", group_size, _flag(values, "sym", True), _flag(values, "desc_act", False),
                      activation_bits, ignored)


def parse_awq(values: dict[str, Any]) -> Int4Config:
    """`quant_method: awq`, GEMM packing (AutoAWQ's default)."""
    bits_field = "bits" if "bits" in values else "w_bit"
    group_field = "group_size" if "group_size" in values else "q_group_size"
    group_size, activation_bits, ignored = _common(values, bits_field, group_field)
    version = values.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise config_error("version", f"{version!r} is not supported; only the GEMM packing loads")
    if not _flag(values, "zero_point", True):
        raise config_error("zero_point", "false (symmetric AWQ) is not supported; only zero-point AWQ loads")
    return Int4Config("awq", group_size, False, False, activation_bits, ignored)


ONLINE_INT4: dict[str, Int4Config] = {
    "w4a16": Int4Config("online", ONLINE_GROUP_SIZE, sym=False),
    "w4a8": Int4Config("online", ONLINE_GROUP_SIZE, sym=False, activation_bits=8),
}
