"""The prefix cache's second tier end to end: a prompt evicted from a small KV cache comes back from the tier (host
memory or disk) with the greedy tokens of transformers, and counts as cached; a tier directory that cannot be used
leaves the engine serving without one."""

from __future__ import annotations

import pytest
import torch

from rapid_llm import LLM, SamplingParams
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
# 12 blocks of 16 tokens: each 70-token prompt takes 5, so the others evict the first one's blocks.
ENGINE = {"num_kv_blocks": 12, "block_size": 16, "max_model_len": 96, "max_num_seqs": 1}


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(10, 500, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


FIRST = random_tokens(70, seed=1)
OTHERS = [random_tokens(70, seed=seed) for seed in (2, 3, 4)]
AGAIN = FIRST[:64] + random_tokens(6, seed=5)  # its first 4 blocks are the first prompt's


@pytest.fixture(scope="module")
def expected(checkpoint) -> list[list[int]]:
    return hf_greedy(hf_model(checkpoint), [FIRST, *OTHERS, AGAIN], NEW_TOKENS)


def run(checkpoint, **tier: object) -> tuple[list[list[int]], list[int]]:
    with LLM(model=str(checkpoint), **ENGINE, **tier) as llm:
        outputs = [llm.generate([prompt], GREEDY)[0] for prompt in [FIRST, *OTHERS, AGAIN]]
    return [output.token_ids for output in outputs], [output.num_cached_tokens for output in outputs]


@pytest.mark.parametrize("where", ["host", "disk"])
def test_an_evicted_prefix_comes_back_from_the_tier(checkpoint, expected, tmp_path, where: str) -> None:
    path = {"kv_offload_path": str(tmp_path)} if where == "disk" else {}
    tokens, cached = run(checkpoint, kv_offload_size="1MiB", **path)
    assert tokens == expected
    assert cached[-1] == 64, "the first prompt's 4 full blocks, evicted from the device, load from the tier"


def test_an_unusable_tier_directory_leaves_serving_untouched(checkpoint, expected, tmp_path, capfd) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    tokens, cached = run(checkpoint, kv_offload_size="1MiB", kv_offload_path=str(not_a_directory))
    assert tokens == expected and cached[-1] < 64, "without the tier the evicted blocks are recomputed"
    assert "serving goes on without it" in capfd.readouterr().err
