"""Arrival schedules for --request-rate / --burstiness."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.common.traffic import arrival_offsets


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(4, float("inf"), 1.0, seed=0) == [0.0] * 4


def test_finite_rate_ends_at_n_over_rate_and_is_seeded() -> None:
    offsets = arrival_offsets(50, 10.0, 1.0, seed=3)
    assert offsets[-1] == pytest.approx(5.0)
    assert all(b > a for a, b in zip(offsets, offsets[1:]))
    assert arrival_offsets(50, 10.0, 1.0, seed=3) == offsets
    assert arrival_offsets(50, 10.0, 1.0, seed=4) != offsets


def test_gaps_are_gamma_draws_from_the_seeded_legacy_generator() -> None:
    # What vLLM draws after np.random.seed(seed): one np.random.gamma(shape, 1 / (rate * shape)) per request.
    state = np.random.RandomState(7)
    gaps = [state.gamma(shape=0.5, scale=1 / (4.0 * 0.5)) for _ in range(20)]
    expected = np.cumsum(gaps) * (20 / 4.0 / np.sum(gaps))
    assert arrival_offsets(20, 4.0, 0.5, seed=7) == pytest.approx(expected.tolist())


def test_infinite_burstiness_is_evenly_spaced() -> None:
    assert arrival_offsets(4, 2.0, float("inf"), seed=0) == pytest.approx([0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_invalid_settings_raise(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError):
        arrival_offsets(3, rate, burstiness, seed=0)
