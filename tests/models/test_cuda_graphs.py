"""CUDA graphs for decode (skipped without CUDA): greedy tokens with decode steps replayed from graphs equal
those of `--enforce-eager` and transformers', with chunked prefill and staggered arrivals so mixed steps
(run eagerly) and decode-only steps (replayed, batch sizes padded to their bucket) alternate."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, CompilationConfig, DeviceConfig, ModelConfig
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.models.paged_generation import generate

NEW_TOKENS = 24


def _runner(checkpoint, enforce_eager: bool) -> ModelRunner:
    return ModelRunner(ModelConfig.from_pretrained(str(checkpoint)), CacheConfig(block_size=16, num_blocks=64),
                       DeviceConfig("cuda"), max_num_seqs=8,
                       compilation=CompilationConfig(enforce_eager=enforce_eager, cuda_graph_max_bs=8))


@pytest.mark.gpu
def test_greedy_tokens_with_cuda_graphs_equal_enforce_eager_and_transformers(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (7, 21, 38, 3, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    graphed = _runner(checkpoint, enforce_eager=False)
    assert graphed.decode_graphs is not None and graphed.decode_graphs.sizes == [1, 2, 4, 8]
    eager = _runner(checkpoint, enforce_eager=True)
    assert eager.decode_graphs is None
    replays = []
    run = graphed.decode_graphs.run

    def counting_run(input_ids, common):
        hidden_states = run(input_ids, common)
        replays.append(input_ids.shape[0])
        return hidden_states

    graphed.decode_graphs.run = counting_run
    with_graphs = [s.output for s in generate(graphed, prompts, params, chunk_size=8, stagger=2)]
    assert 5 in replays and 1 in replays  # all five decoding (bucket 8), and the last one alone
    assert with_graphs == [s.output for s in generate(eager, prompts, params, chunk_size=8, stagger=2)]
    assert with_graphs == hf_greedy(hf_model(checkpoint, torch.float32).to("cuda"), prompts, NEW_TOKENS)
