"""Which requests may speculate: the sampling parameters under which a verification step cannot reproduce
what plain decoding would sample, so such a request decodes without drafts. Asked by the scheduler (who
drafts) and by the worker (which rows a worker-side proposer drafts for); it reads only SamplingParams.
"""

from __future__ import annotations

from rapid_llm.sampling import SamplingParams


def speculation_blocker(params: SamplingParams) -> str | None:
    """Why a request with these parameters decodes without drafts (None: it may speculate).

    Each of these makes a position's distribution depend on state the verification step does not advance
    per position (penalty counts, the grammar's matcher, min_tokens' count) or asks for per-token output the
    verification step does not return yet (logprobs).
    """
    if params.use_beam_search:
        return "beam search"
    if params.structured_outputs is not None:
        return "structured output"
    if params.logprobs is not None or params.prompt_logprobs is not None:
        return "logprobs"
    if params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        return "penalties"
    if params.logit_bias:
        return "logit_bias"
    if params.min_tokens > 0:
        return "min_tokens"
    return None
