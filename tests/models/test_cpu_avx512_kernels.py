"""The `cpu_avx512` kernels on/off: the trained demo models (bf16) give the same greedy tokens on held-out text
with every linear layer on cpu_avx512 as on oneDNN, and the MoE's experts on cpu_avx512 as on torch_ref (the
kernels they replace on AVX-512 BF16 CPUs without AMX), up to near-ties (greedy_ties.py: the GEMMs sum in
fp32 in another order and round once to bf16), with chunked prefill and staggered arrivals, so prefill-sized
and decode-sized calls both run."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.avx512_linear import avx512_missing
from rapid_llm.ops.onednn_linear import onednn_half_kernels_missing
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import DEMO_ROOT
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.greedy_ties import assert_greedy_equal_up_to_ties, tokens_and_gaps
from tests.models.paged_generation import generate
from tests.op_pins import pinned_backends

MISSING = avx512_missing("cpu", "bfloat16") or onednn_half_kernels_missing("cpu", "bfloat16")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
HELD_OUT = Path(__file__).resolve().parents[2] / "tools" / "demo_model" / "data" / "held_out.txt"
NEW_TOKENS = 24
TIE = 0.15  # nats: the bound the tiled prefill test measured for two bf16 kernels on this model


def _greedy(model: str, op: str, backend: str) -> list[tuple[list[int], list[float]]]:
    checkpoint = DEMO_ROOT / model
    with pinned_backends({}):  # the runner's pin ends with this test
        runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint), dtype="bfloat16"),
                             CacheConfig(block_size=16, num_blocks=96), DeviceConfig("cpu"), max_num_seqs=4,
                             op_backends={op: backend})
    assert runner.op_choices[op]["backend"] == backend
    tokens = AutoTokenizer.from_pretrained(str(checkpoint))(HELD_OUT.read_text()[:12000])["input_ids"]
    prompts = [tokens[:200], tokens[500:620], tokens[900:930]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2)
    return tokens_and_gaps(generate(runner, prompts, params, chunk_size=64, stagger=2))


@pytest.mark.parametrize(("model", "op", "replaced"), [("target", "linear", "onednn"),
                                                       ("moe", "fused_moe", "torch_ref")])
def test_avx512_kernels_keep_the_greedy_tokens(model: str, op: str, replaced: str) -> None:
    ours = _greedy(model, op, "cpu_avx512")
    assert all(len(tokens) == NEW_TOKENS for tokens, _ in ours)
    assert_greedy_equal_up_to_ties(ours, _greedy(model, op, replaced), TIE)
