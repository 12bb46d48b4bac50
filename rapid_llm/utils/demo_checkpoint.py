"""The built-in demo checkpoint served when no --model is given.

A small random Llama with a locally trained tokenizer, built on first use into the user's cache
directory, so `python -m rapid_llm.launch_server` works on any machine without a download. It
produces random text; it exists to show the server working, not to answer questions.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
DEMO_NAME = "demo-llama-v1"
DEMO_CONFIG = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
               "intermediate_size": 512, "max_position_embeddings": 2048}


def demo_checkpoint_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rapid_llm" / DEMO_NAME


def ensure_demo_checkpoint() -> tuple[Path, bool]:
    """Return (directory, built_now); build into a temporary directory and rename, so a
    half-written checkpoint is never left behind for the next start."""
    target = demo_checkpoint_dir()
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target, False
    # Imported here: it pulls in torch and transformers, which a start-up that fails early never needs.
    from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}-", dir=target.parent))
    build_tiny_checkpoint(staging, "LlamaForCausalLM", **DEMO_CONFIG)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target, True


def model_dir_or_demo(model: str | None) -> str:
    """`model`, or the demo checkpoint (built on first use, and said so in the log) when it is None."""
    if model is not None:
        return model
    demo_dir, built = ensure_demo_checkpoint()
    logger.info("no model given: serving the built-in demo checkpoint (random weights, locally built tokenizer) "
                "%s %s", "built now at" if built else "from", demo_dir)
    return str(demo_dir)
