"""The worker side of structured output on the tiny tokenizer: specs, the compile cache, matchers rebuilt
after preemption (equal to xgrammar's own rollback), the bitmask through the sampler, logit_bias, and a
request whose grammar fails aborting alone."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.layers.logit_bias import LogitBias
from rapid_llm.layers.sampler import Sampler
from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from rapid_llm.structured.compiler import GrammarCompilerPool
from rapid_llm.structured.grammar_spec import GrammarSpec
from rapid_llm.structured.manager import StructuredOutputs
from rapid_llm.structured.request_matcher import RequestMatcher
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.unit.test_worker_failures import (BLOCK_SIZE, SHARED_PROMPT, Engine, check_only_the_failing_request_aborts,
                                             greedy)

SCHEMA = {"type": "object", "required": ["a", "b"], "properties": {
    "a": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 20}},
    "b": {"type": "string", "maxLength": 4}}}


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> ModelConfig:
    return ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")))


@pytest.fixture(scope="module")
def runner(model: ModelConfig) -> ModelRunner:
    """As tests/unit/test_worker_failures.py's, whose Engine drives it."""
    return ModelRunner(model, CacheConfig(block_size=BLOCK_SIZE, num_blocks=128), DeviceConfig("cpu"), max_num_seqs=8)


@pytest.fixture(scope="module")
def pool(model: ModelConfig) -> GrammarCompilerPool:
    return GrammarCompilerPool(model.model, model.vocab_size, model.eos_token_ids)


def json_spec(schema: dict) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=json.dumps(schema))


def allowed(bitmask: torch.Tensor, row: int, vocab_size: int) -> list[int]:
    bits = (bitmask[row].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab_size].nonzero().flatten().tolist()


