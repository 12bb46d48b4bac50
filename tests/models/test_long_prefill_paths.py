"""Greedy tokens match transformers when prefills take the fast attention paths (`is_causal`, split at context).

Prompts long enough that 64-token chunks after cached context reach `context_split.MIN_SPLIT_QUERY_LEN`,
and whole prompts in one step take `is_causal`; both while another request decodes.
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.attention.context_split import MIN_SPLIT_QUERY_LEN
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.models.paged_generation import generate

NEW_TOKENS = 16


@pytest.mark.parametrize("chunk_size", [None, MIN_SPLIT_QUERY_LEN])
def test_long_prefill_greedy_matches_transformers(tiny_checkpoint, chunk_size: int | None) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=512)
    runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint)), CacheConfig(block_size=16, num_blocks=64),
                         DeviceConfig("cpu"))
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, runner.model_config.vocab_size, (n,), generator=generator).tolist()
               for n in (230, 150)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    sequences = generate(runner, prompts, params, chunk_size=chunk_size, stagger=2)
    assert [s.output for s in sequences] == hf_greedy(hf_model(checkpoint, torch.float32), prompts, NEW_TOKENS)
    assert len({token for s in sequences for token in s.output}) > 5, "degenerate test: outputs barely vary"
