"""Mixed layouts on 2 CPU ranks (gloo) with the scheduler features that change what a step holds: dense TP,
TP-split experts and TP attention x EP experts (Qwen2-MoE, also with EPLB rebalancing every 4 steps), each
with chunked prefill (a 16-token step budget, so a 45-token prompt takes three steps) and a prefix-cache hit
(a second prompt sharing the first 40 tokens reuses two blocks and, with the radix cache's copy-on-write on every
rank, 8 tokens of the third), with async scheduling on (the default) or
off. Greedy tokens must be transformers', and the first (chunked) prompt's prompt and output logprobs within
LOGPROB_TOLERANCE; docs/parallelism.md's layout table cites these cases.
"""

from __future__ import annotations

import msgspec
import pytest

from rapid_llm import LLM
from tests.distributed.golden import GREEDY, LOGPROB_TOLERANCE, NEW_TOKENS, logprob_error, random_prompts
from tests.hf_reference import hf_greedy, hf_model

BLOCK_SIZE = 16
# Prompt logprobs need every prompt position computed, so a request asking for them never reads the cache.
CACHED = msgspec.structs.replace(GREEDY, prompt_logprobs=None)


MOE = "Qwen2MoeForCausalLM"


@pytest.mark.parametrize(("architecture", "engine_args"), [
    pytest.param(MOE, {"enable_expert_parallel": True}, id="tp-ep-async"),
    pytest.param(MOE, {"enable_expert_parallel": True, "disable_async_scheduling": True}, id="tp-ep-sync",
                 marks=pytest.mark.slow),
    pytest.param(MOE, {"enable_expert_parallel": True, "enable_eplb": True,
                       "eplb_config": {"num_redundant_experts": 2, "window_size": 4, "step_interval": 4}},
                 id="tp-ep-eplb-async", marks=pytest.mark.slow),
    pytest.param(MOE, {}, id="tp-moe-async", marks=pytest.mark.slow),
    pytest.param("LlamaForCausalLM", {}, id="tp-dense-async", marks=pytest.mark.slow),
])
def test_chunked_prefill_and_prefix_hits_keep_tokens(tiny_checkpoint, architecture: str, engine_args: dict) -> None:
    checkpoint = tiny_checkpoint(architecture)
    shared, first_tail, second_tail = random_prompts((40, 5, 7), seed=4)
    prompts = [shared + first_tail, shared + second_tail]
    with LLM(model=str(checkpoint), tensor_parallel_size=2, num_kv_blocks=64, block_size=BLOCK_SIZE,
             max_num_batched_tokens=16, **engine_args) as llm:
        outputs = [llm.generate([prompts[0]], GREEDY)[0], llm.generate([prompts[1]], CACHED)[0]]
    assert outputs[1].num_cached_tokens == 40  # two blocks, then a copy of the third's first 8 tokens
    hf = hf_model(checkpoint)
    assert [output.token_ids for output in outputs] == hf_greedy(hf, prompts, NEW_TOKENS)
    assert logprob_error(prompts[:1], hf, outputs[:1]) <= LOGPROB_TOLERANCE
