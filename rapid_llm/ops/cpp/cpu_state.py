"""The `cpu_cpp` decode forms of gated_delta_rule and ssd_scan: one token per sequence, each state row updated in
place by the CPU extension (`csrc/state_decode.cpp`), where the torch forms gather the step's rows, update the copy
and scatter it back. Same signatures and results as the torch references (float32 state and math); the inputs are
made contiguous float32 here (a token's few vectors), and kept states (a snapshot at a block boundary) are copied
from the updated rows after the step.
Usage: chosen by priority on a CPU for steps of one token per sequence, or `--op-backend ssd_scan=cpu_cpp`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.state_metadata import StateMetadata


def _float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous()


def _keep(state: torch.Tensor, metadata: StateMetadata) -> None:
    if metadata.kept is not None:
        state[metadata.kept.targets] = state[metadata.slots[metadata.kept.tokens]]


def gated_delta_rule_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                            beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    output = CPU_OPS.load().gated_delta_rule_decode(_float(query), _float(key), _float(value), _float(g),
                                                     _float(beta), state, metadata.slots)
    _keep(state, metadata)
    return output.to(value.dtype)


def ssd_scan_decode(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                    D: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    output = CPU_OPS.load().ssd_scan_decode(_float(x), _float(dt), _float(A), _float(B), _float(C), _float(D), state,
                                            metadata.slots)
    _keep(state, metadata)
    return output
