"""The tiled prefill attention kernel on/off: the trained demo model (bf16) on the cpu_paged backend gives the
same greedy tokens on held-out text whether its long prompt chunks go to the tiled kernel or to padded SDPA
(the path before it), with chunked prefill (chunks after cached context), staggered arrivals (chunks beside
decodes), a bf16 and an fp8 cache, up to near-ties (greedy_ties.py): both paths move the demo model's logits
from its float32 ones by 0.005 on average and 0.08 at most (measured on these prompts; either one's argmax
differs from float32's at 0.5-1 % of positions). The same holds for the kernel's AMX form (the cpu_amx backend)
against its AVX-512 BF16 form, where the CPU has AMX."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.attention import cpu_paged
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS, skip_reason
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import DEMO_ROOT
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.greedy_ties import assert_greedy_equal_up_to_ties, tokens_and_gaps
from tests.models.paged_generation import generate
from tests.op_pins import pinned_backends

UNAVAILABLE = skip_reason("cpu", "bfloat16")
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None or 64 not in CPU_OPS.load().prefill_attention_head_dims(),
                                reason=str(UNAVAILABLE or "this CPU lacks AVX-512 BF16 (no tiled prefill kernel)"))
NEW_TOKENS = 24
TIE = 0.15  # nats: about twice the largest logit change of either bf16 path against float32
HELD_OUT = Path(__file__).resolve().parents[2] / "tools" / "demo_model" / "data" / "held_out.txt"


def _greedy(cache_dtype: str, tiled: bool, monkeypatch: pytest.MonkeyPatch,
            backend: str = "cpu_paged") -> list[tuple[list[int], list[float]]]:
    """Per prompt: the greedy tokens and, at each, the gap between the top two log-probabilities."""
    chosen = []

    def choose(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        chosen.append(tiled)
        return tiled

    monkeypatch.setattr(cpu_paged, "takes_tiled_prefill", choose)
    checkpoint = DEMO_ROOT / "target"
    with pinned_backends({}):  # the runner's pin ends with this test
        runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint), dtype="bfloat16"),
                             CacheConfig(block_size=16, num_blocks=128, cache_dtype=cache_dtype),
                             DeviceConfig("cpu"), max_num_seqs=4, op_backends={"attention": backend})
    tokens = AutoTokenizer.from_pretrained(str(checkpoint))(HELD_OUT.read_text()[:20000])["input_ids"]
    prompts = [tokens[:400], tokens[1000:1230], tokens[2000:2050]]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2)
    sequences = generate(runner, prompts, params, chunk_size=128, stagger=2)
    assert chosen, "the cpu_paged backend never chose a prefill path"
    return tokens_and_gaps(sequences)


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_tiled_prefill_keeps_the_greedy_tokens(cache_dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tiled = _greedy(cache_dtype, True, monkeypatch)
    assert all(len(tokens) == NEW_TOKENS for tokens, _ in tiled)
    assert_greedy_equal_up_to_ties(tiled, _greedy(cache_dtype, False, monkeypatch), TIE)


@pytest.mark.skipif(amx_missing("cpu", "bf16") is not None, reason=str(amx_missing("cpu", "bf16")))
@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_amx_tiles_keep_the_greedy_tokens(cache_dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    amx = _greedy(cache_dtype, True, monkeypatch, backend="cpu_amx")
    assert all(len(tokens) == NEW_TOKENS for tokens, _ in amx)
    assert_greedy_equal_up_to_ties(amx, _greedy(cache_dtype, True, monkeypatch), TIE)
