"""Cache groups (worker_proc/cache_groups.py): layers grouped by what they keep, each group's backend, budget share
and step metadata; the state group's resets at token 0 and its state carried across chunks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from rapid_llm.config import CacheConfig, ModelConfig
from rapid_llm.layers.attention import Attention
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.mla_attention import MLAAttention
from rapid_llm.layers.state_layer import STATE_GROUP
from rapid_llm.ops.attention import MLADims, StepLayout
from rapid_llm.ops.attention.kv_cache_spec import StateSpec, bytes_per_block
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.worker_proc.cache_groups import CacheGroups
from tests.models.recurrent_double import RecurrentMixer, ReferenceMixer

CPU = torch.device("cpu")
HIDDEN, STATE, MAX_NUM_SEQS, BLOCK_SIZE = 16, 6, 3, 4
MIXER_CONFIG = SimpleNamespace(hidden_size=HIDDEN, recurrent_state_size=STATE, recurrent_decay=0.8)


def select(op: str) -> object:
    return REGISTRY.select(op, CPU, "float32").fn


def mixer(seed: int = 0) -> RecurrentMixer:
    torch.manual_seed(seed)
    layer = RecurrentMixer(MIXER_CONFIG)
    for parameter in layer.parameters():
        parameter.data.normal_(0.0, 0.3)
    return layer


@pytest.fixture(scope="module")
def model_config(tiny_checkpoint) -> ModelConfig:
    return ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")), dtype="float32", max_model_len=64)


def test_attention_and_state_layers_make_two_groups_and_state_is_paid_first(model_config: ModelConfig) -> None:
    attention, recurrent = Attention(4, 2, 8, 8**-0.5), mixer()
    groups = CacheGroups.of(nn.ModuleList([attention, recurrent]), select, MAX_NUM_SEQS, torch.float32, CPU)
    assert [group.op for group in groups.paged] == ["attention"]
    assert groups.state is not None and groups.state.layers == [recurrent]
    state_bytes = (MAX_NUM_SEQS + 1) * STATE * 4
    assert groups.state.num_bytes == state_bytes
    budget = 100_000
    cache = groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory_bytes=budget))
    # The state rows (one per slot plus the padding row) come out of the budget first, the blocks get the rest.
    assert cache.num_blocks == (budget - state_bytes) // bytes_per_block(cache.specs, BLOCK_SIZE)
    assert [tensor.shape for tensor in recurrent.bound()] == [(MAX_NUM_SEQS + 1, STATE)]
    assert attention.bound()[1] is select("attention")
    groups.check_speculative(None)
    groups.check_speculative("ngram")  # state is kept per draft position and restored after verification
    with pytest.raises(ValueError, match="after 96 bytes of recurrent state"):
        groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory_bytes=state_bytes + 10))


def test_two_attention_ops_make_two_paged_groups_with_their_own_backends_and_metadata(
        model_config: ModelConfig) -> None:
    dims = MLADims(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    attention, mla = Attention(4, 2, 8, 8**-0.5), MLAAttention(2, dims, 12**-0.5)
    groups = CacheGroups.of(nn.ModuleList([attention, mla]), select, MAX_NUM_SEQS, torch.float32, CPU)
    assert [group.op for group in groups.paged] == ["attention", "mla_attention"] and groups.state is None
    assert groups.num_state_layers == 0
    cache = groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE, num_blocks=8))
    assert cache.layers == [attention, mla]  # one block-id space for both groups
    cache.clear_blocks(list(range(8)))  # allocated uninitialised; the worker zeroes blocks as it hands them out
    assert attention.bound()[1] is select("attention") and mla.bound()[1] is select("mla_attention")
    assert select("attention") is not select("mla_attention")
    layout = StepLayout([3, 1], [3, 5], [[0], [1, 2]], BLOCK_SIZE)
    slots = np.array([0, 1])
    primary, metadata = groups.build_metadata([layout], slots, np.array([0, 4]), np.array([3, 1]), np.zeros(2, int), [(), ()],
                                              torch.from_numpy(slots))
    assert set(metadata) == {"attention", "mla_attention"} and primary is metadata["attention"]
    batch = ForwardBatch(torch.zeros(4, dtype=torch.int64), primary, metadata)
    assert batch.metadata_for(attention) is metadata["attention"]
    assert batch.metadata_for(mla) is metadata["mla_attention"]
    # Each layer computes through its own backend with its own group's metadata.
    query = torch.randn(4, 2 * dims.qk_head_dim)
    kv_b_weight = torch.randn(2 * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank)
    assert mla(query, torch.randn(4, dims.latent_dim), kv_b_weight, batch.metadata_for(mla)).shape == (4, 16)
    qkv = torch.randn(4, 4 * 8), torch.randn(4, 2 * 8), torch.randn(4, 2 * 8)
    assert attention(*qkv, batch.metadata_for(attention)).isfinite().all()
    with pytest.raises(ValueError, match="no metadata for cache group 'state'"):
        batch.metadata_for(mixer())


def test_a_proposers_layers_are_a_group_reading_the_pool_plus_their_scratch(model_config: ModelConfig) -> None:
    target, draft = Attention(4, 2, 8, 8**-0.5), Attention(4, 2, 8, 8**-0.5)
    groups = CacheGroups.of(target, select, MAX_NUM_SEQS, torch.float32, CPU)
    with pytest.raises(ValueError, match=r"the proposer's layers use \['mla_attention'\]"):
        dims = MLADims(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
        groups.add_proposer([MLAAttention(2, dims, 12**-0.5)], 2)
    groups.add_proposer([draft], 3)
    assert [group.name for group in groups.paged] == ["attention", "proposer"] and draft.cache_group == "proposer"
    assert "proposer (1 layers, " in groups.describe() and "3 scratch blocks" in groups.describe()
    page = bytes_per_block([target.kv_cache_spec(torch.float32)], BLOCK_SIZE)
    cache = groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory_bytes=40 * page))
    # The scratch is paid first; every remaining block id costs both layers' pages.
    assert cache.num_blocks == (40 - 3) // 2 and cache.num_bytes == cache.num_blocks * 2 * page + 3 * page
    assert target.bound()[0].shape[1] == cache.num_blocks and draft.bound()[0].shape[1] == cache.num_blocks + 3
    assert draft.bound()[1] is target.bound()[1]
    _, metadata = groups.build_metadata([StepLayout([1], [1], [[0]], BLOCK_SIZE)], np.array([0]), np.array([0]),
                                        np.array([1]), np.zeros(1, int), [()], torch.tensor([0]))
    assert set(metadata) == {"attention"}, "the proposer builds its group's metadata itself"


def test_a_model_without_cache_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="no cache-holding layers"):
        CacheGroups.of(nn.Linear(2, 2), select, MAX_NUM_SEQS, torch.float32, CPU)


def test_state_spec_refuses_empty_shapes() -> None:
    with pytest.raises(ValueError, match="at least one state shape"):
        StateSpec(torch.float32, ())
    with pytest.raises(ValueError, match="positive sizes"):
        StateSpec(torch.float32, ((4, 0),))


def state_step(groups: CacheGroups, slots: list[int], starts: list[int], query_lens: list[int]) -> ForwardBatch:
    """One step's forward batch over sequences in `slots` (blocks are irrelevant to state: one long table each)."""
    seq_lens = [start + length for start, length in zip(starts, query_lens)]
    layout = StepLayout(query_lens, seq_lens, [list(range(16))] * len(slots), BLOCK_SIZE)
    slot_array = np.array(slots)
    attention, metadata = groups.build_metadata([layout], slot_array, np.array(starts), np.array(query_lens),
                                                np.zeros(len(slots), int), [()] * len(slots),
                                                torch.from_numpy(slot_array))
    return ForwardBatch(torch.zeros(sum(query_lens), dtype=torch.int64), attention, metadata)


