"""Pooled prompts (embeddings) as the HTTP route and the offline `LLM.embed` both read them: which pooling a
checkpoint declares, and the normalisation applied to the vector the worker pools.

Key design choice: the pooling kind comes from the checkpoint's sentence-transformers files (`modules.json` ->
the Pooling module's `config.json`), as vLLM reads them; a decoder checkpoint without them pools its last token
(Qwen3-Embedding's choice). Torch-free: the vector is a list of floats by the time it gets here.
Usage: `SamplingParams(max_tokens=1, pooling=checkpoint_pooling(model_dir))`; `normalized(delta.embedding)`.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

# sentence-transformers' pooling modes that decoder checkpoints use, and the engine's names for them.
_POOLING_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}


@lru_cache(maxsize=8)
def checkpoint_pooling(model_path: str) -> str:
    """The pooling a sentence-transformers checkpoint declares ("last" or "mean"); "last" without one. Raises
    ValueError for a pooling the engine does not do (e.g. CLS)."""
    modules_file = Path(model_path) / "modules.json"
    if not modules_file.is_file():
        return "last"
    for module in json.loads(modules_file.read_text()):
        if module.get("type", "").endswith("Pooling"):
            config = json.loads((Path(model_path) / module["path"] / "config.json").read_text())
            modes = [mode for mode, enabled in config.items() if mode.startswith("pooling_mode_") and enabled]
            if len(modes) != 1 or modes[0] not in _POOLING_MODES:
                raise ValueError(f"{model_path}: sentence-transformers pooling {modes} is not supported; "
                                 f"rapid_llm pools by one of {sorted(_POOLING_MODES)}")
            return _POOLING_MODES[modes[0]]
    return "last"


def normalized(vector: list[float]) -> list[float]:
    """`vector` scaled to unit L2 norm (a zero vector stays zero)."""
    norm = math.sqrt(sum(value * value for value in vector)) or 1.0
    return [value / norm for value in vector]
