"""Pipeline stages with the other features (the mixed-layout cells of docs/parallelism.md), on CPU gloo ranks with
tiny fp32 checkpoints: structured output (JSON schemas validate, greedy tokens equal one rank's), expert
parallelism (TP=2 x PP=2 with --enable-expert-parallel on Qwen3-MoE: tokens and logprobs = transformers),
online fp8 quantization with per-token activation scales (fp8-rowwise: tokens equal one rank's quantized run; the
per-tensor `fp8` scales a whole batch's activations at once, so micro-batches other than one rank's batches round
differently) and data parallelism (two replicas of two stages: tokens equal one rank's)."""

from __future__ import annotations

import json

import jsonschema

from rapid_llm import LLM, SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from tests.distributed.golden import assert_matches_transformers, generate, random_prompts
from tests.e2e.structured_cases import MAX_TOKENS, SCHEMAS

PROMPTS = random_prompts((9, 14, 5), seed=21)


def test_structured_output_under_pipeline_stages(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    schemas = list(SCHEMAS.values())[:3]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(json=json.dumps(schema)))
              for schema in schemas]
    outputs = {pp: generate(checkpoint, PROMPTS, 1, params, pipeline_parallel_size=pp, num_kv_blocks=256)
               for pp in (1, 2)}
    for schema, output in zip(schemas, outputs[2]):
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), schema)
    assert [output.token_ids for output in outputs[2]] == [output.token_ids for output in outputs[1]]


def test_expert_parallel_stages_match_transformers(tiny_checkpoint) -> None:
    assert_matches_transformers(tiny_checkpoint("Qwen3MoeForCausalLM"), 2, "qwen3-moe tp=2 ep x pp=2",
                                pipeline_parallel_size=2, enable_expert_parallel=True)


def test_quantized_stages_equal_one_rank(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    greedy = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16)
    outputs = {pp: generate(checkpoint, PROMPTS, 1, [greedy] * len(PROMPTS), pipeline_parallel_size=pp,
                            quantization="fp8-rowwise") for pp in (1, 2)}
    assert [output.token_ids for output in outputs[2]] == [output.token_ids for output in outputs[1]]


def test_data_parallel_replicas_of_stages_equal_one_rank(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    greedy = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16)
    with LLM(model=str(checkpoint), pipeline_parallel_size=2, data_parallel_size=2, num_kv_blocks=64) as llm:
        staged = llm.generate(PROMPTS * 2, greedy)
    alone = generate(checkpoint, PROMPTS * 2, 1, [greedy] * 6)
    assert [output.token_ids for output in staged] == [output.token_ids for output in alone]
