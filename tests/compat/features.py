"""The engine's feature flags for the compatibility matrix, in one place: FEATURES and UNSUPPORTED.

Each feature has an "off" and an "on" setting (engine arguments of `LLM(...)`, and request fields
where a feature is a request-level one) and, where the setting could silently not take effect, the
evidence a run must show. A setting may also name the architecture of the tiny random checkpoint its cells
run on, engine and reference alike (the hybrid model's). A new feature adds one `Feature` here, and one
`Unsupported` per combination the engine refuses; the harness, the CI subset and docs/compatibility.md pick it
up from here (rerun `python -m tests.compat.matrix --write docs/compatibility.md`:
tests/unit/test_docs_compatibility.py fails until the page lists the feature). Not here yet: CUDA graphs (CUDA
only; the matrix runs on the CPU) and op backends (dtype's bf16 setting already pins ops for its reference, and
the per-op goldens are tests/kernels' and the op numerics test's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rapid_llm.ipc.messages import SchedulerStats, TokenLogprobs
from rapid_llm.sampling.lora_request import LoRARequest
from rapid_llm.sampling.params import StructuredOutputsParams
from tests.op_pins import BF16_PINNED


@dataclass(frozen=True)
class CellRun:
    """What one cell's engine produced: both passes over the prompts (tokens, top logprobs and text, in
    prompt order), and the engine's log."""

    first_pass: list[list[int]]
    second_pass: list[list[int]]
    first_logprobs: list[list[TokenLogprobs | None]]
    second_logprobs: list[list[TokenLogprobs | None]]
    # Prompt tokens served from the prefix cache in the second pass (the first filled it).
    cached_tokens_second_pass: int
    log: str
    # Each data-parallel replica's scheduler's last counters after both passes (None: none arrived), and the
    # engine's settings summary.
    stats: tuple[SchedulerStats | None, ...]
    summary: Mapping[str, Any]
    texts: list[str] = field(default_factory=list)  # both passes' output texts, first pass first
    routed: tuple[int, ...] = (0,)  # requests the router sent to each data-parallel replica
    eos_token_id: int | None = None


# (run, whether the feature was on) -> why the run shows the setting did not take effect, or None.
Evidence = Callable[[CellRun, bool], "str | None"]


# The architecture of the tiny random checkpoint a cell runs on where no setting names another.
DEFAULT_ARCHITECTURE = "LlamaForCausalLM"
HYBRID_ARCHITECTURE = "Qwen3_5ForCausalLM"
# Checkpoints a setting may name besides an architecture's own: (architecture, config overrides). Decode context
# parallelism over TP=2 needs one KV head replicated on both ranks.
ONE_KV_HEAD = "LlamaForCausalLM-1-kv-head"
CHECKPOINT_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {ONE_KV_HEAD: (DEFAULT_ARCHITECTURE,
                                                                            {"num_key_value_heads": 1})}


def checkpoint_spec(name: str) -> tuple[str, dict[str, Any]]:
    """(architecture, config overrides) of a checkpoint a setting names."""
    return CHECKPOINT_VARIANTS.get(name, (name, {}))


@dataclass(frozen=True)
class Setting:
    label: str
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    # SamplingParams fields over the harness's greedy ones, for request-level features.
    request: Mapping[str, Any] = field(default_factory=dict)
    # The architecture (or CHECKPOINT_VARIANTS name) of the tiny random float32 checkpoint a cell with this setting
    # runs on, its engine and its reference alike (None: DEFAULT_ARCHITECTURE's).
    architecture: str | None = None


@dataclass(frozen=True)
class Feature:
    name: str
    title: str
    off: Setting
    on: Setting
    evidence: Evidence | None = None
    # Too slow for the CI subset (extra processes per run); the full run covers it.
    slow: bool = False
    # Its "on" request carries no logprobs, so a tie cannot be told from a difference: a cell with it on must
    # give exactly the tokens of the same cell with it off (which is checked against the reference).
    golden_against_off: bool = False
    # Its "on" setting changes the numerics or the tokens themselves: a cell's reference is the engine with it
    # on too (and every op on its torch reference), not transformers.
    in_reference: bool = False


