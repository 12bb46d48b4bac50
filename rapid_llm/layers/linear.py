"""Linear layers that own their weight layout and how checkpoint tensors load into it.

Column-parallel layers shard the output features over tensor-parallel ranks, row-parallel
layers shard the input features and all-reduce. Merged layers (q/k/v, gate/up) hold several
checkpoint matrices stacked in one weight so one GEMM serves them all; their `weight_loader`
takes a `shard_id` saying which slice a checkpoint tensor fills. After loading, `prepare_weights`
selects the layer's linear kernel (the "linear" op, for the weight's device and dtype) and stores
the weight in that kernel's format (rapid_llm/ops/linear_kernel.py). A quantized layer gets a linear method
(rapid_llm/quantization/linear_method.py) before loading: it swaps in the checkpoint's quantized parameters,
and its `prepare` installs the kernel that reads them.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size, tp_all_reduce
from rapid_llm.ops.linear_kernel import TORCH_LINEAR, LinearKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.layers.weight_utils import copy_weight, default_weight_loader
from rapid_llm.quantization.linear_method import LinearMethod


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})")
    return numerator // denominator


def select_linear_kernel(weight: torch.Tensor) -> LinearKernel:
    return REGISTRY.select("linear", weight.device, weight.dtype).fn


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        super().__init__()
        # This rank's logical sizes (the weight's shape may change with its kernel's or quantization's format).
        self.input_size, self.output_size = input_size, output_size
        self.kernel: LinearKernel = TORCH_LINEAR  # until prepare_weights: the checkpoint layout
        self.linear_method: LinearMethod | None = None  # None: the weight stays in the model dtype
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        default_weight_loader(param, loaded, shard_id)

    def shard_ids(self) -> tuple[str | int | None, ...]:
        """The shard ids checkpoint tensors load with (None: one unstacked matrix)."""
        return (None,)

    def output_slice(self, shard_id: str | int | None) -> tuple[int, int, int]:
        """(first row in this rank's weight, rows, first row in the checkpoint tensor) a shard fills; quantized
        formats slice their per-row and per-block scales with it too."""
        return 0, self.output_size, 0

    def checkpoint_shape(self, shard_id: str | int | None) -> tuple[int, int]:
        """(rows, columns) of the checkpoint matrix a shard loads from, before any sharding."""
        return self.output_slice(shard_id)[1], self.input_size

    def set_linear_method(self, method: LinearMethod) -> None:
        """Before loading: let `method` own the weight format (it creates the parameters the checkpoint fills)."""
        self.linear_method = method
        method.create_weights(self)

    def prepare_weights(self) -> None:
        """Once, after loading: pick the kernel and put the weight in its format (from then on `weight` is
        in that format, e.g. oneDNN's opaque layout, not the checkpoint's). A second call does nothing."""
        if self.kernel is not TORCH_LINEAR:
            return
        if self.linear_method is not None:
            self.linear_method.prepare(self)
            return
        self.kernel = select_linear_kernel(self.weight)
        self.weight = nn.Parameter(self.kernel.prepare(self.weight.data), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """y = xWᵀ with W's output rows split over ranks; each rank keeps its slice of y."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        super().__init__(input_size, _divide(output_size, self.tp_size, "output features"), bias)

    def output_slice(self, shard_id: str | int | None) -> tuple[int, int, int]:
        rows = self.output_size
        return 0, rows, self.tp_rank * rows

    def checkpoint_shape(self, shard_id: str | int | None) -> tuple[int, int]:
        return self.output_slice(shard_id)[1] * self.tp_size, self.input_size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        start, rows, source = self.output_slice(shard_id)
        copy_weight(param.data.narrow(0, start, rows), loaded.narrow(0, source, rows))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices (e.g. gate and up) stacked along the output dim."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def shard_ids(self) -> tuple[str | int | None, ...]:
        return tuple(range(len(self.output_sizes)))

    def output_slice(self, shard_id: str | int | None) -> tuple[int, int, int]:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"merged linear shard_id must be in [0, {len(self.output_sizes)}), got {shard_id!r}")
        rows = self.output_sizes[shard_id] // self.tp_size
        return sum(self.output_sizes[:shard_id]) // self.tp_size, rows, self.tp_rank * rows


