"""Every tensor-parallel architecture at `tensor_parallel_size=2` against transformers on a tiny fp32
checkpoint: 32 greedy tokens equal, prompt and output logprobs within LOGPROB_TOLERANCE.

The Llama case has one KV head (replicated on both ranks), a tied LM head and a vocabulary of 515 rows
(padded to 516 over the ranks); Qwen2 adds q/k/v biases, Qwen3 per-head q/k norms, Mistral a sliding window, LFM2
short-conv layers whose channels (and conv state) are split over the ranks, NemotronH Mamba2 layers whose heads and
B/C groups (and both states) are split, Qwen3-Next (grouped projections, MoE) and Qwen3.5 (flat projections) Gated
DeltaNet layers whose key heads and their value heads (and both states) are split.
Only the first runs by default (one engine start each, ~20 s on 2 cores); the others are marked slow.
"""

from __future__ import annotations

import pytest

from tests.distributed.golden import LOGPROB_TOLERANCE, assert_matches_transformers

# One rank already differs from transformers by 3e-4 (Qwen3-Next) and 4e-4 (Qwen3.5): transformers sums the delta
# rule of a prompt in its chunked form, in another order than the engine's; the models' bound is 1e-3.
TOLERANCES = {"Qwen3NextForCausalLM": 1e-3, "Qwen3_5ForCausalLM": 1e-3}


@pytest.mark.parametrize(("architecture", "overrides"), [
    pytest.param("LlamaForCausalLM", {"num_key_value_heads": 1, "tie_word_embeddings": True, "vocab_size": 515},
                 id="llama-replicated-kv-tied-padded-vocab"),
    pytest.param("Qwen2ForCausalLM", {}, id="qwen2", marks=pytest.mark.slow),
    pytest.param("Qwen3ForCausalLM", {}, id="qwen3", marks=pytest.mark.slow),
    pytest.param("MistralForCausalLM", {"sliding_window": 8}, id="mistral-sliding-window", marks=pytest.mark.slow),
    pytest.param("Lfm2ForCausalLM", {}, id="lfm2-short-conv-channels-split", marks=pytest.mark.slow),
    pytest.param("NemotronHForCausalLM", {}, id="nemotron-h-mamba2-heads-and-groups-split", marks=pytest.mark.slow),
    pytest.param("Qwen3NextForCausalLM", {}, id="qwen3-next-grouped-delta-net-heads-split", marks=pytest.mark.slow),
    pytest.param("Qwen3_5ForCausalLM", {}, id="qwen3.5-flat-delta-net-heads-split", marks=pytest.mark.slow),
])
def test_tp2_matches_transformers(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    assert_matches_transformers(tiny_checkpoint(architecture, **overrides), 2, architecture,
                                TOLERANCES.get(architecture, LOGPROB_TOLERANCE))
