"""The AVX-512 BF16 decode attention kernel (bf16 P.V, paged_attention_bf16.h) on/off: the trained demo model
(bf16) gives the same greedy tokens on held-out text on the cpu_paged backend as on torch_ref's attention,
for decodes over 50-900 cached tokens (splits of the key range included), up to near-ties (greedy_ties.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS, skip_reason
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import DEMO_ROOT
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.greedy_ties import assert_greedy_equal_up_to_ties, tokens_and_gaps
from tests.models.paged_generation import generate
from tests.op_pins import pinned_backends

UNAVAILABLE = skip_reason("cpu", "bfloat16")
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None or not CPU_OPS.load().paged_attention_bf16_kernel(),
                                reason=str(UNAVAILABLE or "this CPU lacks AVX-512 BF16 (no bf16 decode kernel)"))
NEW_TOKENS = 48
TIE = 0.15  # nats, as in test_cpu_tiled_prefill.py: about twice the largest logit change of a bf16 path
HELD_OUT = Path(__file__).resolve().parents[2] / "tools" / "demo_model" / "data" / "held_out.txt"


def _greedy(attention: str) -> list[tuple[list[int], list[float]]]:
    checkpoint = DEMO_ROOT / "target"
    with pinned_backends({}):  # the runner's pin ends with this test
        runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint), dtype="bfloat16"),
                             CacheConfig(block_size=16, num_blocks=256, cache_dtype="auto"),
                             DeviceConfig("cpu"), max_num_seqs=4, op_backends={"attention": attention})
    tokens = AutoTokenizer.from_pretrained(str(checkpoint))(HELD_OUT.read_text()[:20000])["input_ids"]
    prompts = [tokens[:850], tokens[1000:1300], tokens[2000:2050]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2)
    return tokens_and_gaps(generate(runner, prompts, params, chunk_size=256, stagger=2))


def test_bf16_decode_kernel_keeps_the_greedy_tokens() -> None:
    ours = _greedy("cpu_paged")
    assert all(len(tokens) == NEW_TOKENS for tokens, _ in ours)
    assert_greedy_equal_up_to_ties(ours, _greedy("torch_ref"), TIE)