@dataclass(frozen=True)
class Unsupported:
    """A combination the engine refuses, or runs without one of its features, by design: every feature in
    `features` on, and `applies()`."""

    features: frozenset[str]
    reason: str
    applies: Callable[[], bool] = lambda: True


def _prefix_cache_used(run: CellRun, on: bool) -> str | None:
    """the second pass reuses cached prompt tokens when on, none when off"""
    if on and run.cached_tokens_second_pass == 0:
        return "prefix caching is on, yet the second pass over the same prompts reused no cached token"
    if not on and run.cached_tokens_second_pass:
        return f"prefix caching is off, yet {run.cached_tokens_second_pass} prompt tokens came from the cache"
    return None


def _preempted(run: CellRun, on: bool) -> str | None:
    """the engine logs a preemption when on, none when off"""
    happened = "preempted request" in run.log
    if on and not happened:
        return "preemption pressure is on, yet no request was preempted (the KV cache was not tight enough)"
    if not on and happened:
        return "a request was preempted with a KV cache sized to need no preemption"
    return None


def _drafts_verified(method: str) -> Evidence:
    def evidence(run: CellRun, on: bool) -> str | None:
        if any(stats is None for stats in run.stats):
            return "the scheduler published no counters"
        drafts = sum(stats.spec_decode_num_drafts for stats in run.stats if stats is not None)
        configured = (run.summary.get("speculative_config") or {}).get("method")
        if on and configured != method:
            return f"{method} speculation is on, yet the engine's speculative method is {configured!r}"
        if on and drafts == 0:
            return "speculative decoding is on, yet no draft was verified"
        if not on and configured is None and drafts:
            return f"speculative decoding is off, yet {drafts} drafts were verified"
        return None

    evidence.__doc__ = "the scheduler counts verified drafts when on, none when off"
    return evidence


def _lora_enabled(run: CellRun, on: bool) -> str | None:
    """the engine's summary has --enable-lora's settings when on, none when off"""
    enabled = run.summary.get("lora") is not None
    if on != enabled:
        return f"LoRA is {'on' if on else 'off'}, yet the engine's summary says lora {run.summary.get('lora')!r}"
    return None


def _serves(architecture: str) -> Evidence:
    def evidence(run: CellRun, on: bool) -> str | None:
        served = run.summary.get("architecture")
        if on and served != architecture:
            return f"the {architecture} checkpoint was asked for, yet the engine serves {served!r}"
        return None

    evidence.__doc__ = f"the engine's summary names {architecture} when on"
    return evidence


def _quantized(run: CellRun, on: bool) -> str | None:
    """the engine's summary names the quantization method when on, none when off"""
    quantization = run.summary.get("quantization")
    if on and not quantization:
        return "--quantization fp8 was given, yet the engine reports no quantization"
    if not on and quantization:
        return f"no quantization was asked for, yet the engine reports {quantization}"
    return None


def _kv_cache_fp8(run: CellRun, on: bool) -> str | None:
    """the engine's summary names the fp8 KV cache when on, the model dtype's (auto) when off"""
    kv_cache_dtype = run.summary.get("kv_cache_dtype")
    if on and kv_cache_dtype != "fp8":
        return f"--kv-cache-dtype fp8 was given, yet the engine reports {kv_cache_dtype!r}"
    if not on and kv_cache_dtype != "auto":
        return f"no KV-cache dtype was asked for, yet the engine reports {kv_cache_dtype!r}"
    return None


# Letters and spaces only: text a random byte-level model never writes by itself for 24 tokens, and a language
# that is complete after every token, so min_tokens (the harness's 24) never contradicts it.
CONSTRAINT_REGEX = "[a-z ]*"


def _constrained(run: CellRun, on: bool) -> str | None:
    """every output's text matches the regex when on"""
    if on and (text := next((t for t in run.texts if not re.fullmatch(CONSTRAINT_REGEX, t)), None)) is not None:
        return f"structured output is on, yet an output does not match {CONSTRAINT_REGEX!r}: {text!r}"
    return None


