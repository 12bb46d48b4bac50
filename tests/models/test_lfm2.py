"""LFM2 (models/lfm2.py): the short-conv layer against a per-sequence conv, and the model served by the scheduler and
the worker in one process against transformers.

tests/models/test_hf_parity.py checks its logits and greedy tokens in the shared paged harness (LFM2 is one of the
tiny checkpoint's architectures); here it runs with chunked prefill (an 8-token budget), lock-step and async
scheduling, preemption under a small KV budget (a preempted request restarts its conv state at token 0) and
prefix caching on: with state snapshots a hit starts from the conv state saved at its last block, without them
there are no hits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.short_conv import ShortConv
from rapid_llm.layers.state_layer import STATE_GROUP, StateMetadata
from rapid_llm.ops.attention.backend import StepLayout, build_common_metadata
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.unit.worker_engine import Engine

CHANNELS, KERNEL = 8, 4


def test_the_short_conv_continues_each_sequence_from_its_state() -> None:
    torch.manual_seed(0)
    layer = ShortConv(CHANNELS, KERNEL, bias=True)
    for parameter in layer.parameters():
        parameter.data.normal_()
    layer.in_proj.prepare_weights()
    layer.out_proj.prepare_weights()
    state = torch.randn(4, CHANNELS, KERNEL - 1)
    state[2] = 0.0  # slot 2 starts at token 0: the state group zeroed its row
    original = state.clone()
    layer.bind((state,))
    slots, lengths = [1, 2, 3], [5, 2, 1]  # a chunk after context, a fresh prefill, a decode
    inputs = torch.randn(sum(lengths), CHANNELS)
    starts = torch.tensor([0, 5, 7, 8])
    metadata = StateMetadata(torch.tensor(slots), torch.repeat_interleave(torch.tensor(slots), torch.tensor(lengths)),
                             starts, torch.tensor([True, False, True]), max(lengths))
    common = build_common_metadata(StepLayout(lengths, lengths, [[0, 1]] * 3, 4), torch.device("cpu"))
    batch = ForwardBatch(torch.zeros(sum(lengths), dtype=torch.int64), common, {STATE_GROUP: metadata})
    output = layer(inputs, batch)
    b, c, x = layer.in_proj(inputs).chunk(3, dim=-1)
    weight, bias = layer.conv.weight, layer.conv.bias
    for index, (slot, start, length) in enumerate(zip(slots, starts.tolist(), lengths)):
        history = torch.cat([original[slot], (b * x)[start:start + length].t()], dim=1)  # [channels, K-1 + L]
        conv = F.conv1d(history.unsqueeze(0), weight, bias, groups=CHANNELS)[0].t()  # [L, channels]
        expected = layer.out_proj(c[start:start + length] * conv)
        torch.testing.assert_close(output[start:start + length], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state[slot], history[:, -(KERNEL - 1):], rtol=0, atol=0)
    assert torch.equal(state[0], original[0]), "a slot outside the step keeps its state"


@pytest.mark.parametrize("snapshots", [0, 16], ids=["no-snapshots", "snapshots"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_lfm2_under_chunking_preemption_and_prefix_caching_matches_transformers(tiny_checkpoint, depth: int,
                                                                                snapshots: int) -> None:
    checkpoint = tiny_checkpoint("Lfm2ForCausalLM")
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32", max_model_len=64)
    runner = ModelRunner(model, CacheConfig(block_size=4, num_blocks=64, state_snapshots=snapshots),
                         DeviceConfig("cpu"), max_num_seqs=4)
    assert runner.cache_groups.num_state_layers == 3
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, model.vocab_size, (n,), generator=generator).tolist() for n in (23, 30, 9, 17)]
    prompts.append(prompts[1][:16] + prompts[3][:10])
    expected = hf_greedy(hf_model(checkpoint, torch.float32), prompts, 12)
    engine = Engine(runner, max_num_batched_tokens=8, num_kv_blocks=16)
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=12)
    outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=depth)
    assert [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))] == expected
    # Once more alone: its KV blocks and the snapshot at its last block boundary are the newest in the cache.
    again = engine.serve([GenerateRequest("again", prompts[1], params)], depth=depth)
    assert again["again"]["token_ids"] == expected[1]
    stats = engine.scheduler.stats()
    assert stats.num_preemptions > 0
    assert (stats.prefix_cache_hits > 0) == (snapshots > 0), "hits need the state after the hit's last block"
