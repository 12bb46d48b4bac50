"""`LLM(..., data_parallel_size=2)`: a batch of greedy prompts gives the tokens one replica gives, spread over
both replicas by the router (minimum_tokens), and a second batch after the first starts from idle loads."""

from __future__ import annotations

import torch

from rapid_llm.entrypoints.llm import LLM
from rapid_llm.sampling import SamplingParams

NEW_TOKENS = 12


def test_dp2_offline_equals_dp1(tiny_checkpoint) -> None:
    checkpoint = str(tiny_checkpoint("LlamaForCausalLM"))
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(10, 500, (5 + 2 * i,), generator=generator).tolist() for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    with LLM(checkpoint, num_kv_blocks=64) as one:
        expected = [output.token_ids for output in one.generate(prompts, params)]
    with LLM(checkpoint, num_kv_blocks=64, data_parallel_size=2, load_balance_method="minimum_tokens") as two:
        assert [output.token_ids for output in two.generate(prompts, params)] == expected
        loads = two._router.loads
        assert [load.routed for load in loads] == [3, 3]
        assert all(load.in_flight == 0 and load.outstanding_tokens == 0 for load in loads)
        assert [output.token_ids for output in two.generate(prompts[:2], params)] == expected[:2]
        assert [load.routed for load in loads] == [4, 4]