def _staged(run: CellRun, on: bool) -> str | None:
    """the engine's summary has two pipeline stages when on, one when off"""
    stages = run.summary.get("pipeline_parallel_size")
    if stages != (2 if on else 1):
        return f"pipeline parallelism is {'on' if on else 'off'}, yet the engine's summary says {stages} stages"
    return None


def _context_split(summary_key: str) -> Evidence:
    def evidence(run: CellRun, on: bool) -> str | None:
        size = run.summary.get(summary_key)
        if size != (2 if on else 1):
            return f"context parallelism is {'on' if on else 'off'}, yet the engine's summary says {summary_key} {size}"
        return None

    evidence.__doc__ = f"the engine's summary has {summary_key} 2 when on, 1 when off"
    return evidence


def _replicas_used(run: CellRun, on: bool) -> str | None:
    """the router sends requests to both replicas when on; one replica when off"""
    if on and (len(run.routed) != 2 or 0 in run.routed):
        return f"data parallelism is on, yet the requests per replica were {list(run.routed)}"
    if not on and len(run.routed) != 1:
        return f"data parallelism is off, yet there are {len(run.routed)} replicas"
    return None


# Drafts are made only for requests without logprobs, min_tokens or penalties (scheduler_proc/speculation.py):
# speculation's "on" asks for neither and lets EOS through as an ordinary token instead of masking it.
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
NO_DRAFT_BLOCKERS = {"logprobs": None, "min_tokens": 0, "ignore_eos": True}
# The harness puts the cell's checkpoint where a setting names TARGET_CHECKPOINT: the draft model is the target
# itself (the tiny Llama, or the Qwen3.5 with the hybrid model on; a draft needs the target's vocabulary). It
# still runs the whole draft-model path: its own layers and KV cache, catch-up, verification.
TARGET_CHECKPOINT = "<target checkpoint>"
DRAFT_MODEL = {"method": "draft_model", "model": TARGET_CHECKPOINT, "num_speculative_tokens": 3}
# Where a request's adapter names TARGET_ADAPTER the harness puts a random PEFT adapter of the cell's checkpoint
# (rank 8 on every attention and MLP projection; benchmarks/common/lora_adapters.py).
TARGET_ADAPTER = "<adapter of the target checkpoint>"
LORA_REQUEST = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=TARGET_ADAPTER)

