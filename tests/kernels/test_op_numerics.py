"""Numerics matrix: every registered implementation of every op against torch_ref, per device, dtype and edge
shape, on the inputs of `rapid_llm/ops/op_cases.py` (attention through build_metadata + forward over a paged
cache). Implementations are read from the registry; one whose conditions do not hold is a skip naming why."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rapid_llm import ops
from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.op_case_inputs import SHAPES, CaseConfig
from rapid_llm.ops.op_cases import OP_CASES
from rapid_llm.ops.registry import REGISTRY, NoImplementationError

REFERENCE = ops.catalog.REFERENCE
SHAPE = SHAPES["tiny"]
TOKENS = (1, 7, 33)  # one token; lengths unaligned to the 16-token block
# (rtol, atol): an implementation may sum in another order, so about two roundings of the dtype.
TOLERANCES = {"float32": (1e-5, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)}
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
MATRIX = [pytest.param(op, backend, variant, id=f"{op}-{backend}" + (f"-{variant}" if variant else ""))
          for op, backends in REGISTRY.backends().items() if op in OP_CASES
          for backend in backends for variant in OP_CASES[op].variants]


def test_every_registered_op_has_a_case() -> None:
    assert set(OP_CASES) == set(REGISTRY.backends())


def _selected(op: str, backend: str, device: str, dtype: str, args: tuple[Any, ...]) -> Any:
    try:
        return REGISTRY.implementation(op, backend, device, dtype, REGISTRY.call_shape(op, *args)).fn
    except NoImplementationError as error:
        pytest.skip(str(error))


def _cloned(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)


def _outputs(result: Any, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """What a call produced: its results and its (possibly written in place) tensor arguments."""
    results = list(result) if isinstance(result, tuple) else [] if result is None else [result]
    return results + [arg for arg in args if isinstance(arg, torch.Tensor)]


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("op", "backend", "variant"), MATRIX)
def test_implementation_matches_torch_ref(op: str, backend: str, variant: str, device: str, dtype: str,
                                          tokens: int) -> None:
    case = OP_CASES[op]
    if dtype not in case.dtypes:
        pytest.skip(f"{op} is called in {'/'.join(case.dtypes)} only: {case.why_dtypes}")
    config = CaseConfig(SHAPE, tokens, dtype_from_name(dtype), torch.device(device), context_len=20, seed=tokens)
    args = case.build(config, variant).args
    implementation = _selected(op, backend, device, dtype, args)
    reference = _selected(op, REFERENCE, device, dtype, args)
    reference_args = _cloned(args)
    expected = _outputs(case.run(reference, case.prepare(reference, reference_args)), reference_args)
    actual = _outputs(case.run(implementation, case.prepare(implementation, args)), args)
    assert len(actual) == len(expected)
    rtol, atol = (0.0, 0.0) if case.exact else TOLERANCES[dtype]
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        if got.element_size() == 1 and got.is_floating_point():  # fp8 arguments (unchanged): assert_close is bitwise
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            continue
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
