"""Checks on the --model and --tokenizer directories that run before anything is loaded.

Plain filesystem and JSON only, so a wrong path or a missing tokenizer is refused in a fraction of a
second with a one-line cause naming the flag and the fix, instead of after the children started (or,
for a missing tokenizer, never: the server used to answer every request with empty text).
"""

from __future__ import annotations

import re
from pathlib import Path

# Any one of these is enough for AutoTokenizer / tokenizers to build a vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def check_model_dir(model: str) -> None:
    """Raise ValueError (one line) unless `model` is an existing local directory."""
    path = Path(model)
    if path.is_dir():
        return
    if not path.exists() and _HUB_ID.fullmatch(model):
        # huggingface_hub 1.0 removed `huggingface-cli`; `hf` is its command line since.
        raise ValueError(f"--model {model!r} is not a local directory, and hub ids are not downloaded; pass a "
                         f"local directory, e.g. the one `python tools/download_model.py {model}` prints last "
                         f"(in a clone of rapid_llm) or DIR after `hf download {model} --local-dir DIR`")
    problem = "is a file, not a directory" if path.exists() else "does not exist"
    raise ValueError(f"--model {model!r} {problem}; pass a local Hugging Face checkpoint directory")


def check_tokenizer_dir(tokenizer: str, explicit: bool) -> None:
    """Raise ValueError unless `tokenizer` holds tokenizer files; `explicit`: it came from --tokenizer."""
    path = Path(tokenizer)
    if path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES):
        return
    wanted = ", ".join(TOKENIZER_FILES)
    if explicit:
        raise ValueError(f"--tokenizer {tokenizer!r} holds no tokenizer files ({wanted}); pass the directory "
                         "that holds the model's tokenizer")
    raise ValueError(f"--model {tokenizer!r} has no tokenizer files ({wanted}); pass --tokenizer DIR with the "
                     "directory that holds the model's tokenizer")