def test_a_chunk_at_token_0_resets_its_row_and_a_chunk_elsewhere_must_continue_the_state(
        model_config: ModelConfig) -> None:
    recurrent = mixer()
    groups = CacheGroups.of(recurrent, select, MAX_NUM_SEQS, torch.float32, CPU)
    cache = groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE))
    # No paged layer: blocks cost nothing, so every slot gets its whole context (plus the padding block).
    assert cache.num_blocks == MAX_NUM_SEQS * model_config.max_model_len // BLOCK_SIZE + 1 and cache.num_bytes == 0
    (state,) = recurrent.bound()
    state.fill_(7.0)
    first = state_step(groups, [0, 2], [0, 0], [3, 2]).groups[STATE_GROUP]
    assert first.has_initial_state.tolist() == [False, False]
    assert state[[0, 2]].eq(0).all() and state[[1, 3]].eq(7).all()  # only the starting rows were reset
    assert first.token_slots.tolist() == [0, 0, 0, 2, 2] and first.max_query_len == 3
    assert first.query_start_loc.tolist() == [0, 3, 5]
    state.fill_(7.0)
    # Slot 2 restarts at token 0, as a preempted request is recomputed.
    second = state_step(groups, [0, 2], [3, 0], [1, 4]).groups[STATE_GROUP]
    assert second.has_initial_state.tolist() == [True, False]
    assert state[0].eq(7).all() and state[2].eq(0).all()
    with pytest.raises(ValueError, match="slot 0: the step continues from token 2, but its recurrent state holds 4"):
        state_step(groups, [0], [2], [1])
    groups.forget([0])  # the slot's request left: only a fresh start is possible there
    with pytest.raises(ValueError, match="holds 0 tokens"):
        state_step(groups, [0], [4], [1])


def test_state_is_carried_across_chunks_and_matches_the_full_sequence_form(model_config: ModelConfig) -> None:
    recurrent = mixer(seed=1)
    groups = CacheGroups.of(recurrent, select, MAX_NUM_SEQS, torch.float32, CPU)
    groups.allocate(model_config, CacheConfig(block_size=BLOCK_SIZE))
    torch.manual_seed(2)
    first, second = torch.randn(12, HIDDEN), torch.randn(7, HIDDEN)

    def run(slots: list[int], starts: list[int], rows: list[torch.Tensor]) -> list[torch.Tensor]:
        lengths = [row.shape[0] for row in rows]
        return list(recurrent(torch.cat(rows), state_step(groups, slots, starts, lengths)).split(lengths))

    whole = run([1], [0], [first])[0]
    # The same sequence in chunks of 5, 4 and 3 tokens, beside another sequence in slot 0 that starts in between.
    pieces = [run([1], [0], [first[:5]])[0]]
    out, other = run([1, 0], [5, 0], [first[5:9], second[:4]])
    pieces.append(out)
    out, other_end = run([0, 1], [4, 9], [second[4:], first[9:]])
    pieces.append(other_end)
    torch.testing.assert_close(torch.cat(pieces), whole)
    reference = ReferenceMixer(MIXER_CONFIG)
    reference.load_state_dict({name: parameter.data for name, parameter in recurrent.named_parameters()})
    torch.testing.assert_close(reference(first[None])[0][0], whole)
    torch.testing.assert_close(torch.cat([other, out]), reference(second[None])[0][0])
