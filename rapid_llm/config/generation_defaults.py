"""Sampling defaults from a checkpoint's generation_config.json (`--generation-config`, vLLM's semantics).

`auto` reads the model directory's file, a directory path reads that one, `vllm` ignores it. The
file is read as plain JSON (no transformers), and, as vLLM does through `to_diff_dict()`, a value
equal to transformers' own default counts as unset, so `"top_k": 50` written by `save_pretrained`
does not turn top-k on. The result is a plain dict of SamplingParams field names, applied only to
fields a request leaves unset.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgspec

from rapid_llm.sampling.params import SamplingParams, SamplingParamsError

logger = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field.
_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
# transformers.GenerationConfig's defaults: a file that merely repeats them overrides nothing.
_HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}
FILE_NAME = "generation_config.json"


def generation_defaults(setting: str, model_dir: str) -> dict[str, float | int]:
    """The sampling defaults `--generation-config setting` gives for the checkpoint in `model_dir` (logged)."""
    if setting == "vllm":
        return {}
    if setting == "auto":
        path = Path(model_dir) / FILE_NAME
        if not path.is_file():
            return {}
    else:
        path = Path(setting) / FILE_NAME
        if not path.is_file():
            raise ValueError(f"--generation-config {setting!r} is not a directory holding {FILE_NAME}; pass "
                             "such a directory, auto (the model's) or vllm (ignore it)")
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--generation-config: cannot read {path} ({error}); fix the file or pass "
                         "--generation-config vllm") from None
    defaults = {field: values[key] for key, field in _FIELDS.items()
                if values.get(key) is not None and values[key] != _HF_DEFAULTS.get(key)}
    try:
        # Checked once here: a bad value would otherwise fail every request that leaves the field unset.
        msgspec.convert(defaults, SamplingParams).validate()
    except (msgspec.ValidationError, SamplingParamsError) as error:
        raise ValueError(f"--generation-config: {path} holds an unusable sampling default ({error}); fix the "
                         "file or pass --generation-config vllm") from None
    if defaults:
        logger.info("sampling defaults from %s for fields a request leaves unset: %s (to ignore them, pass "
                    "--generation-config vllm)", path, defaults)
    return defaults
