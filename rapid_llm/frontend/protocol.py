"""OpenAI request bodies as msgspec Structs, and their conversion to `SamplingParams`.

Key design choice: msgspec decodes and type-checks a body in one pass (unknown fields are ignored,
as OpenAI clients send extras), and its error path (`$.temperature`) becomes the OpenAI `param`.
Range checks are left to `SamplingParams.validate()` so they live in one place; its field names are
mapped back to the request's own names (`max_completion_tokens`, `top_logprobs`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.structured_request import ResponseFormat, StructuredOutputsRequest, structured_outputs_of
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.kv_transfer_params import KVTransferParams
from rapid_llm.sampling.params import SamplingParamsError, StructuredOutputsParams

_ERROR_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING_FIELD = re.compile(r"missing required field `(?P<field>[^`]+)`")

RequestT = TypeVar("RequestT", bound="GenerationRequest")


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class GenerationRequest(msgspec.Struct, kw_only=True):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's plus vLLM's extras).

    Unknown fields are ignored, as vLLM does; every known one is honoured or refused with a 400 naming it.
    """

    # Fields some clients send as an explicit null, and the value null stands for (as in vLLM).
    null_means: ClassVar[dict[str, Any]] = {"n": 1, "stream": False, "ignore_eos": False,
                                            "skip_special_tokens": True, "use_beam_search": False,
                                            "length_penalty": 1.0, "early_stopping": False,
                                            "return_token_ids": False}
    model: str | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = False
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = True
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    tools: Any = None
    tool_choice: Any = None
    best_of: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool | None = None
    user: str | None = None  # accepted and ignored, as in vLLM
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's beam search fields (docs/beam_search.md): beam width best_of, else n; the n best beams returned.
    use_beam_search: bool | None = False
    length_penalty: float | None = 1.0
    early_stopping: bool | Literal["never"] | None = False
    # vLLM's: the prompt's and each choice's token ids in the response (the routes' docstrings give the shape).
    return_token_ids: bool | None = False
    # vLLM's prefill/decode disaggregation fields (docs/disaggregation.md); the response carries the same object.
    kv_transfer_params: KVTransferParams | None = None

    def __post_init__(self) -> None:
        for name, default in self.null_means.items():
            if getattr(self, name) is None:
                setattr(self, name, default)

    def _check_best_of(self) -> None:
        if self.best_of is not None and self.best_of < self.n:
            raise bad_request(f"best_of ({self.best_of}) must be at least n ({self.n})", param="best_of")
        if self.ranks_choices and self.stream:
            raise bad_request("best_of greater than n cannot be streamed: the best choices are known only at "
                              "the end", param="best_of")
        if self.use_beam_search and self.stream:
            raise bad_request("beam search cannot be streamed: its beams are known only at the end", param="stream")

    @property
    def ranks_choices(self) -> bool:
        """best_of > n without beam search: generate best_of choices, answer with the n of highest cumulative
        logprob (vLLM)."""
        return self.best_of is not None and self.best_of > self.n and not self.use_beam_search

    def structured_outputs_params(self) -> tuple[StructuredOutputsParams | None, str | None]:
        """The output constraint (response_format, structured_outputs or guided_*) and its field's name."""
        guided = {"guided_json": self.guided_json, "guided_regex": self.guided_regex,
                  "guided_choice": self.guided_choice, "guided_grammar": self.guided_grammar}
        return structured_outputs_of(self.response_format, self.structured_outputs, guided)

    def logit_bias_params(self) -> dict[int, float] | None:
        """OpenAI's logit_bias keys are token ids written as strings."""
        if not self.logit_bias:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise bad_request("logit_bias keys must be token ids (integers written as strings)",
                              param="logit_bias") from None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def _sampling_params(
        self, max_tokens: int, logprobs: int | None, renames: dict[str, str], defaults: dict[str, Any],
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """Validated params; fields left unset take `defaults` (--generation-config, SamplingParams names);
        `renames` maps SamplingParams field names to this request's names."""
        self._check_best_of()
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if any(not s for s in stop):
            raise bad_request("stop strings must not be empty", param="stop")
        optional = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "min_tokens": self.min_tokens,
            "stop_token_ids": self.stop_token_ids,
        }
        if self.use_beam_search:
            # Beam search ranks the raw distribution: --generation-config sampling defaults do not apply.
            defaults = {"temperature": 0.0}
            renames = {**renames, "beam_width": "best_of"}
        resolved = {name: defaults.get(name) if value is None else value
                    for name, value in optional.items()}
        if self.ranks_choices:
            # Ranking needs each sampled token's logprob; the response shows them only if asked.
            logprobs = 0 if logprobs is None else logprobs
            renames = {**renames, "n": "best_of"}
        params = SamplingParams(
            n=self.best_of if self.ranks_choices else self.n,
            max_tokens=max_tokens,
            stop=stop,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.structured_outputs_params()[0],
            logit_bias=self.logit_bias_params(),
            use_beam_search=self.use_beam_search,
            beam_width=self.best_of if self.use_beam_search else None,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            kv_transfer_params=self.kv_transfer_params,
            **{name: value for name, value in resolved.items() if value is not None},
        )
        try:
            return params.validate()
        except SamplingParamsError as exc:
            param = renames.get(exc.param, exc.param)
            raise bad_request(str(exc).replace(exc.param, param, 1), param=param) from None