class ChunkedColumnParallelLinear(MergedColumnParallelLinear):
    """A merged layer whose checkpoint stores the stacked matrix whole (LFM2's in_proj: B, C and x chunks): each
    chunk is sharded over ranks on its own, so a rank's slice of every chunk lines up with its channels."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if shard_id is not None:
            super().weight_loader(param, loaded, shard_id)
            return
        if loaded.shape[0] != sum(self.output_sizes):
            raise ValueError(f"checkpoint tensor of {loaded.shape[0]} rows does not hold the chunks "
                             f"{self.output_sizes}")
        for index, rows in enumerate(self.output_sizes):
            super().weight_loader(param, loaded.narrow(0, sum(self.output_sizes[:index]), rows), index)

    def shard_ids(self) -> tuple[str | int | None, ...]:
        return (None,)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one weight, split over ranks by attention head.

    When there are fewer KV heads than ranks, each KV head is replicated on several ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        tp_size = get_tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size, "attention heads")
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        if num_kv_heads >= tp_size:
            _divide(num_kv_heads, tp_size, "key/value heads")
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, output_size, bias)

    def shard_ids(self) -> tuple[str | int | None, ...]:
        return ("q", "k", "v")

    def output_slice(self, shard_id: str | int | None) -> tuple[int, int, int]:
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            start, rows, source_index = 0, q_rows, self.tp_rank
        elif shard_id in ("k", "v"):
            start = q_rows if shard_id == "k" else q_rows + kv_rows
            rows, source_index = kv_rows, self.tp_rank // self.kv_replicas
        else:
            raise ValueError(f"qkv shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        return start, rows, source_index * rows

    def checkpoint_shape(self, shard_id: str | int | None) -> tuple[int, int]:
        # A KV head replicated on several ranks is one checkpoint head.
        replicas = 1 if shard_id == "q" else self.kv_replicas
        return self.output_slice(shard_id)[1] * self.tp_size // replicas, self.input_size


class RowParallelLinear(LinearBase):
    """y = xWᵀ with W's input columns split over ranks; partial results are all-reduced, unless
    `reduce_results=False`: the caller then sums the ranks' partial y (an MoE block reduces its shared
    experts together with the routed ones, once); it then has no bias, which would be added on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True) -> None:
        if bias and not reduce_results:
            raise ValueError("a row-parallel linear whose caller reduces its results cannot have a bias")
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.reduce_results = reduce_results
        super().__init__(_divide(input_size, self.tp_size, "input features"), output_size, bias)

    def input_slice(self) -> tuple[int, int]:
        """(first column in the checkpoint tensor, columns) this rank's weight holds."""
        cols = self.input_size
        return self.tp_rank * cols, cols

    def checkpoint_shape(self, shard_id: str | int | None) -> tuple[int, int]:
        return self.output_size, self.input_size * self.tp_size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if param.dim() == 1:
            default_weight_loader(param, loaded, shard_id)
            return
        source, cols = self.input_slice()
        copy_weight(param.data, loaded.narrow(1, source, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine(self.kernel(x, self.weight))

    def combine(self, partial: torch.Tensor) -> torch.Tensor:
        """What follows the GEMM: this rank's partial output summed over ranks, then the bias (a LoRA wrapper adds
        its own partial product before it)."""
        if not self.reduce_results:
            return partial
        # Bias after the reduce, so it is added once rather than once per rank.
        output = tp_all_reduce(partial) if self.tp_size > 1 else partial  # one rank: skip the group lookups
        return output + self.bias if self.bias is not None else output
