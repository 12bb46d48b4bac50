"""bench_accuracy's backend-independent part: held-out documents, scoring windows, next-line cases, metrics.

Key design choice: everything a backend sees is token ids built here, so every backend scores the
very same sequences. A document is ``[BOS] + tokens(text)`` (no EOS: lm-eval's
``loglikelihood_rolling`` does not score one either), cut into windows of ``window + 1`` tokens that
overlap by one: the first token of each window is context only and was scored as the last token of
the window before, so every document token is scored exactly once. A document's last window is
extended to the left to full length and scores only its new tokens. These are exactly lm-eval's
rolling windows (``max_length=window`` for its hf model, ``window + 2`` for its API models).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.demo_model.data import split_files

Tokenize = Callable[[str], list[int]]


@dataclasses.dataclass
class WindowScore:
    """One window's scored tokens (all but its first): log-probabilities, top-1 hits, argmax ids."""

    logprobs: list[float]
    top1: list[bool]
    argmax: list[int] | None

    def last(self, count: int) -> WindowScore:
        """The scores of the last ``count`` tokens only."""
        return WindowScore(self.logprobs[-count:], self.top1[-count:],
                           None if self.argmax is None else self.argmax[-count:])


@dataclasses.dataclass
class LineCase:
    """Predict ``line`` (stripped) from the document text that ends just before its newline."""

    path: str
    lineno: int
    prompt: list[int]
    line: str


def load_documents(path: Path) -> list[tuple[str, str]]:
    """(relative path, text) of each file of a held-out text joined as tools/demo_model/data.py joins it."""
    return list(split_files(path.read_text(encoding="utf-8")).items())


def select_documents(token_counts: Sequence[int], limit: int | None, max_tokens_total: int | None) -> list[int]:
    """Indices of the first documents in file order: at most ``limit``, whole ones up to ``max_tokens_total``."""
    chosen: list[int] = []
    total = 0
    for index, count in enumerate(token_counts[:limit]):
        if max_tokens_total is not None and chosen and total + count > max_tokens_total:
            break
        chosen.append(index)
        total += count
    return chosen


def windows(tokens: Sequence[int], bos: int, window: int) -> list[tuple[list[int], int]]:
    """``[bos] + tokens`` as (window, how many of its last tokens to score): every token after BOS is
    scored once, with at most ``window`` tokens of context and, where the document allows, exactly that."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    sequence = [bos, *tokens]
    return [(sequence[max(0, end - window - 1):end], end - start)
            for start in range(1, len(sequence), window) for end in [min(start + window, len(sequence))]]


def _function_body_lines(text: str) -> set[int]:
    """1-based numbers of the lines inside function bodies (the ``def`` line itself excluded)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    return {lineno for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for lineno in range(node.body[0].lineno, (node.end_lineno or node.body[0].lineno) + 1)}


def line_cases(documents: Sequence[tuple[str, str]], tokenize: Tokenize, bos: int, num_lines: int,
               context_tokens: int) -> list[LineCase]:
    """``num_lines`` cases evenly spaced over every eligible line of ``documents``.

    A line is eligible when it is non-blank, inside a function body, and follows a non-blank line:
    the prompt then ends where the previous line's text ends, a natural token boundary for this
    byte-level BPE (which merges the newline with the next line's indentation), so the model
    must produce the newline and indentation itself. The prompt keeps the last ``context_tokens``
    tokens of ``[bos] + tokens(preceding text)``.
    """
    candidates: list[tuple[str, int, str, str]] = []
    for path, text in documents:
        lines = text.split("\n")
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line) + 1)
        for lineno in sorted(_function_body_lines(text)):
            line, previous = lines[lineno - 1], lines[lineno - 2]
            if line.strip() and previous.strip():
                candidates.append((path, lineno, text[: offsets[lineno - 1] - 1], line.strip()))
    if not candidates:
        raise ValueError("the documents have no line inside a function body to predict")
    step = len(candidates) / min(num_lines, len(candidates))
    picked = [candidates[int(i * step)] for i in range(min(num_lines, len(candidates)))]
    return [LineCase(path, lineno, [bos, *tokenize(prefix)][-context_tokens:], line)
            for path, lineno, prefix, line in picked]


def predicted_line(completion: str) -> str | None:
    """The stripped line a completion of a prompt ending before a newline predicts; None when it
    continues the previous line instead of starting a new one."""
    if not completion.startswith("\n"):
        return None
    return completion[1:].split("\n", 1)[0].strip()


def score_metrics(scores: Sequence[WindowScore], num_words: int, num_bytes: int) -> dict[str, Any]:
    """Token perplexity, top-1 accuracy, and lm-eval's word/byte perplexity and bits per byte."""
    logprobs = [lp for score in scores for lp in score.logprobs]
    hits = [hit for score in scores for hit in score.top1]
    if not logprobs:
        raise ValueError("no token was scored")
    total = math.fsum(logprobs)
    return {
        "scored_tokens": len(logprobs),
        "sum_logprob": total,
        "perplexity": math.exp(-total / len(logprobs)),
        "top1_accuracy": sum(hits) / len(hits),
        "num_words": num_words,
        "num_bytes": num_bytes,
        "word_perplexity": math.exp(-total / num_words),
        "byte_perplexity": math.exp(-total / num_bytes),
        "bits_per_byte": -total / num_bytes / math.log(2),
    }


def word_count(text: str) -> int:
    """Words as lm-eval's ``loglikelihood_rolling`` tasks count them for word perplexity."""
    return len(re.split(r"\s+", text))


def agreement(result: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """How often ``result`` made the same greedy choices as ``reference`` (both written by bench_accuracy)."""
    mine, theirs = result["next_line"]["cases"], reference["next_line"]["cases"]
    if [(c["path"], c["lineno"]) for c in mine] != [(c["path"], c["lineno"]) for c in theirs]:
        raise ValueError("the reference predicted other lines (different documents or --num-lines)")
    same = sum(a["completion_line"] == b["completion_line"] for a, b in zip(mine, theirs))
    out: dict[str, Any] = {"reference_label": reference.get("label"), "next_line_agreement": same / len(mine),
                           "token_top1_agreement": None}
    ours, ref = result.get("argmax_ids"), reference.get("argmax_ids")
    if ours is not None and ref is not None:
        if len(ours) != len(ref):
            raise ValueError("the reference scored other tokens (different documents, bounds or --window)")
        out["token_top1_agreement"] = sum(a == b for a, b in zip(ours, ref)) / len(ours)
    return out
