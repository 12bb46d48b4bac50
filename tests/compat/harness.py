"""The compatibility harness: the golden greedy test run once per combination of feature settings.

A combination names the features that are on (the rest are off): the baseline (none), each feature
alone, every pair, and all on -- so every pair of values of any two features is run, with everything
else off. A cell runs on the tiny random checkpoint of the architecture its settings name (`Setting.architecture`:
the hybrid model's Qwen3.5, else the Llama), one per architecture, built on first use by the caller's
`CheckpointSource`; its engine and its reference both load that one. A cell starts the offline `LLM` with the
combination's settings, generates greedy tokens for
the prompts twice (the second pass, in reverse order, finds the first's most recent blocks in the
prefix cache) and compares both passes with the cell's reference, then checks each feature's evidence.
A cell with none of the features that change numerics or tokens on (`Feature.in_reference`: dtype,
quantization, the fp8 KV cache, structured output, a LoRA adapter) is float32 and its reference is transformers,
matched exactly. Otherwise the reference is the engine with those features on, every other feature off and every op
on its torch reference (transformers rounds bf16 in another order, tests/op_pins.py; it has no fp8 path and
no grammar); an output may part from such a reference only at a tie (NEAR_TIE_NATS, FP8_NEAR_TIE_NATS with
fp8 weights or KV), as another batch shape (a chunked prefill) rounds differently. A feature whose request carries
no logprobs (speculative decoding,
n-gram or draft model: they would disable it) is checked on/off instead: its cell must give exactly the
tokens of the same cell with it off (which meets the reference as above) or, for a prompt where that run parted
from the reference at a tie, exactly the reference's. The engine's stderr (its children's
too) is captured for evidence and reasons, and every data-parallel replica's scheduler counters are read from
the channel the server's frontend would read.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import msgspec
import torch
import zmq

from rapid_llm import LLM, SamplingParams
from rapid_llm.ipc.messages import SchedulerStats, SchedulerToFrontend, TokenLogprobs
from rapid_llm.ipc.sockets import Receiver
from benchmarks.common.lora_adapters import ATTENTION, MLP, random_adapter
from rapid_llm.sampling.lora_request import LoRARequest
from tests.compat.features import (DEFAULT_ARCHITECTURE, FEATURES, TARGET_ADAPTER, TARGET_CHECKPOINT, UNSUPPORTED,
                                   CellRun, Feature, Unsupported, checkpoint_spec)
from tests.hf_reference import hf_greedy, hf_model
from tests.op_pins import ALL_REFERENCE

NEW_TOKENS = 24
PROMPT_LENGTHS = (5, 13, 29, 40)
BASE_ENGINE_ARGS = {"log_level": "warning"}
TOP_LOGPROBS = 20  # the most a request may ask: a grammar may pick a token far down the raw distribution
# One bf16 rounding step of a logit between 8 and 16 (7 stored mantissa bits: 8 * 2**-7); measured: a chunked
# bf16 prefill picks token 161 over 93 at -3.356 vs -3.387 where the unchunked reference has them both at -3.354.
NEAR_TIE_NATS = 0.0625
# With fp8 weights or an fp8 KV cache an element that rounds across a code boundary moves by one e4m3 step (2**-3
# relative), not one bf16 step; measured: a chunked fp8 cell picks token 87 over 119 by 0.14 nats where the
# reference prefers 119 by 0.03.
FP8_NEAR_TIE_NATS = 0.25
FP8_FEATURES = frozenset({"quantization", "kv_cache_fp8"})

Combination = tuple[str, ...]  # the names of the features that are on, in FEATURES order
# (architecture, **config overrides) -> the directory of its tiny random float32 checkpoint, built on first use and
# the same after (a setting's checkpoint name resolves through features.checkpoint_spec).
CheckpointSource = Callable[..., Path]


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def combinations(features: Sequence[Feature] = FEATURES,
                 unsupported: Sequence[Unsupported] = UNSUPPORTED) -> list[Combination]:
    """Baseline, each feature alone, every pair, then all on (when that is not already a pair); where all on
    is unsupported, also every largest supported combination of more than two features (all on but one, or
    but two, ...), so every feature still runs with as many of the rest as the engine allows. All on and its
    largest supported combinations run once per checkpoint: also with each feature that names another
    checkpoint (the hybrid model) off, so the default checkpoint runs every feature together too."""
    names = [feature.name for feature in features]
    result: list[Combination] = [(), *((name,) for name in names), *itertools.combinations(names, 2)]
    other_architectures = [feature.name for feature in features
                           if feature.on.architecture and checkpoint_spec(feature.on.architecture)[0]
                           != DEFAULT_ARCHITECTURE]
    for switched_off in (None, *other_architectures):
        kept = [name for name in names if name != switched_off]
        if len(kept) > 2:
            largest = [tuple(kept)]
            if unsupported_reason(tuple(kept), unsupported) is not None:
                largest += largest_supported(kept, unsupported)
            result += [combination for combination in largest if combination not in result]
    return result


def largest_supported(names: Sequence[str], unsupported: Sequence[Unsupported]) -> list[Combination]:
    """The supported combinations of more than two features that no larger supported one contains, fewest
    features left out first, then in the order of the features left out."""
    found: list[Combination] = []
    for dropped in range(1, len(names) - 2):
        for left_out in itertools.combinations(names, dropped):
            combination = tuple(n for n in names if n not in left_out)
            if (unsupported_reason(combination, unsupported) is None
                    and not any(set(combination) < set(larger) for larger in found)):
                found.append(combination)
    return found


def settings(combination: Combination, features: Sequence[Feature] = FEATURES) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine args, request fields) of a combination; two features setting one argument differently is
    an error in the feature table."""
    unknown = set(combination) - {feature.name for feature in features}
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {[f.name for f in features]}")
    engine_args: dict[str, Any] = dict(BASE_ENGINE_ARGS)
    request: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for feature in features:
        setting = feature.on if feature.name in combination else feature.off
        for target, values in ((engine_args, setting.engine_args), (request, setting.request)):
            for key, value in values.items():
                if key in owner and target[key] != value:
                    raise ValueError(f"features {owner[key]} and {feature.name} both set {key} "
                                     f"({target[key]!r} vs {value!r}); give it to one of them")
                target[key], owner[key] = value, feature.name
    return engine_args, request


