"""What the scheduler admits: the checks a new request passes before it may wait for a slot.

The frontend checks the same first; these guard any other client (or a frontend bug), so that
nothing reaches the worker that it cannot represent. A refusal is `RequestRejected`, whose `kind`
tells the client why: bad parameters (a 400) or a full waiting queue (a 503, retry later).
"""

from __future__ import annotations

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import ErrorKind, GenerateRequest
from rapid_llm.sampling.context_length import ContextLengthError, check_prompt_length
from rapid_llm.sampling.params import MAX_LOGPROBS, SamplingParamsError
from rapid_llm.scheduler_proc.beam_search import num_candidates


class DuplicateRequestId(ValueError):
    """A request arrived under an id that a live request holds; it is dropped, not answered (an answer
    under that id would end the live request)."""


class RequestRejected(ValueError):
    """The scheduler refuses this request; it ends with finish_reason "abort" and this message."""

    def __init__(self, message: str, kind: ErrorKind = "invalid_request") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


def check_admissible(request: GenerateRequest, config: SchedulerConfig, num_waiting: int) -> None:
    """Raise `RequestRejected` unless `request` can join a waiting queue that holds `num_waiting`."""
    request_id = request.request_id
    try:
        request.params.validate()
    except SamplingParamsError as error:
        raise RequestRejected(f"request {request_id}: {error}") from error
    try:
        check_prompt_length(len(request.prompt_token_ids), config.max_model_len)
    except ContextLengthError as error:
        raise RequestRejected(f"request {request_id}: {error}") from error
    vocab_size = config.vocab_size
    if vocab_size is not None:
        for name, ids in (("prompt token ids", request.prompt_token_ids),
                          ("stop_token_ids", request.params.stop_token_ids),
                          ("logit_bias token ids", list(request.params.logit_bias or ()))):
            if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
                raise RequestRejected(f"request {request_id}: {name} must be in [0, {vocab_size})")
    if request.params.use_beam_search:
        check_beam_search(request, config)
    if request.params.kv_transfer_params is not None:
        check_kv_transfer(request, config)
    if request.params.lora is not None and config.lora is None:
        raise RequestRejected(f"request {request_id}: it names LoRA adapter {request.params.lora.lora_name!r}; this "
                              "instance was started without --enable-lora")
    limit = config.max_waiting_requests
    if limit is not None and num_waiting >= limit:
        raise RequestRejected(f"request {request_id}: the waiting queue is full ({limit} requests); "
                              "retry later", kind="queue_full")


def check_kv_transfer(request: GenerateRequest, config: SchedulerConfig) -> None:
    """A remote decode needs a producer instance, a remote prefill a consumer (docs/disaggregation.md)."""
    remote, role = request.params.kv_transfer_params, config.kv_transfer
    if remote.do_remote_decode:
        needed, served = "kv_producer", role is not None and role.is_producer
    elif remote.do_remote_prefill:
        needed, served = "kv_consumer", role is not None and role.is_consumer
    else:
        return
    if not served:
        raise RequestRejected(f"request {request.request_id}: kv_transfer_params asks for a {needed} instance; this "
                              f"one was started {'without --kv-transfer-config' if role is None else role.kv_role}")


def check_beam_search(request: GenerateRequest, config: SchedulerConfig) -> None:
    """A beam group holds a slot per beam and decodes them all in one step, and each beam's candidates
    (HF's max(2, 1 + #stop ids) x width) must fit in the top logprobs a step returns. Beams fork a request's cache,
    which a model with recurrent layers (one state per request, not per block) or with several KV tables cannot do
    yet."""
    if config.recurrent_state:
        raise RequestRejected(f"request {request.request_id}: beam search is refused for this model: its recurrent "
                              "layers keep one state per request, which cannot be forked into beams yet")
    if len(config.kv_windows) > 1:
        raise RequestRejected(f"request {request.request_id}: beam search is refused for this model: its "
                              f"sliding-window and full-attention layers read {len(config.kv_windows)} block tables, "
                              "which beams do not fork yet")
    width = request.params.num_beams
    candidates = num_candidates(request.params, config.eos_token_ids)
    limits = (("max_num_seqs", config.max_num_seqs), ("max_num_batched_tokens", config.max_num_batched_tokens))
    for name, limit in limits:
        if width > limit:
            raise RequestRejected(f"request {request.request_id}: the beam width {width} exceeds {name} ({limit})")
    if candidates > MAX_LOGPROBS:
        raise RequestRejected(
            f"request {request.request_id}: beam search ranks {candidates} candidates per beam (max(2, 1 + the "
            f"stop token ids) x {width} beams), more than the {MAX_LOGPROBS} top logprobs a step returns; lower "
            "the beam width (n / best_of) or the stop_token_ids")
