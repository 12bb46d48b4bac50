"""The pieces every op case is built from: model shapes, a case's configuration, seeded inputs, `OpCase`.

`rapid_llm/ops/op_cases.py` and `rapid_llm/ops/state_op_cases.py` build their cases on these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 8
    experts_per_token: int = 2
    moe_intermediate_size: int = 256
    block_size: int = 16
    kv_lora_rank: int = 128  # MLA latent width (DeepSeek-V2-Lite: 512)
    qk_rope_head_dim: int = 32


SHAPES: dict[str, ModelShape] = {
    # Odd widths (intermediate 88, vocab 1000) so no implementation gets only powers of two.
    "tiny": ModelShape(64, 4, 2, 16, 88, 1000, num_experts=4, moe_intermediate_size=24, kv_lora_rank=32,
                       qk_rope_head_dim=8),
    # benchmarks/peers/compare_cpu.sh's models, with a Llama-2 vocabulary.
    "llama-10m": ModelShape(256, 8, 4, 32, 1024, 32000),
    "llama-100m": ModelShape(768, 12, 4, 64, 2560, 32000),
    "qwen2.5-0.5b": ModelShape(896, 14, 2, 64, 4864, 151936),
}


@dataclass(frozen=True)
class CaseConfig:
    shape: ModelShape
    num_tokens: int  # tokens of the step (sampling: rows; attention decode: sequences)
    dtype: torch.dtype
    device: torch.device
    context_len: int = 64  # tokens already cached per sequence in the attention cases
    seed: int = 0


@dataclass(frozen=True)
class OpInputs:
    args: tuple[Any, ...]
    label: str  # the shape, for tables


def _call(fn: Any, args: tuple[Any, ...]) -> Any:
    return fn(*args)


def _unprepared(fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return args


@dataclass(frozen=True)
class OpCase:
    build: Callable[[CaseConfig, str], OpInputs]
    variants: tuple[str, ...] = ("",)
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    why_dtypes: str = ""  # why `dtypes` is narrower than every dtype
    exact: bool = False  # outputs must equal torch_ref's bit for bit (copies, selections)
    prepare: Callable[[Any, tuple[Any, ...]], tuple[Any, ...]] = _unprepared
    run: Callable[[Any, tuple[Any, ...]], Any] = _call


@dataclass
class CaseInputs:
    """Seeded random tensors built on the CPU, then moved to the case's device and dtype."""

    config: CaseConfig
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.config.seed)

    def randn(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        values = torch.randn(shape, generator=self.generator) * scale
        return values.to(self.config.device, dtype or self.config.dtype)

    def randperm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.generator).to(self.config.device)