# The prompts (tests/compat/harness.py) are 5-40 tokens with 24 new tokens each: a budget of 8 tokens
# chunks every prompt but the shortest, 256 fits all four prompts in one step; 20 blocks of 4 tokens
# hold 80 tokens, under the ~180 the four requests need at once.
FEATURES: tuple[Feature, ...] = (
    Feature("async_scheduling", "async scheduling",
            off=Setting("off", {"disable_async_scheduling": True}),
            on=Setting("on", {"disable_async_scheduling": False})),
    Feature("chunked_prefill", "chunked prefill",
            off=Setting("off", {"max_num_batched_tokens": 256}),
            on=Setting("on", {"max_num_batched_tokens": 8})),
    Feature("prefix_caching", "prefix caching",
            off=Setting("off", {"enable_prefix_caching": False}),
            on=Setting("on", {"enable_prefix_caching": True}),
            evidence=_prefix_cache_used),
    Feature("preemption", "preemption pressure",
            off=Setting("off", {"num_kv_blocks": 128}),
            on=Setting("on", {"num_kv_blocks": 20, "block_size": 4, "max_model_len": 80}),
            evidence=_preempted),
    Feature("dtype", "dtype",
            off=Setting("float32", {"dtype": "float32"}),
            on=Setting("bfloat16", {"dtype": "bfloat16", "op_backend": BF16_PINNED}), in_reference=True),
    Feature("speculative", "speculative decoding",
            off=Setting("off"),
            on=Setting("ngram", {"speculative_config": NGRAM}, request=NO_DRAFT_BLOCKERS),
            evidence=_drafts_verified("ngram"), golden_against_off=True),
    Feature("quantization", "quantization",
            off=Setting("off"),
            on=Setting("fp8", {"quantization": "fp8"}),
            evidence=_quantized, in_reference=True),
    Feature("tensor_parallel", "tensor parallel",
            off=Setting("1"),
            on=Setting("2", {"tensor_parallel_size": 2}),
            slow=True),
    Feature("draft_model", "draft-model speculation",
            off=Setting("off"),
            on=Setting("draft model", {"speculative_config": DRAFT_MODEL}, request=NO_DRAFT_BLOCKERS),
            evidence=_drafts_verified("draft_model"), golden_against_off=True),
    Feature("data_parallel", "data parallel",
            off=Setting("1", {"data_parallel_size": 1}),
            # cache_aware sends the second pass's prompts back to the replica that holds their prefix.
            on=Setting("2", {"data_parallel_size": 2, "load_balance_method": "cache_aware"}),
            evidence=_replicas_used, slow=True),
    Feature("structured_output", "structured output",
            off=Setting("off"),
            on=Setting("regex", request={"structured_outputs": StructuredOutputsParams(regex=CONSTRAINT_REGEX)}),
            evidence=_constrained, in_reference=True),
    Feature("kv_cache_fp8", "fp8 KV cache",
            off=Setting("auto"),
            on=Setting("fp8", {"kv_cache_dtype": "fp8"}),
            evidence=_kv_cache_fp8, in_reference=True),
    # Gated DeltaNet layers with recurrent state (prefix hits through state snapshots, rollback of rejected drafts)
    # around gated full attention; its reference is transformers on the same checkpoint.
    Feature("hybrid_model", "hybrid model",
            off=Setting("Llama"),
            on=Setting("Qwen3.5", architecture=HYBRID_ARCHITECTURE),
            evidence=_serves(HYBRID_ARCHITECTURE)),
    Feature("pipeline_parallel", "pipeline parallel",
            off=Setting("1", {"pipeline_parallel_size": 1}),
            on=Setting("2", {"pipeline_parallel_size": 2}),
            evidence=_staged, slow=True),
    # Two TP ranks holding the one KV head split each sequence's tokens (TP=2 whether or not TP is on).
    Feature("decode_context_parallel", "decode context parallel",
            off=Setting("1", {"decode_context_parallel_size": 1}),
            on=Setting("2", {"tensor_parallel_size": 2, "decode_context_parallel_size": 2}, architecture=ONE_KV_HEAD),
            evidence=_context_split("decode_context_parallel_size"), slow=True),
    Feature("prefill_context_parallel", "prefill context parallel",
            off=Setting("1", {"prefill_context_parallel_size": 1}),
            on=Setting("2", {"prefill_context_parallel_size": 2}),
            evidence=_context_split("prefill_context_parallel_size"), slow=True),
    # Its reference is the engine with the adapter and every op on its torch reference; that the adapter's tokens
    # equal transformers + PEFT is tests/e2e/test_lora_server.py's.
    Feature("lora", "LoRA adapter",
            off=Setting("off"),
            on=Setting("adapter", {"enable_lora": True, "max_lora_rank": 8}, request={"lora": LORA_REQUEST}),
            evidence=_lora_enabled, in_reference=True),
)

_NO_DRAFTS = ("requests with structured output decode without drafts (the grammar matcher would have to "
              "advance per draft; docs/spec_decode/README.md), so speculation could not show it ran")

_LORA_DRAFTS = ("the engine refuses --enable-lora with --speculative-config at start-up: drafts and their "
                "verification would run without the request's adapter (docs/lora.md)")

_STAGES = ("the engine refuses {flag} with --pipeline-parallel-size > 1 at start-up: {why} "
           "(docs/parallelism.md)")
_STAGED_DRAFTS = _STAGES.format(flag="--speculative-config", why="drafts are proposed and verified on one stage's "
                                "hidden states and a proposer's own layers are not staged")

