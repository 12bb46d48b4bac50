"""Multi-LoRA over tensor-parallel ranks on CPU (gloo): with `tensor_parallel_size=2` each rank holds its shard of
every adapter (B split like the base weight's output rows, A like a row-parallel weight's input columns, whose
partial products the base's all-reduce sums), and greedy tokens equal transformers + PEFT in fp32 for a batch
mixing two adapters and the base model. Two KV-head layouts: 2 KV heads (one per rank) and 1 KV head (replicated
on both ranks, so each rank's k/v slice of B is the whole checkpoint's); one adapter also adapts the embedding
(whole on each rank) and the LM head (B split over the ranks' vocabulary rows). A third run forces preemption (tiny KV
cache): preempted requests come back to their adapter's slot and still match.
"""

from __future__ import annotations

import pytest

from rapid_llm import SamplingParams
from rapid_llm.sampling.lora_request import LoRARequest
from tests.distributed.golden import generate, random_prompts
from tests.lora_adapters import ATTENTION, MLP, VOCAB, peft_greedy, random_adapter

NEW_TOKENS = 12


def run(checkpoint, adapters: dict, tensor_parallel_size: int, **engine_args) -> dict[str | None, list[list[int]]]:
    prompts = random_prompts((9, 23, 17), seed=3)
    names = [None, *adapters]
    params = [SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                             lora=None if name is None else LoRARequest(lora_name=name, lora_int_id=index,
                                                                        lora_path=str(adapters[name])))
              for index, name in enumerate(names)]
    outputs = generate(checkpoint, [prompt for prompt in prompts for _ in names], tensor_parallel_size,
                       [param for _ in prompts for param in params], enable_lora=True, max_loras=2,
                       max_lora_rank=16, **engine_args)
    tokens = [output.token_ids for output in outputs]
    got = {name: tokens[index::len(names)] for index, name in enumerate(names)}
    for name in names:
        assert got[name] == peft_greedy(checkpoint, adapters.get(name), prompts, NEW_TOKENS), name
    return got


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_tp2_adapters_equal_peft(tiny_checkpoint, tmp_path, num_kv_heads: int) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=num_kv_heads)
    adapters = {"all": random_adapter(checkpoint, tmp_path / "all", 8, ATTENTION + MLP, seed=1),
                "kv": random_adapter(checkpoint, tmp_path / "kv", 16, ["k_proj", "v_proj", "down_proj", *VOCAB],
                                     seed=2)}
    run(checkpoint, adapters, 2)


def test_preempted_requests_keep_their_adapter(tiny_checkpoint, tmp_path, capfd) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    adapters = {"all": random_adapter(checkpoint, tmp_path / "all", 8, ATTENTION + MLP, seed=1)}
    run(checkpoint, adapters, 1, block_size=4, num_kv_blocks=16, max_model_len=48, log_level="info")
    assert "preempt" in capfd.readouterr().err