def cell_architecture(combination: Combination, features: Sequence[Feature] = FEATURES) -> str:
    """The architecture of the checkpoint a combination runs on; two features naming different ones is an error
    in the feature table."""
    named = {feature.name: setting.architecture for feature in features
             for setting in (feature.on if feature.name in combination else feature.off,) if setting.architecture}
    if len(set(named.values())) > 1:
        raise ValueError(f"features {' and '.join(named)} name different checkpoints ({', '.join(named.values())}); "
                         "a cell runs on one")
    return next(iter(named.values()), DEFAULT_ARCHITECTURE)


def unsupported_reason(combination: Combination, unsupported: Sequence[Unsupported] = UNSUPPORTED) -> str | None:
    for entry in unsupported:
        if entry.features <= set(combination) and entry.applies():
            return entry.reason
    return None


@dataclass(frozen=True)
class CellResult:
    combination: Combination
    status: str  # "passed", "failed" or "unsupported"
    reason: str = ""
    seconds: float = 0.0


@contextlib.contextmanager
def captured_stderr() -> Iterator[Path]:
    """Point file descriptor 2 at a temporary file (children started meanwhile inherit it)."""
    with tempfile.NamedTemporaryFile("w+b", prefix="rapid_llm-compat-", suffix=".log") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield Path(log.name)
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def greedy(request: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
                             "logprobs": TOP_LOGPROBS, **request})


def last_stats(receiver: Receiver, quiet_s: float = 0.3) -> SchedulerStats | None:
    """The newest counters the scheduler published, once it is idle and quiet for `quiet_s`."""
    stats = None
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if not receiver.socket.poll(int(quiet_s * 1000)):
            if stats is not None and stats.num_running == stats.num_waiting == 0:
                break
            continue
        message = receiver.recv_nowait()
        if isinstance(message, SchedulerStats):
            stats = message
    return stats


