"""SamplingParams.validate(): every integer field stays representable where the worker uses it (int64); beam search
refuses what would change the distribution it ranks."""

from __future__ import annotations

import msgspec
import pytest

from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.params import INT64_MAX, INT64_MIN, MAX_N, SamplingParamsError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("n", MAX_N + 1),
        ("max_tokens", 0),
        ("max_tokens", INT64_MAX + 1),
        ("min_tokens", -1),
        ("min_tokens", INT64_MAX + 1),
        ("top_k", -2),
        ("top_k", 2**70),
        ("seed", INT64_MAX + 1),
        ("seed", 2**64 - 1),
        ("seed", INT64_MIN - 1),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [2**64 - 1]),
        ("stop_token_ids", [5, 2**70]),
        ("pooling", "cls"),
    ],
)
def test_out_of_range_fields_are_refused_by_name(field: str, value: object) -> None:
    # max_tokens None, so that a large min_tokens fails on its own bound, not on min <= max.
    params = SamplingParams(**{"max_tokens": None, field: value})
    with pytest.raises(SamplingParamsError) as error:
        params.validate()
    assert error.value.param == field
    assert field in str(error.value)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=MAX_N, seed=INT64_MAX - (MAX_N - 1)),
        SamplingParams(seed=INT64_MIN),
        SamplingParams(seed=INT64_MAX),
        SamplingParams(top_k=INT64_MAX, max_tokens=INT64_MAX, min_tokens=INT64_MAX, stop_token_ids=[INT64_MAX]),
    ],
)
def test_the_bounds_themselves_are_accepted_and_serializable(params: SamplingParams) -> None:
    params.validate()
    # What crosses to the scheduler and worker must encode: msgpack holds int64 (and uint64) only.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params


def test_a_seed_whose_last_choice_would_overflow_is_refused() -> None:
    SamplingParams(n=2, seed=INT64_MAX - 1).validate()
    with pytest.raises(SamplingParamsError) as error:
        SamplingParams(n=2, seed=INT64_MAX).validate()
    assert error.value.param == "seed"


@pytest.mark.parametrize("fields,param", [
    ({"n": 11}, "n"),
    ({"beam_width": 2, "n": 3}, "n"),
    ({"beam_width": 0}, "beam_width"),
    ({"temperature": 0.5}, "temperature"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"top_k": 5}, "top_k"),
    ({"logprobs": 1}, "logprobs"),
    ({"stop": ["x"]}, "stop"),
    ({"early_stopping": "always"}, "early_stopping"),
    ({"length_penalty": float("inf")}, "length_penalty"),
    ({"pooling": "last"}, "pooling"),
])
def test_beam_search_refuses_what_would_change_its_ranking(fields, param) -> None:
    params = SamplingParams(use_beam_search=True, **{"temperature": 0.0, **fields})
    with pytest.raises(SamplingParamsError) as error:
        params.validate()
    assert error.value.param == param


def test_beam_search_is_one_engine_request_of_width_best_of_or_n() -> None:
    params = SamplingParams(use_beam_search=True, temperature=0.0, n=3, early_stopping="never").validate()
    assert params.num_beams == 3 and params.per_choice() == [params]
    assert SamplingParams(use_beam_search=True, temperature=0.0, n=2, beam_width=5).validate().num_beams == 5
    assert SamplingParams(n=2).num_beams == 0 and len(SamplingParams(n=2).per_choice()) == 2
