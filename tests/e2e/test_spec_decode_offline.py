"""Speculative decoding through the engine processes: `LLM(..., speculative_config={...})` on the demo target
gives transformers' greedy tokens (the config crosses into the scheduler process), and bad configs fail at
construction, before any process starts, naming the field."""

from __future__ import annotations

import pytest

from rapid_llm import LLM, SamplingParams
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
from tests.hf_reference import hf_model
from tests.models.test_spec_decode import CODE, _hf_greedy

NEW_TOKENS = 24


def test_offline_greedy_with_ngram_speculation_equals_transformers() -> None:
    model_dir = model_dir_or_demo("demo-target")
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with LLM("demo-target", dtype="float32", max_model_len=256, num_kv_blocks=64,
             speculative_config={"method": "ngram", "num_speculative_tokens": 3}) as llm:
        outputs = llm.generate(CODE, params)
    hf = hf_model(model_dir)
    prompts = [output.prompt_token_ids for output in outputs]
    assert [output.token_ids for output in outputs] == [_hf_greedy(hf, prompt, NEW_TOKENS) for prompt in prompts]


def test_a_bad_speculative_config_fails_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"--speculative-config: .*prompt_lookup_maximum"):
        LLM("demo-target", speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                               "prompt_lookup_maximum": 2})