def target_adapter(checkpoint: Path) -> Path:
    """A random LoRA adapter of `checkpoint` beside it, built on first use (the same weights after)."""
    folder = checkpoint.parent / f"{checkpoint.name}-lora"
    if not (folder / "adapter_config.json").is_file():
        random_adapter(checkpoint, folder, 8, ATTENTION + MLP, seed=0)
    return folder


def _with_checkpoint(value: Any, checkpoint: Path) -> Any:
    """`value` with TARGET_CHECKPOINT replaced by the cell's checkpoint and an adapter at TARGET_ADAPTER by its
    random adapter, inside dicts too."""
    if isinstance(value, dict):
        return {key: _with_checkpoint(item, checkpoint) for key, item in value.items()}
    if isinstance(value, LoRARequest) and value.lora_path == TARGET_ADAPTER:
        return msgspec.structs.replace(value, lora_path=str(target_adapter(checkpoint)))
    return str(checkpoint) if value == TARGET_CHECKPOINT else value


# The last line of a logged traceback: the exception an engine process died of.
_LOGGED_EXCEPTION = re.compile(r"^[A-Za-z_.]*(Error|Exception): .+", re.MULTILINE)


def generate_twice(checkpoint: Path, prompt_ids: list[list[int]], engine_args: dict[str, Any],
                   request: dict[str, Any]) -> CellRun:
    context = zmq.Context()
    try:
        with captured_stderr() as log_path:
            try:
                with LLM(model=str(checkpoint), **_with_checkpoint(engine_args, checkpoint)) as llm:
                    # The offline LLM does not read the schedulers' counters; the harness binds their channels
                    # (a scheduler retries what it could not send, so the newest snapshot arrives).
                    counters: list[Receiver] = [Receiver(context, paths.scheduler_to_frontend, SchedulerToFrontend)
                                                for paths in llm._engine.replica_paths]
                    params = greedy(_with_checkpoint(request, checkpoint))
                    first = llm.generate(prompt_ids, params)
                    second = llm.generate(prompt_ids[::-1], params)[::-1]
                    stats = tuple(last_stats(receiver) for receiver in counters)
                    for receiver in counters:
                        receiver.socket.close()
                    summary = llm.config.summary()
                    routed = tuple(load.routed for load in llm._router.loads)
                    eos_token_id = llm.tokenizer.eos_token_id
            except Exception as error:  # the log is captured, so "see the log above" would point at nothing
                logged = _LOGGED_EXCEPTION.search(log_path.read_text(errors="replace"))
                if logged is not None and logged.group(0) not in str(error):
                    error.add_note(f"the engine's log: {logged.group(0)}")
                raise
            log = log_path.read_text(errors="replace")
    finally:
        context.destroy(linger=0)
    return CellRun([o.token_ids for o in first], [o.token_ids for o in second],
                   [o.outputs[0].logprobs for o in first], [o.outputs[0].logprobs for o in second],
                   sum(o.num_cached_tokens for o in second), log, stats, summary,
                   [o.text for o in first] + [o.text for o in second], routed, eos_token_id)


@dataclass(frozen=True)
class Reference:
    tokens: list[list[int]]
    # Top logprobs per output token where ties are tolerated (None: the tokens must match exactly).
    logprobs: list[list[TokenLogprobs | None]] | None
    tie_nats: float = NEAR_TIE_NATS  # how far apart two tokens may be and still count as a tie


def reference_features(combination: Combination, features: Sequence[Feature] = FEATURES) -> Combination:
    """The features of `combination` that its reference keeps on (`Feature.in_reference`)."""
    kept = {feature.name for feature in features if feature.in_reference}
    return tuple(name for name in combination if name in kept)


