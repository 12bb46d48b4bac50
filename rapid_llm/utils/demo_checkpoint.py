"""The demo models shipped inside the package (rapid_llm/demo_models/), served when no --model is given.

Three small code models trained by tools/demo_model on CPython's standard library: `demo-target`
(the default; `demo` is the same), `demo-draft` and `demo-moe`. `--model NAME` picks one, but a path
that exists always wins: a local directory called `demo` is served as that directory. Reading what
the log names (architecture, parameter count) touches only JSON headers, so the launcher stays torch-free.
Usage: `model_dir_or_demo(args.model)` -> checkpoint directory; `packaged_demo_name(dir)` -> its short name.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from math import prod
from pathlib import Path

logger = logging.getLogger(__name__)
DEMO_ROOT = Path(__file__).resolve().parent.parent / "demo_models"
DEFAULT_DEMO = "demo-target"
DEMO_MODELS = {"demo-target": "target", "demo-draft": "draft", "demo-draft-1l": "draft-1l", "demo-moe": "moe"}
_ALIASES = {"demo": DEFAULT_DEMO}


def demo_model_dir(name: str) -> Path:
    """The packaged folder of `name` (a key of DEMO_MODELS or the alias demo)."""
    return DEMO_ROOT / DEMO_MODELS[_ALIASES.get(name, name)]


def packaged_demo_name(model_dir: str) -> str | None:
    """The short name of the packaged demo model in `model_dir`, None for any other directory."""
    resolved = Path(model_dir).resolve()
    return next((name for name, folder in DEMO_MODELS.items() if DEMO_ROOT / folder == resolved), None)


def model_dir_or_demo(model: str | None) -> str:
    """The checkpoint directory for `model`: the packaged demo when it is None or a demo name that is
    not an existing path (said so in the log), else `model` unchanged (checked later by the config)."""
    name = DEFAULT_DEMO if model is None else _ALIASES.get(model, model)
    if model is not None and (name not in DEMO_MODELS or os.path.exists(model)):
        return model
    directory = demo_model_dir(name)
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    logger.info("%s: serving the packaged demo model %r (%s, %.1fM parameters, trained on CPython's standard "
                "library) from %s", "no model given" if model is None else f"--model {model}", name, architecture,
                _parameter_count(directory / "model.safetensors") / 1e6, directory)
    return str(directory)


def _parameter_count(weights: Path) -> int:
    """Sum of tensor sizes from the safetensors header (an 8-byte length, then JSON): no weights are read."""
    with weights.open("rb") as file:
        header = json.loads(file.read(struct.unpack("<Q", file.read(8))[0]))
    return sum(prod(tensor["shape"]) for key, tensor in header.items() if key != "__metadata__")
