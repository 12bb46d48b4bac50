"""Per-request sampling parameters, with the vLLM/OpenAI meaning of each field.

A `msgspec.Struct` so it crosses process boundaries without pickle; `validate()` is the single
place where ranges are checked, and its errors name the offending field so the frontend can
turn them into an OpenAI-style 400. Integer fields are bounded to int64 (what the worker's tensors
and the msgpack messages hold), so no request can overflow anything downstream.
"""

from __future__ import annotations

import math

import msgspec

from rapid_llm.sampling.kv_transfer_params import KVTransferParams
from rapid_llm.sampling.lora_request import LoRARequest

MAX_LOGPROBS = 20
MAX_N = 128  # OpenAI's limit on choices per request
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values is [-100, 100]
# Beam search ranks each beam's top 2 * width candidates, which the worker returns as top logprobs.
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2
POOLING_TYPES = (None, "last", "mean")


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What a request's output must match, as vLLM's `structured_outputs`; exactly one kind is set.

    `json`: a JSON schema serialised as a JSON string; `json_object`: any JSON object; `regex`: a
    regular expression the whole output matches; `choice`: one of these strings; `grammar`: an EBNF
    grammar. The worker compiles it into a token mask applied before sampling.
    """

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def kinds(self) -> list[str]:
        """The names of the kinds that are set."""
        return [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None] + (
            ["json_object"] if self.json_object else [])


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """How to pick tokens for one request.

    temperature 0 means greedy. top_k <= 0 disables top-k, top_p 1.0 disables top-p, min_p 0.0
    disables min-p. `logprobs=None` returns no logprobs; `logprobs=n` returns the sampled token's
    logprob plus the n most likely. `prompt_logprobs=n` does the same for every prompt token after
    the first (as vLLM), computed from the prefill's logits. A `seed` makes the request's samples independent of whatever
    else shares the batch; choice i of an n > 1 request uses `seed + i` (as vLLM), so the seed must
    leave room for n - 1 more in int64: a seed past that is refused rather than wrapped.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = []
    include_stop_str_in_output: bool = False  # the matched stop string stays at the end of the text
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    # Beam search (docs/beam_search.md): `beam_width` beams (None: n), the n best returned as the request's
    # choices; HF's length_penalty and early_stopping (True, False or "never").
    use_beam_search: bool = False
    beam_width: int | None = None
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Embeddings: the prompt's final hidden states pooled into one vector ("last" token or "mean" of all), sent
    # back with the first sampled token (worker_proc/prompt_pooling.py); None for plain generation.
    pooling: str | None = None
    # Prefill/decode disaggregation (docs/disaggregation.md): keep the prompt's KV for a decode instance, or start
    # from KV a prefill instance kept; None for a colocated request.
    kv_transfer_params: KVTransferParams | None = None
    # Multi-LoRA (docs/lora.md): the adapter the request's tokens run with, which the frontend resolves from the
    # OpenAI "model" field; None for the base model.
    lora: LoRARequest | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def num_beams(self) -> int:
        """How many beams a beam-search request keeps (0 when it is not one)."""
        if not self.use_beam_search:
            return 0
        return self.n if self.beam_width is None else self.beam_width

    def per_choice(self) -> list["SamplingParams"]:
        """The `n` single-choice params a request fans out to, one engine request each; choice i
        gets seed + i, so seeded choices differ from each other yet are reproducible. A beam search is
        one engine request whatever n: its beams are its choices."""
        if self.use_beam_search:
            return [self]
        return [
            msgspec.structs.replace(self, n=1, seed=None if self.seed is None else self.seed + i)
            for i in range(self.n)
        ]

    def validate(self) -> "SamplingParams":
        """Raise `SamplingParamsError` naming the first out-of-range field; return self."""
        checks: list[tuple[str, bool, str]] = [
            ("n", 1 <= self.n <= MAX_N, f"must be in [1, {MAX_N}]"),
            ("max_tokens", self.max_tokens is None or 1 <= self.max_tokens <= INT64_MAX,
             f"must be in [1, {INT64_MAX}]"),
            ("min_tokens", 0 <= self.min_tokens <= INT64_MAX, f"must be in [0, {INT64_MAX}]"),
            ("temperature", self.temperature >= 0.0, "must be non-negative"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", -1 <= self.top_k <= INT64_MAX,
             f"must be -1 or 0 (disabled) or a positive integer up to {INT64_MAX}"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]"),
            ("seed", self.seed is None or INT64_MIN <= self.seed <= INT64_MAX - (self.n - 1),
             f"must be in [{INT64_MIN}, {INT64_MAX} - (n - 1)] (choice i of n uses seed + i)"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "must be positive"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"must be in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"must be in [0, {MAX_LOGPROBS}]"),
            ("stop_token_ids", all(0 <= t <= INT64_MAX for t in self.stop_token_ids),
             f"must be token ids in [0, {INT64_MAX}]"),
            ("logit_bias", not self.logit_bias or all(
                0 <= t <= INT64_MAX and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for t, b in self.logit_bias.items()),
             f"must map token ids to biases in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"),
        ]
        for field, ok, rule in checks:
            if not ok:
                raise SamplingParamsError(field, f"{field} {rule}, got {getattr(self, field)!r}")
        if self.structured_outputs is not None and len(self.structured_outputs.kinds()) != 1:
            raise SamplingParamsError(
                "structured_outputs", "structured_outputs must set exactly one of json, json_object, regex, "
                f"choice, grammar; got {self.structured_outputs.kinds() or 'none'}")
        if self.pooling not in POOLING_TYPES:
            raise SamplingParamsError("pooling", f"pooling must be one of {POOLING_TYPES}, got {self.pooling!r}")
        if self.use_beam_search:
            self._validate_beam_search()
        if self.kv_transfer_params is not None:
            self._validate_kv_transfer()
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        return self

    def _validate_kv_transfer(self) -> None:
        try:
            self.kv_transfer_params.check()
        except ValueError as error:
            raise SamplingParamsError("kv_transfer_params", str(error)) from None
        if self.kv_transfer_params.do_remote_decode and (self.n != 1 or self.use_beam_search):
            # One lease per prompt: the decode instance fans the choices out from the one prefill.
            raise SamplingParamsError("kv_transfer_params", "kv_transfer_params with do_remote_decode needs n = 1 "
                                      "and no beam search (send n to the decode instance)")

    def _validate_beam_search(self) -> None:
        """Beam search ranks raw log-softmax scores (HF's do_sample=False): nothing may change the distribution."""
        width = self.num_beams
        if not 1 <= width <= MAX_BEAM_WIDTH:
            field = "n" if self.beam_width is None else "beam_width"
            raise SamplingParamsError(field, f"{field} (the beam width) must be in [1, {MAX_BEAM_WIDTH}] with "
                                      f"beam search, got {width}")
        if self.n > width:
            raise SamplingParamsError("n", f"n ({self.n}) must not exceed the beam width ({width})")
        if not math.isfinite(self.length_penalty):
            raise SamplingParamsError("length_penalty", f"length_penalty must be finite, got {self.length_penalty!r}")
        if self.early_stopping not in (True, False, "never"):
            raise SamplingParamsError("early_stopping", "early_stopping must be true, false or \"never\", got "
                                      f"{self.early_stopping!r}")
        neutral = {"temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                   "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_tokens": 0}
        for field, value in neutral.items():
            if getattr(self, field) != value:
                raise SamplingParamsError(field, f"{field} must be {value:g} with beam search (it ranks the model's "
                                          f"raw log-probabilities), got {getattr(self, field)!r}")
        unsupported = {"top_k": self.top_k not in (-1, 0, 1), "stop": bool(self.stop), "logprobs": self.logprobs is not None,
                       "prompt_logprobs": self.prompt_logprobs is not None,
                       "structured_outputs": self.structured_outputs is not None, "logit_bias": bool(self.logit_bias),
                       "pooling": self.pooling is not None}
        for field, used in unsupported.items():
            if used:
                raise SamplingParamsError(field, f"{field} is not supported with beam search")
