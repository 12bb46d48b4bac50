"""The Triton state ops (causal_conv, gated_delta_rule, ssd_scan) against their torch references, on the state op
cases (rapid_llm/ops/state_op_cases.py: decodes, a mix of prefill chunks and a decode keeping snapshot states, chunks
verifying drafts keeping every state): the output and the whole state tensor, kept rows included.

On CPU they run under Triton's interpreter (tests/kernels/conftest.py); on CUDA (`-m gpu`) compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.ops import gated_delta, ssd, state_conv  # noqa: E402
from rapid_llm.ops.op_case_inputs import SHAPES, CaseConfig, ModelShape  # noqa: E402
from rapid_llm.ops.state_metadata import StateMetadata, kept_states  # noqa: E402
from rapid_llm.ops.state_op_cases import STATE_OP_CASES  # noqa: E402
from rapid_llm.ops.triton import causal_conv as triton_conv  # noqa: E402
from rapid_llm.ops.triton import gated_delta as triton_gated_delta  # noqa: E402
from rapid_llm.ops.triton import ssd as triton_ssd  # noqa: E402

VARIANTS = ("decode", "mixed", "verify")
TOKENS = (1, 7)
# Widths no power-of-two block divides: 100 channels, head dim 12.
ODD_SHAPE = dataclasses.replace(SHAPES["tiny"], hidden_size=100, head_dim=12)
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
# op -> (Triton kernel, torch reference, index of the state argument)
KERNELS: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], int]] = {
    "causal_conv": (triton_conv.causal_conv, state_conv.causal_conv, 1),
    "gated_delta_rule": (triton_gated_delta.gated_delta_rule, gated_delta.gated_delta_rule, 5),
    "ssd_scan": (triton_ssd.ssd_scan, ssd.ssd_scan, 6),
}
# Every op in float32, and in bfloat16 where its cases take it.
OP_DTYPES = [(op, dtype) for op in KERNELS for dtype in ("float32", "bfloat16") if dtype in STATE_OP_CASES[op].dtypes]


def _case(op: str, shape: ModelShape, tokens: int, dtype: torch.dtype, device: torch.device,
          variant: str) -> tuple[Any, ...]:
    return STATE_OP_CASES[op].build(CaseConfig(shape, tokens, dtype, device, seed=tokens), variant).args


def _compare(op: str, args: tuple[Any, ...]) -> None:
    """The kernel's output and state (written in place) against the reference's on a copy of the same inputs."""
    kernel, reference, state_index = KERNELS[op]
    reference_args = tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)
    expected = reference(*reference_args)
    actual = kernel(*args)
    for got, want in ((actual, expected), (args[state_index], reference_args[state_index])):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want.cpu(), **TOLERANCE[args[0].dtype])


def _kept_twice(metadata: StateMetadata) -> StateMetadata:
    """The metadata keeping its first kept token's state in a second, free row too (a snapshot and a draft's
    scratch row can keep the same token)."""
    lengths = (metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]).tolist()
    seqs = torch.searchsorted(metadata.query_start_loc, metadata.kept.tokens, right=True) - 1
    offsets = metadata.kept.tokens - metadata.query_start_loc[seqs]
    kept = list(zip(seqs.tolist(), offsets.tolist(), metadata.kept.targets.tolist()))
    free_row = 15  # the cases keep states in rows below 16 and never in row 15
    kept.append((kept[0][0], kept[0][1], free_row))
    return dataclasses.replace(metadata, kept=kept_states(lengths, kept, metadata.slots.device))


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("op", "dtype"), OP_DTYPES)
def test_state_op(triton_device: torch.device, op: str, dtype: str, variant: str, tokens: int) -> None:
    _compare(op, _case(op, SHAPES["tiny"], tokens, getattr(torch, dtype), triton_device, variant))


def test_causal_conv_with_a_float32_state_of_bfloat16_inputs(triton_device: torch.device) -> None:
    """Gated DeltaNet keeps its conv state in float32: the carried inputs are rounded to bf16 as the reference's."""
    inputs, state, weight, bias, metadata = _case("causal_conv", SHAPES["tiny"], 7, torch.bfloat16, triton_device,
                                                  "mixed")
    _compare("causal_conv", (inputs, state.float(), weight, None, metadata))


@pytest.mark.parametrize("variant", ["decode", "verify"])
@pytest.mark.parametrize("op", KERNELS)
def test_state_op_at_odd_widths(triton_device: torch.device, op: str, variant: str) -> None:
    _compare(op, _case(op, ODD_SHAPE, 7, torch.float32, triton_device, variant))


@pytest.mark.parametrize("op", KERNELS)
def test_state_op_keeps_a_token_in_two_rows(triton_device: torch.device, op: str) -> None:
    *args, metadata = _case(op, SHAPES["tiny"], 7, torch.float32, triton_device, "verify")
    _compare(op, (*args, _kept_twice(metadata)))