class CompletionRequest(GenerationRequest, kw_only=True):
    null_means: ClassVar[dict[str, Any]] = {**GenerationRequest.null_means, "echo": False}
    # One prompt: text, token ids, or a batch list holding exactly one of those.
    prompt: str | list[int | str | list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: score the prompt, generate nothing (what lm-eval's loglikelihood sends)."""
        return self.echo and self.max_tokens == 0

    @property
    def num_prompt_logprobs(self) -> int | None:
        """Top logprobs per prompt token the response needs: echoed `logprobs`, vLLM's `prompt_logprobs`."""
        echoed = self.logprobs if self.echo else None
        if echoed is None or self.prompt_logprobs is None:
            return self.prompt_logprobs if echoed is None else echoed
        return max(echoed, self.prompt_logprobs)

    def sampling_params(self, max_tokens: int, defaults: dict[str, Any]) -> SamplingParams:
        if self.use_beam_search and self.echo_only:
            raise bad_request("echo with max_tokens 0 generates nothing to search; use beam search with "
                              "max_tokens of at least 1", param="max_tokens")
        return self._sampling_params(max_tokens, self.logprobs, {}, defaults, self.num_prompt_logprobs)


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


# OpenAI's roles; anything else would reach the chat template verbatim (prompt-format injection).
ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # a JSON object, serialised (as OpenAI sends and returns it)


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct):
    role: ChatRole
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers


class FunctionDefinition(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ChatTool(msgspec.Struct):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class FunctionName(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: FunctionName
    type: Literal["function"] = "function"


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(GenerationRequest, kw_only=True):
    null_means: ClassVar[dict[str, Any]] = {**GenerationRequest.null_means, "logprobs": False,
                                            "add_generation_prompt": True, "parallel_tool_calls": True}
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = True
    chat_template: str | None = None  # honoured only with --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None  # unset: "auto" with tools, else "none" (as OpenAI)
    parallel_tool_calls: bool | None = True

    @property
    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the OpenAI dicts chat templates and parsers take."""
        if self.tools is None:
            return None
        return [{"type": tool.type,
                 "function": {k: v for k, v in msgspec.structs.asdict(tool.function).items() if v is not None}}
                for tool in self.tools]

    @property
    def resolved_tool_choice(self) -> str | NamedToolChoice:
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def request_chat_template(self) -> str | None:
        """A template the request brings, top-level (vLLM's field) or inside chat_template_kwargs."""
        kwargs_template = (self.chat_template_kwargs or {}).get("chat_template")
        return self.chat_template if self.chat_template is not None else kwargs_template

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in (self.chat_template_kwargs or {}).items() if k != "chat_template"}

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def requested_max_tokens(self) -> int | None:
        # OpenAI deprecated max_tokens for max_completion_tokens; the newer name wins when both are set.
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling_params(self, max_tokens: int, defaults: dict[str, Any]) -> SamplingParams:
        if self.prompt_logprobs is not None:
            raise bad_request("prompt_logprobs is supported by /v1/completions only", param="prompt_logprobs")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(
            max_tokens, logprobs, {"logprobs": "top_logprobs", "max_tokens": self.max_tokens_param}, defaults
        )


def decode_request(body: bytes, request_type: type[RequestT]) -> RequestT:
    """Decode and type-check a JSON body, or raise a 400 naming the offending field."""
    try:
        return msgspec.json.decode(body, type=request_type)
    except msgspec.ValidationError as exc:
        raise bad_request(str(exc), param=_error_param(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None


def _error_param(message: str) -> str | None:
    """`... - at `$.messages[0]`` plus `missing required field `role`` -> "messages[0].role"."""
    path_match = _ERROR_PATH.search(message)
    parts = [path_match["path"]] if path_match and path_match["path"] else []
    missing = _MISSING_FIELD.search(message)
    if missing:
        parts.append(missing["field"])
    return ".".join(parts) or None