class References:
    """The reference per checkpoint and combination of `in_reference` features, computed on first use (see the
    module docstring for which), and the runs of cells that others are checked on/off against."""

    def __init__(self, checkpoints: CheckpointSource, prompt_ids: list[list[int]]) -> None:
        self.checkpoints = checkpoints
        self.prompt_ids = prompt_ids
        self._references: dict[tuple[str, Combination], Reference] = {}
        self.runs: dict[Combination, CellRun] = {}

    def checkpoint(self, name: str) -> Path:
        """The checkpoint a setting names (an architecture or a CHECKPOINT_VARIANTS name)."""
        architecture, overrides = checkpoint_spec(name)
        return self.checkpoints(architecture, **overrides)

    def get(self, architecture: str = DEFAULT_ARCHITECTURE, kept: Combination = (),
            features: Sequence[Feature] = FEATURES) -> Reference:
        key = (architecture, kept)
        if key not in self._references:
            checkpoint = self.checkpoint(architecture)
            if not kept:  # the checkpoint is float32, which is what "auto" gives where no feature sets the dtype
                model = hf_model(checkpoint, torch.float32)
                self._references[key] = Reference(hf_greedy(model, self.prompt_ids, NEW_TOKENS), None)
            else:
                engine_args, request = settings(kept, features)
                engine_args.update(**ALL_REFERENCE)
                run = generate_twice(checkpoint, self.prompt_ids, engine_args, request)
                tie_nats = FP8_NEAR_TIE_NATS if FP8_FEATURES & set(kept) else NEAR_TIE_NATS
                self._references[key] = Reference(run.first_pass, run.first_logprobs, tie_nats)
        return self._references[key]


def _logprob(entry: TokenLogprobs | None, token: int) -> float | None:
    return None if entry is None else dict(zip(entry.top_token_ids, entry.top_logprobs)).get(token)


def _near_tie(ours: TokenLogprobs | None, theirs: TokenLogprobs | None, our_token: int, their_token: int,
              tie_nats: float) -> bool:
    """Each side ranks the other's token within `tie_nats` of its own choice."""
    gaps = [(_logprob(entry, chosen), _logprob(entry, other))
            for entry, chosen, other in ((ours, our_token, their_token), (theirs, their_token, our_token))]
    return all(a is not None and b is not None and a - b <= tie_nats for a, b in gaps)


def compare(tokens: list[list[int]], logprobs: list[list[TokenLogprobs | None]],
            reference: Reference) -> tuple[str | None, list[str]]:
    """(the first mismatch, or None; the near ties where the output parted from a tolerant reference)."""
    ties = []
    for index, (got, want) in enumerate(zip(tokens, reference.tokens)):
        if got == want:
            continue
        position = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        where = (f"prompt {index} ({PROMPT_LENGTHS[index]} tokens): output token {position} is "
                 f"{got[position] if position < len(got) else 'missing'}, the reference's "
                 f"{want[position] if position < len(want) else 'missing'}")
        if (reference.logprobs is not None and position < min(len(got), len(want))
                and _near_tie(logprobs[index][position], reference.logprobs[index][position], got[position],
                              want[position], reference.tie_nats)):
            ties.append(where)
            continue
        return where, ties
    return None, ties


def _failure(error: Exception) -> str:
    """One line on why an engine failed: its error's first line, and what the engine's log adds."""
    return "; ".join([f"{type(error).__name__}: {str(error).splitlines()[0]}", *getattr(error, "__notes__", ())])


def _engine_run(checkpoint: Path, combination: Combination, references: References,
                features: Sequence[Feature]) -> CellRun:
    """The cell's run, kept when a cell checked on/off against it may ask for it again."""
    if combination not in references.runs:
        engine_args, request = settings(combination, features)
        run = generate_twice(checkpoint, references.prompt_ids, engine_args, request)
        if any(feature.golden_against_off for feature in features if feature.name in combination):
            return run
        references.runs[combination] = run
    return references.runs[combination]


def _against_reference(run: CellRun, expected: Reference) -> tuple[list[str], list[str]]:
    problems, ties = [], []
    for name, tokens, logprobs in (("first pass", run.first_pass, run.first_logprobs),
                                   ("second pass", run.second_pass, run.second_logprobs)):
        mismatch, pass_ties = compare(tokens, logprobs, expected)
        if mismatch is not None:
            problems.append(f"{name}: {mismatch}")
        ties += [f"{name}: {tie}" for tie in pass_ties]
    return problems, ties


