"""Calibration samples: token windows of the demo models' training text (or a local text file), never downloaded.

`demo-train` is the train split the demo models were trained on (CPython's standard library as
tools/demo_model/data.py selects and verifies it, so it needs this repository's tools/ and the matching
Python); any other value is a path to a UTF-8 text file. Its files are shuffled with a fixed seed and joined;
the first `CHARS_PER_TOKEN * 4` characters per wanted token are tokenized (so a small run does not tokenize
the whole corpus) and cut into non-overlapping windows of `seq_len` tokens, `num_samples` of them drawn
with the same seed.
Usage: `samples, description = calibration_samples("demo-train", tokenizer, 128, 512)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

DEMO_TRAIN = "demo-train"
CHARS_PER_TOKEN = 4  # generous for the demo models' code BPE (about 3 characters per token)


def _demo_train_text(seed: int) -> tuple[str, str]:
    try:
        from tools.demo_model.data import SEPARATOR, SOURCE, load_train
    except ImportError as error:
        raise ValueError(f"--dataset {DEMO_TRAIN} reads the train split through tools/demo_model/data.py, which "
                         f"is not importable here ({error}); run from the repository root or pass a text file") \
            from error
    files = load_train()
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    paths = sorted(files)
    text = "".join(SEPARATOR.format(path=paths[i]) + files[paths[i]] for i in order)  # as the trainer saw files
    return text, f"{DEMO_TRAIN} ({SOURCE}, the demo models' train split)"


def calibration_text(dataset: str, seed: int = 0) -> tuple[str, str]:
    """(text, description for the written config)."""
    if dataset == DEMO_TRAIN:
        return _demo_train_text(seed)
    path = Path(dataset)
    if not path.is_file():
        raise ValueError(f"--dataset {dataset!r} is neither {DEMO_TRAIN} nor a text file")
    return path.read_text(encoding="utf-8"), f"text file {path.name}"


def calibration_samples(dataset: str, tokenizer: Any, num_samples: int, seq_len: int,
                        seed: int = 0) -> tuple[torch.Tensor, str]:
    """([num_samples, seq_len] token ids, description)."""
    text, description = calibration_text(dataset, seed)
    text = text[: CHARS_PER_TOKEN * 4 * num_samples * seq_len]
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    windows = ids.numel() // seq_len
    if windows < num_samples:
        raise ValueError(f"--dataset {dataset}: {ids.numel()} tokens make {windows} windows of {seq_len}, fewer "
                         f"than --num-samples {num_samples}")
    chosen = torch.randperm(windows, generator=torch.Generator().manual_seed(seed))[:num_samples]
    return ids[: windows * seq_len].view(windows, seq_len)[chosen.sort().values], description
