"""Find a checkpoint's safetensors files and stream its tensors memory-mapped (only the ones asked for)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: Path) -> list[Path]:
    """Shards named by the index json if there is one, else the single file, else every *.safetensors."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / name for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{INDEX_FILE} names shard files that are not there: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir} (only safetensors checkpoints are supported)")
    return files


def iterate_tensors(model_dir: Path, wanted: Callable[[str], bool] = lambda name: True,
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs for the names `wanted` accepts; tensors are views into the memory-mapped files
    until copied. Names it refuses are never read (a skipped MTP layer costs no I/O)."""
    files = safetensors_files(model_dir)
    for path in tqdm(files, desc="Loading safetensors shards", unit="shard", disable=None):
        with safe_open(str(path), framework="pt", device="cpu") as shard:
            for name in shard.keys():
                if wanted(name):
                    yield name, shard.get_tensor(name)