_DCP = "the engine refuses --decode-context-parallel-size 2 with {flag} at start-up: {why} (docs/parallelism.md)"
_DCP_REFUSALS = {
    "speculative": _DCP.format(flag="--speculative-config", why="drafts are verified by the single-rank backends"),
    "draft_model": _DCP.format(flag="--speculative-config", why="drafts are verified by the single-rank backends"),
    "quantization": _DCP.format(flag="--quantization", why="its two TP ranks would slice quantized linears, which "
                                "tensor parallelism refuses"),
    "kv_cache_fp8": _DCP.format(flag="--kv-cache-dtype fp8", why="the DCP backend reads float caches only"),
    "pipeline_parallel": _DCP.format(flag="--pipeline-parallel-size 2", why="not combined yet"),
    "prefill_context_parallel": _DCP.format(flag="--prefill-context-parallel-size 2", why="not combined yet"),
    "hybrid_model": "a cell runs on one checkpoint: decode context parallelism's has one KV head, the hybrid "
                    "model's is Qwen3.5 (whose recurrent layers are not split over context-parallel ranks)",
}
_PCP = "the engine refuses --prefill-context-parallel-size 2 with {flag} at start-up: {why} (docs/parallelism.md)"
_PCP_REFUSALS = {
    "speculative": _PCP.format(flag="--speculative-config", why="drafts are proposed over the whole step's hidden "
                               "states on one rank"),
    "draft_model": _PCP.format(flag="--speculative-config", why="drafts are proposed over the whole step's hidden "
                               "states on one rank"),
    "lora": _PCP.format(flag="--enable-lora", why="adapter rows follow the whole step's tokens"),
    "kv_cache_fp8": _PCP.format(flag="--kv-cache-dtype fp8", why="the gathered K/V are written as floats"),
    "pipeline_parallel": _PCP.format(flag="--pipeline-parallel-size 2", why="not combined yet"),
    "hybrid_model": _PCP.format(flag="Qwen3.5", why="recurrent layers are not split over context-parallel ranks"),
}

UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(frozenset({"pipeline_parallel", "speculative"}), _STAGED_DRAFTS),
    Unsupported(frozenset({"pipeline_parallel", "draft_model"}), _STAGED_DRAFTS),
    Unsupported(frozenset({"pipeline_parallel", "lora"}),
                _STAGES.format(flag="--enable-lora", why="adapters are checked against the first stage's modules")),
    Unsupported(frozenset({"pipeline_parallel", "hybrid_model"}),
                "the engine refuses --pipeline-parallel-size > 1 for Qwen3.5 at start-up: only the Llama family's "
                "decoder stack is split into stages (docs/parallelism.md)"),
    *(Unsupported(frozenset({"decode_context_parallel", other}), reason) for other, reason in _DCP_REFUSALS.items()),
    *(Unsupported(frozenset({"prefill_context_parallel", other}), reason) for other, reason in _PCP_REFUSALS.items()),
    Unsupported(frozenset({"speculative", "lora"}), _LORA_DRAFTS),
    Unsupported(frozenset({"draft_model", "lora"}), _LORA_DRAFTS),
    Unsupported(frozenset({"tensor_parallel", "quantization"}),
                "the engine refuses --quantization with --tensor-parallel-size > 1 at start-up: the quantized "
                "linear methods' scales have not been tested sliced over ranks (docs/parallelism.md)"),
    Unsupported(frozenset({"speculative", "draft_model"}),
                "one --speculative-config per engine: n-gram and draft-model speculation are two methods of it"),
    Unsupported(frozenset({"speculative", "structured_output"}), _NO_DRAFTS),
    Unsupported(frozenset({"draft_model", "structured_output"}), _NO_DRAFTS),
    Unsupported(frozenset({"draft_model", "hybrid_model"}),
                "the draft model is the cell's checkpoint, and the engine refuses a draft model with recurrent state "
                "at start-up (its own drafts would need their state rolled back); a hybrid target with an "
                "attention-only draft is tests/models/test_hybrid_serving.py's"),
)
