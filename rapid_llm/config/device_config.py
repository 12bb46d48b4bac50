"""DeviceConfig: which device the worker computes on, resolved once in the launcher without torch.

`torch.cuda.is_available()` would import torch into the HTTP process, so "auto" asks the same two
questions directly: is the installed torch a CUDA build (it ships libtorch_cuda), and does the CUDA
driver count a visible device (cuInit + cuDeviceGetCount, what the CUDA runtime asks; it honours
CUDA_VISIBLE_DEVICES and creates no context)? The worker receives the resolved `type`.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def torch_sees_cuda() -> bool:
    """What `torch.cuda.is_available()` answers for a CUDA build of torch, without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    torch_lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if not any(torch_lib.glob("libtorch_cuda*.so")):
        return False
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


@dataclass(frozen=True)
class DeviceConfig:
    """`device="auto"` picks CUDA when torch can use it, else the CPU; `type` is the one picked."""

    device: str = "auto"
    type: str = field(init=False)

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        has_cuda = self.device != "cpu" and torch_sees_cuda()
        if self.device == "cuda" and not has_cuda:
            raise ValueError("--device cuda was asked for but torch sees no CUDA device; use --device cpu or auto")
        object.__setattr__(self, "type", "cuda" if has_cuda else "cpu")

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.type)
