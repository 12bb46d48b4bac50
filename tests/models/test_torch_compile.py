"""`--enable-torch-compile`: decode steps through the torch.compile'd (inductor) forward give the greedy tokens
of the eager forward and of transformers, on the CPU, with chunked prefill and staggered arrivals (mixed
steps run eagerly, decode steps compiled)."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, CompilationConfig, DeviceConfig, ModelConfig
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.models.paged_generation import generate

NEW_TOKENS = 12


@pytest.mark.slow
def test_compiled_decode_gives_the_eager_greedy_tokens(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    config = ModelConfig.from_pretrained(str(checkpoint))
    compiled = ModelRunner(config, CacheConfig(block_size=16, num_blocks=32), DeviceConfig("cpu"), max_num_seqs=4,
                           compilation=CompilationConfig(enable_torch_compile=True))
    assert compiled.decode_model is not compiled.model
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (9, 20)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outputs = [s.output for s in generate(compiled, prompts, params, chunk_size=8, stagger=1)]
    assert outputs == hf_greedy(hf_model(checkpoint, torch.float32), prompts, NEW_TOKENS)