def walk(matcher: RequestMatcher, steps: int, vocab_size: int, seed: int) -> tuple[list[int], list[list[int]]]:
    """Accept `steps` random allowed tokens; returns them and the allowed set before each."""
    rng, tokens, masks = random.Random(seed), [], []
    bitmask = torch.empty(1, (vocab_size + 31) // 32, dtype=torch.int32)
    for _ in range(steps):
        matcher.fill(bitmask, 0)
        masks.append(allowed(bitmask, 0, vocab_size))
        tokens.append(rng.choice(masks[-1]))
        matcher.accept(tokens[-1])
    return tokens, masks


def test_specs_of_every_kind() -> None:
    assert GrammarSpec.of(StructuredOutputsParams(json_object=True)) == GrammarSpec("json", '{"type": "object"}')
    assert GrammarSpec.of(StructuredOutputsParams(regex="a+")) == GrammarSpec("regex", "a+")
    choice = GrammarSpec.of(StructuredOutputsParams(choice=['say "hi"', "back\\slash"]))
    assert choice == GrammarSpec("grammar", 'root ::= "say \\"hi\\"" | "back\\\\slash"')
    choice.check()
    # Length-bounded strings become a pattern of printable ASCII but `"` and `\` (xgrammar#800); nothing else changes.
    bounded = json.loads(GrammarSpec.of(json_spec(SCHEMA)).text)
    assert bounded["properties"]["b"] == {"type": "string", "pattern": "^[ !#-\\[\\]-~]{0,4}$"}
    assert bounded["properties"]["a"] == SCHEMA["properties"]["a"]
    untouched = {"type": "string", "maxLength": 4, "enum": ["ab"]}
    assert GrammarSpec.of(json_spec(untouched)).text == json.dumps(untouched)


def test_compiles_are_cached_by_spec(pool: GrammarCompilerPool) -> None:
    first = pool.submit(GrammarSpec("regex", "[ab]{3}"))
    assert pool.submit(GrammarSpec("regex", "[ab]{3}")) is first
    assert pool.submit(GrammarSpec("regex", "[ab]{4}")) is not first
    assert first.result() is not None


@pytest.mark.parametrize("seed", range(4))
def test_a_rebuilt_matcher_equals_the_rolled_back_one(pool: GrammarCompilerPool, model: ModelConfig,
                                                      seed: int) -> None:
    """Preemption re-adds a request with the outputs the scheduler kept: the matcher replayed through them
    allows exactly what the original allowed at that point, and what xgrammar's rollback gives."""
    grammar = pool.submit(GrammarSpec.of(json_spec(SCHEMA)))
    original = RequestMatcher(grammar, [], model.eos_token_ids)
    tokens, masks = walk(original, 12, model.vocab_size, seed)
    bitmask = torch.empty(1, (model.vocab_size + 31) // 32, dtype=torch.int32)
    for kept in (0, 5, 11):
        resumed = RequestMatcher(grammar, tokens[:kept], model.eos_token_ids)
        resumed.fill(bitmask, 0)
        assert allowed(bitmask, 0, model.vocab_size) == masks[kept]
    rolled_back = RequestMatcher(grammar, [], model.eos_token_ids)
    for token in tokens:
        rolled_back.accept(token)
    rolled_back.ready().rollback(len(tokens) - 5)
    rolled_back.fill(bitmask, 0)
    assert allowed(bitmask, 0, model.vocab_size) == masks[5]


def test_a_completed_grammar_allows_only_eos(pool: GrammarCompilerPool, model: ModelConfig) -> None:
    matcher = RequestMatcher(pool.submit(GrammarSpec("regex", "x")), [], model.eos_token_ids)
    bitmask = torch.empty(1, (model.vocab_size + 31) // 32, dtype=torch.int32)
    walk(matcher, 1, model.vocab_size, seed=0)  # "x"
    matcher.fill(bitmask, 0)
    assert allowed(bitmask, 0, model.vocab_size) == sorted(model.eos_token_ids)
    matcher.accept(model.eos_token_ids[0])
    assert matcher.ready().is_terminated()
    matcher.fill(bitmask, 0)  # the step async scheduling planned before it saw EOS: EOS again, then dropped
    assert allowed(bitmask, 0, model.vocab_size) == sorted(model.eos_token_ids)


def test_bitmask_rows_and_rejections(pool: GrammarCompilerPool, model: ModelConfig) -> None:
    structured = StructuredOutputs(pool)
    structured.add(0, SamplingParams(), [])
    assert structured.fill_bitmask([0], torch.device("cpu")) is None  # plain batches build nothing
    structured.add(1, SamplingParams(structured_outputs=StructuredOutputsParams(choice=["yes", "no"])), [])
    structured.add(2, SamplingParams(structured_outputs=StructuredOutputsParams(regex="(")), [])
    assert structured.wait_for_grammars([0, 1]) == {}  # 2 does not sample yet: its error waits
    errors = structured.wait_for_grammars([2])
    assert list(errors) == [2] and "parenthesis" in errors[2]
    bitmask = structured.fill_bitmask([0, 1], torch.device("cpu"))
    assert bitmask.shape == (2, (model.vocab_size + 31) // 32) and bool((bitmask[0] == -1).all())
    first = allowed(bitmask, 1, model.vocab_size)
    assert 0 < len(first) < model.vocab_size
    outside = next(token for token in range(model.vocab_size) if token not in first)
    errors = structured.accept([0, 1], [outside, outside])
    assert list(errors) == [1] and "does not match the grammar" in errors[1]


def sampling_batch(params: list[SamplingParams], vocab_size: int) -> SamplingBatch:
    return SamplingBatch.build([SamplingRequest(p, [1], [], [0]) for p in params], vocab_size, torch.device("cpu"))


@pytest.mark.parametrize("backend", ["torch_ref", "xgrammar"])
def test_the_sampler_samples_only_allowed_tokens(backend: str) -> None:
    from rapid_llm.ops.registry import REGISTRY

    previous = dict(REGISTRY.overrides)
    REGISTRY.set_overrides({**previous, "apply_token_bitmask": backend})
    try:
        vocab_size, generator = 100, torch.Generator().manual_seed(0)
        logits = torch.randn(4, vocab_size, generator=generator)
        allowed_ids = [[3, 64], [99], list(range(100)), [31, 32]]
        bitmask = torch.zeros(4, 4, dtype=torch.int32)
        for row, ids in enumerate(allowed_ids):
            for token in ids:
                bitmask[row, token // 32] |= -(1 << 31) if token % 32 == 31 else 1 << (token % 32)
        params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=1.0, seed=1),
                  SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5)]
        for _ in range(20):
            out = Sampler()(logits, sampling_batch(params, vocab_size), token_bitmask=bitmask)
            assert [token in ids for token, ids in zip(out.token_ids.tolist(), allowed_ids)] == [True] * 4
        assert out.token_ids[0] == max(allowed_ids[0], key=lambda t: logits[0, t])
        # Logprobs stay the model's own distribution (before the mask), as vLLM's raw logprobs.
        assert torch.allclose(out.top_logprobs[0], logits[0].log_softmax(-1).topk(2).values)
    finally:
        REGISTRY.set_overrides(previous)


def test_logit_bias_moves_the_greedy_pick() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 0.0, 1.0]])
    params = [SamplingParams(temperature=0.0, logit_bias={2: 10.0}), SamplingParams(temperature=0.0)]
    bias = LogitBias.build(params, 3, torch.device("cpu"))
    out = Sampler()(logits, sampling_batch(params, 3), logit_bias=bias)
    assert out.token_ids.tolist() == [2, 0] and logits[0, 2] == 1.0  # the caller's logits are untouched
    assert LogitBias.build([SamplingParams()], 3, torch.device("cpu")) is None
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LogitBias.build([SamplingParams(logit_bias={3: 1.0})], 3, torch.device("cpu"))


def test_a_grammar_that_fails_to_compile_aborts_only_its_request(runner: ModelRunner) -> None:
    failing = greedy("failing", SHARED_PROMPT, structured_outputs=StructuredOutputsParams(regex="(unclosed"))
    assert "structured output" in check_only_the_failing_request_aborts(runner, failing)


def test_min_tokens_against_a_completed_grammar_aborts_only_that_request(runner: ModelRunner) -> None:
    """min_tokens bans EOS where the grammar allows nothing else: that request ends with an error."""
    conflicting = GenerateRequest("conflict", SHARED_PROMPT, SamplingParams(
        temperature=0.0, max_tokens=6, min_tokens=5, structured_outputs=StructuredOutputsParams(choice=["x"])))
    fine = greedy("fine", [20, 21, 22])
    outcomes = Engine(runner).serve([conflicting, fine])
    assert outcomes["conflict"]["finish_reason"] == "abort" and "grammar" in outcomes["conflict"]["error"]
    assert outcomes["fine"]["finish_reason"] == "length" and len(outcomes["fine"]["token_ids"]) == 6
