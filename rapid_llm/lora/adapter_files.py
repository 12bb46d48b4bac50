"""Read and check a PEFT LoRA adapter folder without torch (the frontend checks adapters before it takes them).

A folder holds `adapter_config.json` and `adapter_model.safetensors`; only the safetensors header (a JSON table
of names, dtypes and shapes) is read here. Key design choice: what an adapter may target is not a list kept here
but what the served model reports (`targets`: each LoRA-capable linear's checkpoint name with its full input and
output sizes), so a module the model lacks, or a shape of another base model, is refused naming it, for any
architecture. An embedding's `lora_embedding_A/B` read as a linear's A/B (B·A of a one-hot token); the copy of
the embedding or LM head PEFT saves beside them (`base_layer.weight`) must have the base's shape and is not read.
Refused, each with its cause: DoRA, trained biases, `modules_to_save`, per-module rank or alpha patterns,
fan-in-fan-out (Conv1D) layouts and ranks over --max-lora-rank.
Usage: `adapter = read_adapter(path); check_adapter(adapter, targets, max_rank)`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
BASE_LAYER = "base"
# tensor name suffix -> which part of its module it is
LORA_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_embedding_A": "A", ".lora_embedding_B": "B",
                 ".base_layer.weight": BASE_LAYER}
_MAX_HEADER_BYTES = 100 * 2**20


class AdapterError(ValueError):
    """An adapter that cannot be served; the message names the file, field or module at fault."""


@dataclass(frozen=True)
class AdapterFiles:
    path: str
    rank: int
    scaling: float  # alpha / rank, or alpha / sqrt(rank) with rsLoRA: what B is multiplied by
    # checkpoint module name (e.g. "model.layers.0.self_attn.q_proj") -> (A's shape, B's shape)
    modules: dict[str, tuple[tuple[int, int], tuple[int, int]]]
    base_model: str | None  # adapter_config.json's base_model_name_or_path, for /v1/models


def _read_config(folder: Path) -> dict:
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise AdapterError(f"{folder} has no {CONFIG_FILE}: not a PEFT adapter folder")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise AdapterError(f"{config_path} cannot be read: {error}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} is not a JSON object")
    return config


def _check_config(config: dict, config_path: Path) -> tuple[int, float]:
    """(rank, scaling) of a plain LoRA config; anything that changes the math beyond B·A is refused."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_path}: peft_type {config.get('peft_type')!r} is not served, only LORA")
    refusals = {
        "use_dora": (bool(config.get("use_dora")), "DoRA adapters (weight-decomposed LoRA) are not served"),
        "bias": (config.get("bias", "none") not in ("none", None), "adapters that train biases are not served"),
        "modules_to_save": (bool(config.get("modules_to_save")), "modules saved whole beside the adapter "
                            f"({config.get('modules_to_save')}) are not served"),
        "rank_pattern": (bool(config.get("rank_pattern")), "per-module ranks are not served"),
        "alpha_pattern": (bool(config.get("alpha_pattern")), "per-module alphas are not served"),
        "fan_in_fan_out": (bool(config.get("fan_in_fan_out")), "fan-in-fan-out (Conv1D) layouts are not served"),
    }
    for field, (refused, why) in refusals.items():
        if refused:
            raise AdapterError(f"{config_path}: {field}: {why}")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{config_path}: r must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(f"{config_path}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, scaling


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the file's header alone."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > _MAX_HEADER_BYTES:
                raise AdapterError(f"{path}: a safetensors header of {length} bytes is not plausible")
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error) as error:
        raise AdapterError(f"{path} is not a readable safetensors file: {error}") from None
    return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}


def module_of(tensor_name: str) -> tuple[str, str]:
    """("model.layers.0.self_attn.q_proj", "A") for "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    (which: "A", "B" or BASE_LAYER); AdapterError for any other kind of tensor."""
    for suffix, which in LORA_SUFFIXES.items():
        if tensor_name.startswith(PEFT_PREFIX) and tensor_name.endswith(suffix):
            return tensor_name[len(PEFT_PREFIX):-len(suffix)], which
    raise AdapterError(f"tensor {tensor_name!r} is not a LoRA A/B matrix (DoRA magnitudes and other kinds are not "
                       "served)")


def read_adapter(path: str) -> AdapterFiles:
    folder = Path(path)
    if not folder.is_dir():
        raise AdapterError(f"adapter path {path} is not a directory")
    config = _read_config(folder)
    rank, scaling = _check_config(config, folder / CONFIG_FILE)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterError(f"{folder} has no {WEIGHTS_FILE} (only safetensors adapters are served)")
    halves: dict[str, dict[str, tuple[int, int]]] = {}
    embeddings: set[str] = set()  # modules whose halves are lora_embedding_A/B
    for name, shape in safetensors_shapes(weights).items():
        module, which = module_of(name)
        if len(shape) != 2:
            raise AdapterError(f"tensor {name!r} has shape {shape}: a LoRA matrix is 2-D")
        halves.setdefault(module, {})[which] = (shape[0], shape[1])
        if ".lora_embedding_" in name:
            embeddings.add(module)
    for module, pair in halves.items():
        if "A" not in pair or "B" not in pair:
            raise AdapterError(f"module {module!r} has only {sorted(pair)} of its LoRA A and B")
        if pair["A"][0] != rank or pair["B"][1] != rank:
            raise AdapterError(f"module {module!r}: A {list(pair['A'])} and B {list(pair['B'])} do not have rank "
                               f"r = {rank} (adapter_config.json)")
        # PEFT's copy of a vocabulary module: [vocab, hidden], the embedding's input or the head's output first.
        dense = ((pair["A"][1], pair["B"][0]) if module in embeddings else (pair["B"][0], pair["A"][1]))
        if BASE_LAYER in pair and pair[BASE_LAYER] != dense:
            raise AdapterError(f"module {module!r}: base_layer.weight {list(pair[BASE_LAYER])} does not match its "
                               f"LoRA matrices, which imply {list(dense)}")
    if not halves:
        raise AdapterError(f"{weights} holds no LoRA tensors")
    modules = {module: (pair["A"], pair["B"]) for module, pair in halves.items()}
    return AdapterFiles(str(folder), rank, scaling, modules, config.get("base_model_name_or_path"))


def check_adapter(adapter: AdapterFiles, targets: Mapping[str, tuple[int, int]], max_rank: int) -> None:
    """Refuse an adapter the served model cannot run: `targets` maps each LoRA-capable linear's checkpoint name to
    its (input, output) sizes."""
    if adapter.rank > max_rank:
        raise AdapterError(f"adapter {adapter.path} has rank {adapter.rank}, above --max-lora-rank {max_rank}")
    for module, (shape_a, shape_b) in adapter.modules.items():
        sizes = targets.get(module)
        if sizes is None:
            raise AdapterError(f"adapter {adapter.path} targets module {module!r}, which is not a LoRA-capable module "
                               "of the served model (LoRA serves the attention and dense MLP linears, the token "
                               "embedding and the LM head, not MoE experts)")
        if (shape_a[1], shape_b[0]) != sizes:
            raise AdapterError(f"adapter {adapter.path} module {module!r} maps {shape_a[1]} -> {shape_b[0]} features, "
                               f"the served model's {sizes[0]} -> {sizes[1]}: it was trained for another base model")
