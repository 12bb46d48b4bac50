"""Two-batch overlap's split of a step into two micro-batches of about the same number of tokens.

A step of T tokens is cut at token T // 2 (as vLLM's DBO, and SGLang's two-chunk mode when a request boundary is too
uneven), not at a request boundary, so one long prompt beside short ones still halves the work (SGLang #6328's
complaint). The chunk the cut falls in is computed in two parts: its first tokens in micro-batch A and the rest in B,
as the next chunked-prefill chunk of the same request. B reads the KV of A's part, which A has written by then: the
executor (distributed/micro_batch_overlap.py) always runs a layer of A before the same layer of B.
Whether a step splits at all is MicroBatchConfig's (thresholds on the step's tokens).
Usage: `halves = split_micro_batches(query_lens, seq_lens)`; each half's `rows` select its chunks of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MicroBatch:
    """The chunks `rows` of the step, computing `query_lens` tokens each and holding `seq_lens` after them."""

    rows: slice
    query_lens: np.ndarray
    seq_lens: np.ndarray


def split_micro_batches(query_lens: np.ndarray, seq_lens: np.ndarray) -> tuple[MicroBatch, MicroBatch]:
    """The step's first T // 2 tokens and the rest (T >= 2 tokens)."""
    ends = np.cumsum(query_lens)
    if ends[-1] < 2:
        raise ValueError(f"a step of {int(ends[-1])} token cannot be split into two micro-batches")
    cut = int(ends[-1]) // 2
    chunk = int(np.searchsorted(ends, cut, side="right"))  # the chunk holding token `cut`
    in_first = cut - int(ends[chunk] - query_lens[chunk])  # its tokens before the cut (0: the cut is its start)
    first_queries, first_seqs = query_lens[:chunk + 1].copy(), seq_lens[:chunk + 1].copy()
    if in_first:
        first_queries[chunk] = in_first
        first_seqs[chunk] -= query_lens[chunk] - in_first
    else:
        first_queries, first_seqs = first_queries[:chunk], first_seqs[:chunk]
    second_queries = query_lens[chunk:].copy()
    second_queries[0] -= in_first
    return (MicroBatch(slice(0, len(first_queries)), first_queries, first_seqs),
            MicroBatch(slice(chunk, len(query_lens)), second_queries, seq_lens[chunk:].copy()))