def run_cell(combination: Combination, references: References, features: Sequence[Feature] = FEATURES,
             unsupported: Sequence[Unsupported] = UNSUPPORTED) -> CellResult:
    """Run one combination; a declared-unsupported one is not started."""
    reason = unsupported_reason(combination, unsupported)
    if reason is not None:
        return CellResult(combination, "unsupported", reason)
    started = time.perf_counter()
    engine_args, _ = settings(combination, features)
    architecture = cell_architecture(combination, features)
    kept = reference_features(combination, features)
    try:
        checkpoint = references.checkpoint(architecture)
        expected = references.get(architecture, kept, features)
    except Exception as error:  # the reference engine refused or crashed: the cell cannot be judged
        return CellResult(combination, "failed", f"reference ({'+'.join((architecture, *kept))}): "
                          f"{_failure(error)}", time.perf_counter() - started)
    on_off = [f for f in features if f.golden_against_off and f.name in combination]
    without = tuple(name for name in combination if name not in {f.name for f in on_off})
    try:
        run = _engine_run(checkpoint, combination, references, features)
        baseline = _engine_run(checkpoint, without, references, features) if on_off else run
    except Exception as error:  # the engine refused or crashed: the cell failed, and says how
        return CellResult(combination, "failed", _failure(error), time.perf_counter() - started)
    problems, ties = _against_reference(baseline, expected)
    eos_notes: list[str] = []
    sided_notes: list[str] = []
    if on_off:
        off = f"with {' and '.join(f.title for f in on_off)} off"
        problems = [f"{off}: {problem}" for problem in problems]
        ties = [f"{off}: {tie}" for tie in ties]
        for name, tokens, wanted in (("first pass", run.first_pass, baseline.first_pass),
                                     ("second pass", run.second_pass, baseline.second_pass)):
            # The on run's request lets EOS through as an ordinary token (NO_DRAFT_BLOCKERS), the off run's
            # masks it until the last token (min_tokens): where EOS is the model's choice they part by request,
            # so the comparison stops at the on run's first EOS.
            cut = [t[:t.index(run.eos_token_id)] if run.eos_token_id in t else t for t in tokens]
            for index, (whole, kept_part) in enumerate(zip(tokens, cut)):
                if len(kept_part) < len(whole):
                    eos_notes.append(f"{name}: prompt {index} ({PROMPT_LENGTHS[index]} tokens) compared with the run "
                                     f"{off} up to output token {len(kept_part)}, the EOS its request lets through")
            # Where the off run parted from the reference at a tie (checked above), the on run, whose other batch
            # shapes round differently, may side with the reference instead: both are the same model's choice.
            sided = [r[:len(t)] if t == r[:len(t)] and t != w[:len(t)] else w[:len(t)]
                     for t, w, r in zip(cut, wanted, expected.tokens)]
            sided_notes += [f"{name}: prompt {index} ({PROMPT_LENGTHS[index]} tokens) matches the reference where the "
                            f"run {off} parted from it at a tie" for index, (t, w) in enumerate(zip(cut, wanted))
                            if sided[index] != w[:len(t)]]
            mismatch, _ = compare(cut, [], Reference(sided, None))
            if mismatch is not None:
                problems.append(f"{name}, against the run {off}: {mismatch}")
    for feature in features:
        if feature.evidence is not None and (missing := feature.evidence(run, feature.name in combination)):
            problems.append(missing)
    seconds = time.perf_counter() - started
    if problems:
        return CellResult(combination, "failed", "; ".join(problems), seconds)
    precision = " ".join(filter(None, (engine_args.get("dtype", "float32"), engine_args.get("quantization"),
                                       "fp8 KV cache" if engine_args.get("kv_cache_dtype") == "fp8" else None)))
    notes = [f"parted from the reference only at ties at {precision} precision: " + "; ".join(ties)] if ties else []
    return CellResult(combination, "passed", "; ".join(notes + sided_notes + eos_notes), seconds)


def run_matrix(checkpoints: CheckpointSource, selected: Sequence[Combination] | None = None,
               features: Sequence[Feature] = FEATURES, unsupported: Sequence[Unsupported] = UNSUPPORTED,
               progress: bool = False) -> list[CellResult]:
    references = References(checkpoints, prompts())
    results = []
    for combination in selected if selected is not None else combinations(features, unsupported):
        result = run_cell(combination, references, features, unsupported)
        if progress:
            print(f"{'+'.join(combination) or 'baseline'}: {result.status} ({result.seconds:.1f} s) {result.reason}",
                  flush=True)
        results.append(result)
    return results
