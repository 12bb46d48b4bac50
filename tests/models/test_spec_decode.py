"""Speculative decoding (n-gram) end to end, scheduler + worker in one process: greedy tokens with speculation
equal those without and transformers' (a tiny random Llama and the demo target), with async scheduling and
the CUDA-style overlap, lock-step, chunked prefill, prefix-cache hits and preemption; drafts are accepted on
the demo target's repetitive code; every KV block is free at the end; a seeded sampled request draws the same
tokens with speculation on and off."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import AutoTokenizer

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_model
from tests.unit.worker_engine import Engine

MAX_TOKENS = 20
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
MODES = {  # name -> (Engine keyword arguments, serve depth, overlap)
    "async-overlap": ({}, 2, True),
    "lockstep": ({}, 1, False),
    "chunked-prefill": ({"max_num_batched_tokens": 12}, 2, False),
    "no-prefix-caching": ({"enable_prefix_caching": False}, 2, False),
    "preemption": ({"num_kv_blocks": 24}, 2, False),
}
CODE = ["def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef add(",
        "import os\nimport sys\nimport os\nimport sys\nimport os\n",
        "for i in range(10):\n    print(i)\nfor i in range(10):\n    print("]


def _runner(model_dir: str) -> ModelRunner:
    config = ModelConfig.from_pretrained(model_dir, dtype="float32", max_model_len=96)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=200), DeviceConfig("cpu"), max_num_seqs=8)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    checkpoint = str(tiny_checkpoint("LlamaForCausalLM"))
    generator = torch.Generator().manual_seed(5)
    motif = torch.randint(10, 400, (6,), generator=generator).tolist()
    # Repeated motifs (plus one shared prompt for prefix-cache hits) give the n-gram lookup something to match.
    prompts = [motif * 6, motif[:3] * 9 + [7], motif * 6, motif[::-1] * 6]
    return _runner(checkpoint), hf_model(checkpoint), prompts


@pytest.fixture(scope="module")
def demo():
    model_dir = model_dir_or_demo("demo-target")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(text) for text in CODE] + [tokenizer.encode(CODE[0])]
    return _runner(model_dir), hf_model(model_dir), prompts


def _hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """Plain argmax continuation with transformers' KV cache (EOS not special, as ignore_eos)."""
    # transformers renamed forward's past_key_values to cache after 5.18; an unknown keyword is silently ignored.
    cache_keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    tokens: list[int] = []
    with torch.inference_mode():
        out = model(torch.tensor([list(prompt)]), use_cache=True)
        for _ in range(new_tokens):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([tokens[-1:]]), use_cache=True, **{cache_keyword: out.past_key_values})
    return tokens


def _serve(runner: ModelRunner, prompts: list[list[int]], params: SamplingParams, speculative, mode: str):
    kwargs, depth, overlap = MODES[mode]
    engine = Engine(runner, speculative=speculative, **kwargs)
    requests = [GenerateRequest(f"r{i}", prompt, params) for i, prompt in enumerate(prompts)]
    outcomes = engine.serve(requests, depth=depth, overlap=overlap)
    stats = engine.scheduler.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    return [outcome["token_ids"] for outcome in outcomes.values()], stats


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def references(tiny, demo):
    return {name: [_hf_greedy(hf, prompt, MAX_TOKENS) for prompt in prompts]
            for name, (_, hf, prompts) in (("tiny", tiny), ("demo", demo))}


def check_mode_stats(stats, mode: str, accepted: bool) -> None:
    """Drafts were verified (and some accepted), and the mode did what it is there for."""
    assert stats.spec_decode_num_drafts > 0
    if accepted:
        assert stats.spec_decode_num_accepted_tokens > 0
    if mode == "preemption":
        assert stats.num_preemptions > 0
    if MODES[mode][0].get("enable_prefix_caching", True):
        assert stats.prefix_cache_hits > 0


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_greedy_tokens_with_speculation_equal_transformers(model: str, mode: str, tiny, demo, references) -> None:
    runner, _, prompts = tiny if model == "tiny" else demo
    tokens, stats = _serve(runner, prompts, GREEDY, NGRAM, mode)
    assert tokens == references[model]
    check_mode_stats(stats, mode, accepted=model == "demo")
    if mode == "async-overlap" and model == "tiny":
        off, _ = _serve(runner, prompts, GREEDY, None, mode)
        assert off == tokens


def test_seeded_sampling_draws_the_same_tokens_with_speculation_on_and_off(demo) -> None:
    runner, _, prompts = demo
    params = SamplingParams(temperature=0.7, top_k=20, seed=11, max_tokens=MAX_TOKENS, ignore_eos=True)
    first, stats = _serve(runner, prompts, params, NGRAM, "async-overlap")
    second, _ = _serve(runner, prompts, params, NGRAM, "lockstep")
    off, _ = _serve(runner, prompts, params, None, "async-overlap")
    assert first == second == off
    assert stats.spec_decode_num_accepted_tokens > 0


def test_rows_that_do_not_speculate_share_verification_steps_unchanged(demo) -> None:
    """Logprobs, penalties, logit_bias, min_tokens and structured output rows beside speculating ones: every
    request's tokens (and logprobs) equal a run without speculation."""
    runner, _, prompts = demo
    greedy = dict(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    params = [SamplingParams(**greedy), SamplingParams(**greedy, logprobs=2),
              SamplingParams(**greedy, repetition_penalty=1.3), SamplingParams(**greedy, logit_bias={13: 2.0}),
              SamplingParams(**greedy, min_tokens=5),
              SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(regex="(def|for) [a-z]+")),
              SamplingParams(temperature=0.9, seed=3, max_tokens=MAX_TOKENS, ignore_eos=True)]
    batch = [prompts[i % len(prompts)] for i in range(len(params))]
    runs = []
    for speculative in (NGRAM, None):
        engine = Engine(runner, speculative=speculative)
        requests = [GenerateRequest(f"r{i}", prompt, p) for i, (prompt, p) in enumerate(zip(batch, params))]
        outcomes = engine.serve(requests, depth=2, overlap=True)
        runs.append((outcomes, engine.scheduler.stats()))
    (on, stats), (off, _) = runs
    assert stats.spec_decode_num_accepted_tokens > 0 and stats.kv_blocks_used == 0
    assert {rid: o["token_ids"] for rid, o in on.items()} == {rid: o["token_ids"] for rid, o in off.items()}
