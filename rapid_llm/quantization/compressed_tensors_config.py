"""compressed-tensors `quantization_config`s (`quant_method: compressed-tensors`) mapped onto the FP4 and FP8 methods.

One config group targeting `Linear` is read (its `format`, else the top-level one):
- `nvfp4-pack-quantized`: weights 4-bit float, strategy `tensor_group`, group 16 -> Fp4Config (compressed-tensors
  layout); `input_activations` absent -> W4A16, present (4-bit float, tensor_group 16) -> W4A4.
- `float-quantized`: weights 8-bit float, strategy `tensor` | `channel` | `block` (`block_structure` [n, k]) ->
  Fp8Config (the FP8 method's math and loaders); activations 8-bit float `token` dynamic (tensor/channel
  weights), `tensor` static, or `group` dynamic with group_size k (block weights). Weight-only FP8 is refused
  (the FP8 method always quantizes activations).
`ignore` entries are module names or `re:` patterns. Anything else is refused naming the field. Torch-free.
"""

from __future__ import annotations

from typing import Any

from rapid_llm.quantization.base import QuantizationConfig, config_error
from rapid_llm.quantization.fp4_config import Fp4Config, module_names
from rapid_llm.quantization.fp8_config import Fp8Config

FORMATS = ("nvfp4-pack-quantized", "float-quantized")
KV_CACHE_FP8 = {"num_bits": 8, "type": "float"}


def _args(group: dict[str, Any], field: str, where: str) -> dict[str, Any] | None:
    values = group.get(field)
    if values is not None and not isinstance(values, dict):
        raise config_error(f"{where}.{field}", f"must be an object or null, got {values!r}")
    return values


def _expect(values: dict[str, Any], where: str, **expected: Any) -> None:
    for key, allowed in expected.items():
        choices = allowed if isinstance(allowed, tuple) else (allowed,)
        if values.get(key) not in choices:
            raise config_error(f"{where}.{key}", f"must be {' or '.join(map(repr, choices))} for this format, "
                               f"got {values.get(key)!r}")


def _nvfp4(weights: dict[str, Any], activations: dict[str, Any] | None, where: str,
           ignored: tuple[str, ...]) -> Fp4Config:
    _expect(weights, f"{where}.weights", num_bits=4, type="float", strategy="tensor_group", group_size=16)
    if activations is None:
        return Fp4Config("nvfp4", "compressed-tensors", "none", ignored, method="compressed-tensors")
    _expect(activations, f"{where}.input_activations", num_bits=4, type="float", strategy="tensor_group",
            group_size=16)
    return Fp4Config("nvfp4", "compressed-tensors", "nvfp4", ignored, method="compressed-tensors")


def _fp8(weights: dict[str, Any], activations: dict[str, Any] | None, where: str,
         ignored: tuple[str, ...]) -> Fp8Config:
    _expect(weights, f"{where}.weights", num_bits=8, type="float", strategy=("tensor", "channel", "block"))
    if activations is None:
        raise config_error(f"{where}.input_activations", "is null (FP8 weight only), which is not built: the FP8 "
                           "method quantizes activations")
    _expect(activations, f"{where}.input_activations", num_bits=8, type="float")
    strategy, block = weights["strategy"], None
    if strategy == "block":
        block = weights.get("block_structure")
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in block)):
            raise config_error(f"{where}.weights.block_structure", f"must be two positive integers, got {block!r}")
        _expect(activations, f"{where}.input_activations", strategy="group", group_size=block[1], dynamic=True)
        activation = "dynamic"
    else:
        _expect(activations, f"{where}.input_activations", strategy=("token", "tensor"))
        activation = "dynamic" if activations["strategy"] == "token" else "static"
        _expect(activations, f"{where}.input_activations", dynamic=activation == "dynamic")
    granularity = {"tensor": "tensor", "channel": "row", "block": "block"}[strategy]
    return Fp8Config(granularity, tuple(block) if block else None, activation, ignored=ignored,
                     method="compressed-tensors", block_scale_name="weight_scale")


def parse_compressed_tensors(values: dict[str, Any]) -> QuantizationConfig:
    groups = values.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise config_error("config_groups", f"must hold exactly one group (mixed schemes are not built), got "
                           f"{groups!r}")
    (name, group), = groups.items()
    where = f"config_groups.{name}"
    if not isinstance(group, dict):
        raise config_error(where, f"must be an object, got {group!r}")
    if group.get("targets") != ["Linear"]:
        raise config_error(f"{where}.targets", f"must be [\"Linear\"], got {group.get('targets')!r}")
    fmt = group.get("format") or values.get("format")
    if fmt not in FORMATS:
        raise config_error("format", f"{fmt!r} is not supported; supported: {', '.join(FORMATS)}")
    kv_scheme = values.get("kv_cache_scheme")
    if kv_scheme is not None and not (isinstance(kv_scheme, dict)
                                      and all(kv_scheme.get(k) == v for k, v in KV_CACHE_FP8.items())):
        raise config_error("kv_cache_scheme", f"only an 8-bit float scheme (k_scale/v_scale) or null, got {kv_scheme!r}")
    weights = _args(group, "weights", where)
    if weights is None:
        raise config_error(f"{where}.weights", "is missing")
    activations = _args(group, "input_activations", where)
    ignored = module_names(values, "ignore")
    parse = _nvfp4 if fmt == "nvfp4-pack-quantized" else _fp8
    return parse(weights, activations, where, ignored)
