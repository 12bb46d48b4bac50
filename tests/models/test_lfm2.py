"""LFM2's short-conv layer (layers/short_conv.py, layers/causal_conv.py) against a per-sequence conv1d.

The model's logits and greedy tokens are checked in tests/models/test_hf_parity.py, its serving in
tests/models/test_hybrid_serving.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.short_conv import ShortConv
from rapid_llm.layers.state_layer import STATE_GROUP
from rapid_llm.ops.state_metadata import StateMetadata
from rapid_llm.ops.attention.backend import StepLayout, build_common_metadata

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
