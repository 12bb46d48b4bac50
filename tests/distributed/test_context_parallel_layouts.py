"""Context parallelism with the other features (the mixed-layout cells of docs/parallelism.md), on CPU gloo ranks
with tiny fp32 checkpoints: structured output (JSON schemas validate, greedy tokens equal one rank's) under
`--pcp 2` and `--tp 2 --dcp 2`; expert parallelism (Qwen3-MoE, --enable-expert-parallel: tokens and logprobs =
transformers) under `--tp 2 --pcp 2` and `--tp 2 --dcp 2`; online fp8-rowwise quantization under `--pcp 2` (tokens
equal one rank's quantized run; DCP needs TP, which refuses quantized linears); data parallelism (two replicas of
each layout: tokens equal one rank's)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from rapid_llm import LLM, SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from tests.distributed.golden import assert_matches_transformers, generate, random_prompts
from tests.e2e.structured_cases import MAX_TOKENS, SCHEMAS

PROMPTS = random_prompts((9, 14, 5), seed=21)
# (tensor-parallel size, the layout's other engine arguments); DCP splits one KV head over its TP ranks.
LAYOUTS = {"pcp2": (1, {"prefill_context_parallel_size": 2}),
           "tp2-dcp2": (2, {"decode_context_parallel_size": 2})}
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16)


def _checkpoint(tiny_checkpoint, architecture: str, layout: str):
    return (tiny_checkpoint(architecture, num_key_value_heads=1) if "dcp" in layout
            else tiny_checkpoint(architecture))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_structured_output_under_context_parallelism(tiny_checkpoint, layout: str) -> None:
    checkpoint = _checkpoint(tiny_checkpoint, "LlamaForCausalLM", layout)
    tp, args = LAYOUTS[layout]
    schemas = list(SCHEMAS.values())[:3]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(json=json.dumps(schema)))
              for schema in schemas]
    split = generate(checkpoint, PROMPTS, tp, params, num_kv_blocks=256, **args)
    alone = generate(checkpoint, PROMPTS, 1, params, num_kv_blocks=256)
    for schema, output in zip(schemas, split):
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), schema)
    assert [output.token_ids for output in split] == [output.token_ids for output in alone]


@pytest.mark.parametrize("layout", ["tp2-pcp2", "tp2-dcp2"])
def test_expert_parallelism_under_context_parallelism(tiny_checkpoint, layout: str) -> None:
    checkpoint = _checkpoint(tiny_checkpoint, "Qwen3MoeForCausalLM", layout)
    size = {"prefill_context_parallel_size" if "pcp" in layout else "decode_context_parallel_size": 2}
    assert_matches_transformers(checkpoint, 2, f"qwen3-moe {layout} ep", enable_expert_parallel=True, **size)


def test_quantized_pcp_equals_one_rank(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    outputs = {pcp: generate(checkpoint, PROMPTS, 1, [GREEDY] * len(PROMPTS), prefill_context_parallel_size=pcp,
                             quantization="fp8-rowwise") for pcp in (1, 2)}
    assert [output.token_ids for output in outputs[2]] == [output.token_ids for output in outputs[1]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_data_parallel_replicas_equal_one_rank(tiny_checkpoint, layout: str) -> None:
    checkpoint = _checkpoint(tiny_checkpoint, "LlamaForCausalLM", layout)
    tp, args = LAYOUTS[layout]
    with LLM(model=str(checkpoint), tensor_parallel_size=tp, data_parallel_size=2, num_kv_blocks=64, **args) as llm:
        split = llm.generate(PROMPTS * 2, GREEDY)
    alone = generate(checkpoint, PROMPTS * 2, 1, [GREEDY] * 6)
    assert [output.token_ids for output in split] == [output.token_ids for output in alone]
