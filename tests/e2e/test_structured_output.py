"""Structured output end to end on the offline LLM with a random tiny model (which never emits JSON by
itself): every output of every schema parses and validates with `jsonschema`, regex and choice outputs
full-match, with async scheduling on and off, n > 1, a KV cache so small that requests are preempted and
recomputed (the matcher is rebuilt from the outputs kept), and plain greedy requests in the same batch
still equal transformers' greedy tokens."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from rapid_llm import LLM, SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from tests.e2e.structured_cases import CHOICES, MAX_TOKENS, REGEXES, SCHEMAS
from tests.hf_reference import hf_greedy, hf_model

PROMPTS = [[11, 42, 7], [300, 5, 77, 12, 9], [101]]
ENGINES = {"async": {}, "lock-step": {"disable_async_scheduling": True}}
# 40 blocks of 4 tokens for dozens of ~60-token requests: preempted and recomputed over and over.
PREEMPTION = {"num_kv_blocks": 40, "block_size": 4, "max_model_len": 160, "log_level": "warning"}
SAMPLINGS = [{"temperature": 0.0}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.8, "top_p": 0.9}]


def json_params(schema: dict, **overrides: object) -> SamplingParams:
    return SamplingParams(structured_outputs=StructuredOutputsParams(json=json.dumps(schema)),
                          **{"temperature": 0.0, "max_tokens": MAX_TOKENS, **overrides})


@pytest.fixture(scope="module", params=list(ENGINES))
def llm(request, checkpoint):
    with LLM(model=str(checkpoint), num_kv_blocks=256, **ENGINES[request.param]) as engine:
        yield engine


def check_json(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


def generate_every_schema(llm: LLM, schemas: dict[str, dict], max_tokens: int) -> None:
    requests = [(name, prompt, json_params(schema, max_tokens=max_tokens, **sampling))
                for name, schema in schemas.items() for prompt in PROMPTS for sampling in SAMPLINGS]
    outputs = llm.generate([prompt for _, prompt, _ in requests], [params for _, _, params in requests])
    for (name, _, _), output in zip(requests, outputs):
        assert output.finish_reason == "stop", (name, output.text)
        check_json(output.text, schemas[name])


def test_every_schema_output_validates(llm) -> None:
    generate_every_schema(llm, SCHEMAS, MAX_TOKENS)


def test_json_object_outputs_parse(llm) -> None:
    """json_object's language is unbounded; these seeds' outputs end well inside the context (a length
    finish would truncate, as in vLLM), and every one is a JSON object."""
    params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=500,
                             structured_outputs=StructuredOutputsParams(json_object=True))
              for temperature in (0.0, 1.0) for seed in range(6)]
    for output in llm.generate([PROMPTS[0]] * len(params), params):
        assert output.finish_reason == "stop"
        assert isinstance(json.loads(output.text), dict)


def test_preempted_requests_still_follow_the_schema(checkpoint, capfd) -> None:
    """Recompute re-adds a request with its outputs: its matcher is rebuilt through exactly those."""
    # The cache holds 160 tokens: a prompt plus 100 tokens fits; nested_arrays' longest output may not.
    schemas = {name: schema for name, schema in SCHEMAS.items() if name != "nested_arrays"}
    with LLM(model=str(checkpoint), **PREEMPTION) as llm:
        generate_every_schema(llm, schemas, 100)
    assert "preempted request" in capfd.readouterr().err


def test_regex_and_choice_outputs_full_match(llm) -> None:
    constraints = [StructuredOutputsParams(regex=regex) for regex in REGEXES]
    constraints += [StructuredOutputsParams(choice=choice) for choice in CHOICES]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=60, structured_outputs=constraint)
              for constraint in constraints for seed in range(4)]
    outputs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(params))], params)
    for p, output in zip(params, outputs):
        constraint = p.structured_outputs
        assert output.finish_reason == "stop"
        if constraint.regex is not None:
            assert re.fullmatch(constraint.regex, output.text), (constraint.regex, output.text)
        else:
            assert output.text in constraint.choice


def test_n_choices_each_follow_the_schema(llm) -> None:
    schema = SCHEMAS["array_of_objects"]
    [output] = llm.generate([PROMPTS[1]], json_params(schema, temperature=1.0, seed=3, n=6, max_tokens=100))
    texts = [choice.text for choice in output.outputs]
    for text in texts:
        check_json(text, schema)
    assert len(set(texts)) > 1  # seed + i per choice: the choices are sampled independently


def test_outputs_are_reproducible_and_plain_requests_unaffected(llm, checkpoint) -> None:
    """Greedy plain requests batched with constrained ones equal transformers' greedy; seeded
    constrained outputs are the same in every run and schedule."""
    plain = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=20)
    constrained = json_params(SCHEMAS["nested_objects"], temperature=1.0, seed=9, max_tokens=100)
    outputs = llm.generate(PROMPTS + PROMPTS, [plain] * len(PROMPTS) + [constrained] * len(PROMPTS))
    assert [o.token_ids for o in outputs[: len(PROMPTS)]] == hf_greedy(hf_model(checkpoint), PROMPTS, 20)
    again = llm.generate(PROMPTS, constrained)
    assert [o.text for o in again] == [o.text for o in outputs[len(PROMPTS):]]
    expected = EXPECTED_SEEDED.setdefault("nested_objects", [o.text for o in again])
    assert [o.text for o in again] == expected  # the same with async scheduling on and off


EXPECTED_SEEDED: dict[str, list[str]] = {}


def test_logit_bias_steers_greedy_tokens(llm) -> None:
    [plain] = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=5))
    favoured = (plain.token_ids[0] + 1) % 500
    [biased] = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=5, logit_bias={favoured: 100}))
    assert biased.token_ids == [favoured] * 5
    # A bias against the greedy token moves the first pick to another one; nothing else changes.
    [against] = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=1,
                                                           logit_bias={plain.token_ids[0]: -100}))
    assert against.token_ids[0] != plain.token_ids[0]
