"""A minimal step loop over ModelRunner for model tests: staggered arrivals, chunked prefill.

It plays the scheduler's part just enough to put prefills, prefill chunks and decodes in the
same step, so tests can compare paged generation against transformers; `prefill_logits` runs
whole prompts in one step for logit comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest, StepOutput


@dataclass
class _Sequence:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_step: int
    output: list[int] = field(default_factory=list)
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams],
    chunk_size: int | None = None,
    stagger: int = 0,
) -> list[_Sequence]:
    """Run prompts to `max_tokens` each; request i joins at step i * stagger."""
    params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    sequences = [_Sequence(str(i), list(p), sp, i * stagger) for i, (p, sp) in enumerate(zip(prompts, params_list))]
    free_blocks = list(range(runner.num_blocks))
    for slot, seq in enumerate(sequences):
        runner.add_request(slot, seq.prompt)
    block_size = runner.cache_config.block_size
    step = 0
    while any(len(s.output) < s.params.max_tokens for s in sequences):
        scheduled: list[ScheduledRequest] = []
        for seq in sequences:
            if seq.arrival_step > step or len(seq.output) >= seq.params.max_tokens:
                continue
            remaining = len(seq.prompt) + len(seq.output) - seq.computed
            num_new = min(remaining, chunk_size) if chunk_size else remaining
            while len(seq.blocks) * block_size < seq.computed + num_new:
                seq.blocks.append(free_blocks.pop())
                runner.clear_blocks(seq.blocks[-1:])
            scheduled.append(ScheduledRequest(seq.request_id, int(seq.request_id), seq.prompt, list(seq.output),
                                              seq.computed, num_new, list(seq.blocks), seq.params))
        if scheduled:
            _apply(runner.execute(scheduled), scheduled, sequences)
        step += 1
    return sequences


def _apply(output: StepOutput, scheduled: list[ScheduledRequest], sequences: list[_Sequence]) -> None:
    by_id = {seq.request_id: seq for seq in sequences}
    for request in scheduled:
        by_id[request.request_id].computed += request.num_new_tokens
    for row, token, logprobs in zip(output.rows, output.token_ids, output.logprobs):
        by_id[scheduled[row].request_id].output.append(token)
        by_id[scheduled[row].request_id].logprobs.append(logprobs)


def prefill_logits(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """float32 logits at every prompt position, all prompts in one step (slots and blocks from 0)."""
    blocks_needed = [-(-len(p) // runner.cache_config.block_size) for p in prompts]
    starts = [sum(blocks_needed[:i]) for i in range(len(prompts))]
    requests = [
        ScheduledRequest(str(i), i, p, [], 0, len(p), list(range(start, start + n)))
        for i, (p, start, n) in enumerate(zip(prompts, starts, blocks_needed))
    ]
    for request in requests:
        runner.add_request(request.slot, request.prompt_token_ids)
        runner.clear_blocks(list(request.block_table))
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.forward(requests)).float()
    return list(logits.split([len(p) for p in prompts]))
