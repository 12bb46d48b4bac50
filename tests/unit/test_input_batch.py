"""The persistent input batch: deltas land in the right rows, released slots are clean for reuse, a resumed
request's row equals a fresh one, penalty counts kept incrementally equal a count from scratch, and a step's
SamplingBatch gathered from the rows equals `SamplingBatch.build` over the same requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest, count_tokens
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.input_batch import InputBatch

VOCAB = 50
EOS = (2,)
BLOCK_SIZE = 4
PADDING_BLOCK = 99


def _batch(max_num_seqs: int = 4, max_model_len: int = 32) -> InputBatch:
    return InputBatch(max_num_seqs, max_model_len, BLOCK_SIZE, PADDING_BLOCK, VOCAB, EOS, torch.device("cpu"))


def test_deltas_fill_the_rows_and_blocks_reach_the_device_table_at_flush() -> None:
    batch = _batch()
    batch.add(2, "a", [5, 6, 7, 8, 9], 3, SamplingParams())
    batch.append_blocks(2, [10])
    batch.append_blocks(2, [11, 12])
    assert batch.block_table[2].tolist() == [PADDING_BLOCK] * batch.max_blocks  # not yet flushed
    batch.flush_blocks()
    assert batch.block_table[2, :4].tolist() == [10, 11, 12, PADDING_BLOCK]
    assert batch.host_block_tables[2] == [10, 11, 12] and batch.num_blocks[2] == 3
    assert batch.token_pool[2, :5].tolist() == [5, 6, 7, 8, 9]
    assert (batch.num_tokens[2], batch.num_prompt_tokens[2], batch.request_ids[2]) == (5, 3, "a")
    batch.record_sampled(np.array([2]), torch.tensor([2]), torch.tensor([5]), torch.tensor([44]))
    assert batch.token_pool[2, 5].item() == 44 and batch.num_tokens[2] == 6


def test_a_released_slot_is_reused_without_stale_blocks_or_state() -> None:
    batch = _batch()
    batch.add(1, "old", [5, 6, 7], 3, SamplingParams(temperature=0.7, top_k=5, min_tokens=4, seed=3))
    batch.append_blocks(1, [20, 21])
    batch.flush_blocks()
    batch.release([1])
    assert batch.block_table[1].tolist() == [PADDING_BLOCK] * batch.max_blocks
    assert batch.request_ids[1] is None and batch.num_blocks[1] == 0 and batch.host_block_tables[1] == []
    batch.add(1, "new", [8, 9], 2, SamplingParams(temperature=0.0))
    batch.append_blocks(1, [30])
    batch.flush_blocks()
    assert batch.block_table[1, :3].tolist() == [30, PADDING_BLOCK, PADDING_BLOCK]
    assert batch.token_pool[1, :2].tolist() == [8, 9]
    rows = batch.sampling
    assert rows.host_greedy[1] and not rows.host_seeded[1] and rows.host_min_tokens[1] == 0
    assert rows.host_top_k[1] == VOCAB


def test_blocks_beyond_max_model_len_are_refused() -> None:
    batch = _batch(max_model_len=8)  # two blocks of 4
    batch.add(0, "a", [5], 1, SamplingParams())
    with pytest.raises(ValueError, match="3 blocks exceed the 2"):
        batch.append_blocks(0, [1, 2, 3])


def test_penalty_counts_kept_per_step_equal_a_count_from_scratch_and_a_resumed_row() -> None:
    penalised = SamplingParams(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2)
    batch = _batch()
    prompts = {0: [3, 4, 4], 3: [7, 8]}
    for slot, prompt in prompts.items():
        batch.add(slot, str(slot), prompt, len(prompt), penalised)
    outputs: dict[int, list[int]] = {0: [], 3: []}
    generator = torch.Generator().manual_seed(0)
    for _ in range(12):
        tokens = torch.randint(0, VOCAB, (2,), generator=generator)
        slots = np.array([0, 3])
        positions = torch.tensor([int(batch.num_tokens[0]), int(batch.num_tokens[3])])
        batch.record_sampled(slots, torch.from_numpy(slots), positions, tokens)
        for slot, token in zip((0, 3), tokens.tolist()):
            outputs[slot].append(token)
    expected = count_tokens([outputs[0], outputs[3]], VOCAB, torch.device("cpu"))
    assert torch.equal(batch.sampling.output_counts[[0, 3]], expected)
    # Preempted and resumed in another slot: the row loaded from prompt + outputs is the same.
    batch.release([0])
    batch.add(1, "0", prompts[0] + outputs[0], len(prompts[0]), penalised)
    assert torch.equal(batch.sampling.output_counts[1], expected[0])
    assert torch.equal(batch.sampling.prompt_mask[1], count_tokens([prompts[0]], VOCAB, torch.device("cpu"))[0] > 0)
    assert batch.num_tokens[1] == 3 + 12 and batch.token_pool[1, :15].tolist() == prompts[0] + outputs[0]


REQUESTS = [
    (SamplingParams(temperature=0.0), [5, 6], []),
    (SamplingParams(temperature=0.8, top_k=7, top_p=0.9, seed=11), [5, 9, 9], [4, 4]),
    (SamplingParams(temperature=1.2, min_p=0.1, repetition_penalty=1.5, logprobs=3), [1, 2, 3], [30]),
    (SamplingParams(temperature=0.5, frequency_penalty=0.4, presence_penalty=-0.3, min_tokens=3,
                    stop_token_ids=[17], seed=2**70 + 5), [8], [12, 13]),
    (SamplingParams(temperature=0.0, top_k=3, min_tokens=1, ignore_eos=True), [6, 6], []),
]


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4], [3, 1], [0, 4], [2]])
def test_the_gathered_sampling_batch_equals_one_built_from_the_requests(rows: list[int]) -> None:
    batch = _batch(max_num_seqs=8)
    slots = [6, 0, 3, 5, 1]  # rows live in slots in another order than the step's
    for slot, (params, prompt, outputs) in zip(slots, REQUESTS):
        batch.add(slot, str(slot), prompt + outputs, len(prompt), params)
    step_slots = np.array([slots[row] for row in rows], dtype=np.int64)
    num_outputs = batch.num_tokens[step_slots] - batch.num_prompt_tokens[step_slots]
    gathered = batch.sampling.batch(step_slots, torch.from_numpy(step_slots), num_outputs)
    built = SamplingBatch.build([SamplingRequest(REQUESTS[row][0], REQUESTS[row][1], REQUESTS[row][2], EOS)
                                 for row in rows], VOCAB, torch.device("cpu"))
    for name, value in vars(built).items():
        ours = getattr(gathered, name)
        if name == "output_counts" and value is not None:
            # Rows without penalties: any count is neutral; the penalised rows must match exactly.
            penalised = torch.tensor([REQUESTS[row][0].frequency_penalty != 0 or REQUESTS[row][0].presence_penalty != 0
                                      or REQUESTS[row][0].repetition_penalty != 1.0 for row in rows])
            assert torch.equal(ours[penalised], value[penalised]), name
        elif isinstance(value, torch.Tensor):
            assert ours is not None and torch.equal(ours, value.to(ours.dtype)), name
        else:
            assert ours == value, name


def test_drafts_follow_the_known_tokens_and_a_rollback_cuts_tokens_and_blocks() -> None:
    batch = _batch()
    batch.add(1, "a", [5, 6, 7], 3, SamplingParams())
    batch.add(3, "b", [8, 9], 2, SamplingParams())
    batch.append_blocks(1, [10, 11])
    batch.flush_blocks()
    batch.write_drafts([1, 3], [[20, 21, 22], [30]])
    assert batch.token_pool[1, :6].tolist() == [5, 6, 7, 20, 21, 22] and batch.num_tokens[1] == 6
    assert batch.token_pool[3, :3].tolist() == [8, 9, 30] and batch.num_tokens[3] == 3
    # One draft accepted plus the target's token: 5 tokens, and the block that held only rejected ones is cut.
    batch.rollback(1, 5, 1)
    assert batch.num_tokens[1] == 5 and batch.num_blocks[1] == 1 and batch.host_block_tables[1] == [10]
    assert batch.block_table[1, :2].tolist() == [10, PADDING_BLOCK]
    batch.append_blocks(1, [12])
    batch.flush_blocks()
    assert batch.block_table[1, :2].tolist() == [10, 12]
    with pytest.raises(ValueError, match="cannot roll back"):
        batch.rollback(1, 5, 3)
    with pytest.raises(ValueError, match="exceed max_model_len"):
        batch.write_drafts([3], [list(range(40))])
