"""Accuracy on held-out text: perplexity, top-1, next-line exact match and greedy agreement with a reference.

    python benchmarks/bench_accuracy.py --backend transformers --model DIR --dtype float32 --output ref.json
    python benchmarks/bench_accuracy.py --backend server --base-url http://127.0.0.1:30000 --reference ref.json
    python benchmarks/bench_accuracy.py --export-jsonl docs.jsonl   # the same documents, as lm-eval's task has them

Key design choice: both backends get token ids built here (benchmarks/common/accuracy.py: BOS + text,
windows of --window scored tokens as lm-eval's rolling loglikelihood makes them), so a server and
transformers score identical sequences. The server is asked for vLLM's ``prompt_logprobs`` (rank 1 =
argmax) and, failing that, for the legacy ``echo`` + ``logprobs`` layout; next-line completions are
greedy and cut client-side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.bench_serving import first_model
from benchmarks.common.accuracy import (
    LineCase,
    WindowScore,
    agreement,
    line_cases,
    load_documents,
    predicted_line,
    score_metrics,
    select_documents,
    windows,
    word_count,
)
from benchmarks.common.backends import auth_headers
from benchmarks.common.datasets import load_tokenizer
from benchmarks.common.environment import collect_environment, fetch_server_info

T = TypeVar("T")
R = TypeVar("R")
HELD_OUT = Path(__file__).resolve().parents[1] / "tools" / "demo_model" / "data" / "held_out.txt"


class Backend(Protocol):
    def score(self, window: list[int]) -> WindowScore: ...

    def complete(self, prompt: list[int], max_tokens: int) -> str: ...


class TransformersBackend:
    """The reference: a Hugging Face model in this process, greedy and unbatched."""

    def __init__(self, model_dir: str, dtype: str, threads: int, tokenizer: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch, self.tokenizer = torch, tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()

    def score(self, window: list[int]) -> WindowScore:
        with self.torch.inference_mode():
            logits = self.model(self.torch.tensor([window])).logits[0, :-1].float()
        logprobs = logits.log_softmax(-1)
        targets = self.torch.tensor(window[1:])
        argmax = logprobs.argmax(-1)
        return WindowScore(logprobs.gather(1, targets[:, None])[:, 0].tolist(), (argmax == targets).tolist(),
                           argmax.tolist())

    def complete(self, prompt: list[int], max_tokens: int) -> str:
        """Greedy decoding with the KV cache, stopped once the predicted line is complete (the text after
        the cut in ``predicted_line`` cannot change it), or at EOS, as a server stops."""
        generated: list[int] = []
        text, inputs, cache = "", self.torch.tensor([prompt]), None
        with self.torch.inference_mode():
            while len(generated) < max_tokens:
                output = self.model(inputs, cache=cache, use_cache=True)
                token = int(output.logits[0, -1].argmax())
                if token == self.tokenizer.eos_token_id:
                    break
                generated.append(token)
                text = self.tokenizer.decode(generated, skip_special_tokens=True)
                if not text.startswith("\n") or "\n" in text[1:]:
                    break
                inputs, cache = self.torch.tensor([[token]]), output.cache
        return text


class ServerBackend:
    """An OpenAI-compatible /v1/completions server (rapid_llm, vLLM, SGLang) given token-id prompts."""

    def __init__(self, base_url: str, model: str) -> None:
        self.url, self.model = f"{base_url}/v1/completions", model
        self.client = httpx.Client(headers=auth_headers(), timeout=600.0)
        self.prompt_logprobs = True

    def _send(self, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(self.url, json={"model": self.model, "temperature": 0, **body})

    def _choice(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            raise RuntimeError(f"{self.url}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json()["choices"][0]

    def score(self, window: list[int]) -> WindowScore:
        # max_tokens 1, as lm-eval sends: vLLM refuses 0; the generated token is ignored.
        body: dict[str, Any] = {"prompt": window, "max_tokens": 1, "echo": True, "logprobs": 1}
        if self.prompt_logprobs:
            response = self._send({**body, "prompt_logprobs": 1})
            # A server without vLLM's extension refuses the field or ignores it: use the echo layout.
            if response.status_code not in (400, 422):
                choice = self._choice(response)
                if choice.get("prompt_logprobs") is not None:
                    return _from_prompt_logprobs(choice["prompt_logprobs"], window)
            self.prompt_logprobs = False
        return _from_echo(self._choice(self._send(body))["logprobs"], len(window))

    def complete(self, prompt: list[int], max_tokens: int) -> str:
        return self._choice(self._send({"prompt": prompt, "max_tokens": max_tokens}))["text"]


def _from_prompt_logprobs(entries: list[dict[str, dict[str, Any]] | None], window: list[int]) -> WindowScore:
    logprobs, top1, argmax = [], [], []
    for token, entry in zip(window[1:], entries[1:len(window)]):
        if entry is None or str(token) not in entry:
            raise RuntimeError(f"prompt_logprobs lacks the prompt token {token}: {entry}")
        logprobs.append(float(entry[str(token)]["logprob"]))
        top1.append(entry[str(token)]["rank"] == 1)
        argmax.append(next(int(t) for t, e in entry.items() if e["rank"] == 1))
    return WindowScore(logprobs, top1, argmax)


def _from_echo(logprobs: dict[str, Any], length: int) -> WindowScore:
    """Legacy layout: no ids, so top-1 compares the top token's string with the prompt token's."""
    tokens, values, tops = (logprobs[k][1:length] for k in ("tokens", "token_logprobs", "top_logprobs"))
    return WindowScore([float(v) for v in values], [max(top, key=top.get) == t for t, top in zip(tokens, tops)],
                       None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=("server", "transformers"), default="transformers")
    parser.add_argument("--base-url", default="http://127.0.0.1:30000", help="Server (--backend server).")
    parser.add_argument("--model", default=None,
                        help="Checkpoint directory (transformers) or model to request (server; default: first of /v1/models).")
    parser.add_argument("--concurrency", type=int, default=1, help="Requests in flight (--backend server).")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="torch dtype for --backend transformers.")
    # One thread by default: on a few shared cores OpenMP's spin-waiting made two threads 7x slower
    # than one for these small models; more only help on an idle machine.
    parser.add_argument("--threads", type=int, default=1, help="torch threads for --backend transformers.")
    parser.add_argument("--tokenizer", default=None, help="Local tokenizer directory (default: the model's).")
    parser.add_argument("--data", type=Path, default=HELD_OUT, help="Held-out text (files joined by separators).")
    parser.add_argument("--limit", type=int, default=None, help="Score only the first N documents.")
    parser.add_argument("--max-tokens-total", type=int, default=None,
                        help="Score whole documents, in file order, up to this many tokens (at least one document).")
    parser.add_argument("--window", type=int, default=256, help="Scored tokens per window (each has one more of context).")
    parser.add_argument("--num-lines", type=int, default=200, help="Next-line cases (0: none).")
    parser.add_argument("--line-context", type=int, default=192, help="Most prompt tokens of a next-line case.")
    parser.add_argument("--line-max-tokens", type=int, default=32, help="Tokens generated per next-line case.")
    parser.add_argument("--reference", type=Path, nargs="+", default=[],
                        help="Results of this script to measure greedy agreement with.")
    parser.add_argument("--label", default=None, help="Name stored in the result (default: backend and model).")
    parser.add_argument("--output", type=Path, default=None, help="Write the result as JSON here.")
    parser.add_argument("--export-jsonl", type=Path, default=None,
                        help="Write the selected documents as JSONL ({\"path\", \"text\"}) and stop.")
    args = parser.parse_args(argv)
    for name in ("limit", "max_tokens_total", "window", "threads", "concurrency", "line_context", "line_max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.num_lines < 0:
        parser.error("--num-lines must be non-negative")
    if args.backend == "transformers" and args.concurrency != 1:
        parser.error("--concurrency applies to --backend server only")
    if args.backend == "transformers" and args.model is None and args.export_jsonl is None:
        parser.error("--backend transformers needs --model")
    return args


def _map(function: Callable[[T], R], items: Iterable[T], concurrency: int) -> list[R]:
    """``function`` over ``items`` in order, ``concurrency`` calls in flight (a server batches them)."""
    if concurrency == 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(function, items))


def _score_documents(backend: Backend, tokens: list[list[int]], bos: int, window: int,
                     concurrency: int) -> tuple[list[WindowScore], float]:
    start = time.perf_counter()
    pairs = [pair for doc in tokens for pair in windows(doc, bos, window)]
    scores = _map(lambda pair: backend.score(pair[0]).last(pair[1]), pairs, concurrency)
    return scores, time.perf_counter() - start


def _next_lines(backend: Backend, cases: list[LineCase], max_tokens: int, concurrency: int) -> dict[str, Any]:
    completions = _map(lambda case: backend.complete(case.prompt, max_tokens), cases, concurrency)
    results = [{"path": case.path, "lineno": case.lineno, "line": case.line, "completion": completion,
                "completion_line": predicted_line(completion)} for case, completion in zip(cases, completions)]
    exact = sum(r["completion_line"] == r["line"] for r in results)
    return {"num_cases": len(results), "exact_match": exact / len(results) if results else None, "cases": results}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    documents = load_documents(args.data)
    server_info = None
    if args.backend == "server" and args.export_jsonl is None:
        served, root = first_model(args.base_url)
        args.model, args.tokenizer = args.model or served, args.tokenizer or root
        server_info = fetch_server_info(args.base_url, auth_headers())
    tokenizer = load_tokenizer(args.tokenizer or args.model or str(HELD_OUT.parent.parent / "artifacts" / "tokenizer"))
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if bos is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token to start documents with")

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    all_tokens = [tokenize(text) for _, text in documents]
    chosen = select_documents([len(t) for t in all_tokens], args.limit, args.max_tokens_total)
    if args.export_jsonl is not None:
        args.export_jsonl.parent.mkdir(parents=True, exist_ok=True)
        args.export_jsonl.write_text("".join(json.dumps({"path": documents[i][0], "text": documents[i][1]}) + "\n"
                                             for i in chosen), encoding="utf-8")
        print(f"Wrote {len(chosen)} documents ({sum(len(all_tokens[i]) for i in chosen)} tokens) to {args.export_jsonl}")
        return {}

    backend: Backend = (ServerBackend(args.base_url, args.model) if args.backend == "server"
                        else TransformersBackend(args.model, args.dtype, args.threads, tokenizer))
    scores, score_s = _score_documents(backend, [all_tokens[i] for i in chosen], bos, args.window, args.concurrency)
    texts = [documents[i][1] for i in chosen]
    metrics = score_metrics(scores, sum(map(word_count, texts)), sum(len(t.encode("utf-8")) for t in texts))
    start = time.perf_counter()
    next_line = _next_lines(backend, line_cases(documents, tokenize, bos, args.num_lines, args.line_context)
                            if args.num_lines else [], args.line_max_tokens, args.concurrency)
    argmax = [i for s in scores for i in s.argmax] if all(s.argmax is not None for s in scores) else None
    result: dict[str, Any] = {
        "label": args.label or f"{args.backend}:{args.model}",
        "backend": args.backend,
        "model": args.model,
        "dtype": args.dtype if args.backend == "transformers" else None,
        "settings": {k: getattr(args, k) for k in ("limit", "max_tokens_total", "window", "num_lines",
                                                   "line_context", "line_max_tokens", "concurrency")},
        "documents": [documents[i][0] for i in chosen],
        **metrics,
        "next_line": next_line,
        "score_seconds": score_s,
        "next_line_seconds": time.perf_counter() - start,
        "argmax_ids": argmax,
        "agreement": [],
        "environment": collect_environment(server_info),
    }
    result["agreement"] = [agreement(result, json.loads(path.read_text())) for path in args.reference]
    print(format_summary(result))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"Result saved to {args.output}")
    return result


def format_summary(result: dict[str, Any]) -> str:
    lines = [
        f"{'=' * 16} Accuracy: {result['label']} {'=' * 16}",
        f"Documents / scored tokens: {len(result['documents'])} / {result['scored_tokens']} ({result['score_seconds']:.1f} s)",
        f"Token perplexity:          {result['perplexity']:.4f}",
        f"Next-token top-1 accuracy: {result['top1_accuracy']:.4f}",
        f"Word / byte perplexity:    {result['word_perplexity']:.4f} / {result['byte_perplexity']:.4f}",
    ]
    if result["next_line"]["num_cases"]:
        lines.append(f"Next-line exact match:     {result['next_line']['exact_match']:.4f} "
                     f"({result['next_line']['num_cases']} lines, {result['next_line_seconds']:.1f} s)")
    for agree in result["agreement"]:
        top1 = agree["token_top1_agreement"]
        lines.append(f"Agreement with {agree['reference_label']}: next-line {agree['next_line_agreement']:.4f}, "
                     f"token top-1 {'n/a' if top1 is None else f'{top1:.4f}'}")
    lines.append("Environment: " + json.dumps(result["environment"]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
