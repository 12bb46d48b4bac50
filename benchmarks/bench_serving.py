"""Online serving benchmark for any OpenAI-compatible server, with the flags and metrics of `vllm bench serve`.

    python -m benchmarks.bench_serving --backend openai --port 30000 --dataset-name random \\
        --random-input-len 1024 --random-output-len 128 --num-prompts 200 --request-rate inf

Key design choice: this file only parses flags, schedules requests and prints; the workloads,
request functions, metrics and result files live in `benchmarks.common`, each written to mean what
vLLM's benchmark means, so numbers from here and from vLLM/SGLang runs can be compared directly.
Added to vLLM's result: the server's resources sampled during the run, the failed requests' reasons, and
speculative-decoding acceptance from the server's /metrics counters over the timed run (warm-ups excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import socket
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

if __package__ in (None, ""):
    # Run as a file (python benchmarks/bench_serving.py): make `benchmarks` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from tqdm import tqdm

from benchmarks.common.args import add_dataset_args, add_result_args
from benchmarks.common.backends import (
    DEFAULT_ENDPOINTS,
    REQUEST_FUNCS,
    RequestInput,
    auth_headers,
    open_session,
    status_hint,
)
from benchmarks.common.datasets import load_tokenizer, sample_requests
from benchmarks.common.environment import collect_environment, fetch_server_info
from benchmarks.common.errors import error_summary, format_errors
from benchmarks.common.metrics import (
    RequestOutcome,
    calculate_metrics,
    format_report,
    parse_goodput,
    parse_percentile_metrics,
    parse_percentiles,
    result_dict,
)
from benchmarks.common.resources import ResourceSampler, format_resources, server_pids
from benchmarks.common.results import save_result
from benchmarks.common.spec_decode import fetch_spec_counters, format_spec_decode, spec_decode_summary
from benchmarks.common.traffic import arrival_offsets
from rapid_llm.server_args import DEFAULT_PORT  # stdlib-only module: the client still imports no engine code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=list(REQUEST_FUNCS), default="openai",
                        help="openai: /v1/completions; openai-chat: /v1/chat/completions.")
    parser.add_argument("--base-url", default=None, help="Server URL; overrides --host/--port.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="Server port (default: rapid_llm's, %(default)s; vLLM's bench defaults to 8000).")
    parser.add_argument("--endpoint", default=None, help="API path (default: the backend's).")
    parser.add_argument("--model", default=None, help="Model to request (default: first of /v1/models).")
    parser.add_argument("--served-model-name", default=None, help="Name sent in requests when it differs from --model.")
    parser.add_argument("--label", default=None, help="Result label and file name prefix (default: --backend).")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="Requests per second; inf sends all at once.")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="Gamma shape of arrival gaps: 1 is Poisson, <1 burstier, >1 more even.")
    parser.add_argument("--max-concurrency", type=int, default=None, help="Most requests in flight at once.")
    parser.add_argument("--ignore-eos", action="store_true", help="Send ignore_eos (always on for random).")
    parser.add_argument("--temperature", type=float, default=None, help="Default: the server's.")
    parser.add_argument("--extra-body", type=json.loads, default=None, help="JSON merged into every request.")
    parser.add_argument("--json-schema-path", type=Path, default=None,
                        help="Structured-output workload: send this JSON schema as response_format json_schema "
                             "(e.g. benchmarks/schemas/records.json).")
    parser.add_argument("--structured-output-ratio", type=float, default=1.0,
                        help="Share of requests that carry --json-schema-path (spread evenly), as vLLM's "
                             "structured-output benchmark.")
    parser.add_argument("--lora-names", nargs="+", default=None, metavar="NAME",
                        help="LoRA adapters the requests name as their model, request i the (i mod N)-th (vLLM's "
                             "--lora-modules spreads them at random); the warm-ups use the first.")
    parser.add_argument("--num-warmups", type=int, default=0, help="Requests sent (with the first prompt) first.")
    parser.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                        help="Of ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue.")
    parser.add_argument("--metric-percentiles", default="99", help='Comma-separated, e.g. "50,90,99".')
    parser.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                        help="SLOs (ttft, tpot, e2el in ms) a request must all meet to count as good.")
    parser.add_argument("--server-pid", type=int, default=None,
                        help="Server process whose tree is sampled for resources (default: the process "
                             "listening on the server's port, when the server is on this machine).")
    parser.add_argument("--resource-interval", type=float, default=0.5,
                        help="Seconds between resource samples.")
    add_dataset_args(parser)
    add_result_args(parser)
    args = parser.parse_args(argv)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    if args.num_warmups < 0:
        parser.error("--num-warmups must be non-negative")
    if not 0.0 <= args.structured_output_ratio <= 1.0:
        parser.error("--structured-output-ratio must be in [0, 1]")
    if args.resource_interval <= 0:
        parser.error("--resource-interval must be positive")
    return args


def structured_bodies(args: argparse.Namespace, num_requests: int, extra_body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each request's extra body: `extra_body`, plus the schema for the --structured-output-ratio share of them
    (request i is constrained when floor((i + 1) * ratio) passes an integer, so the share is exact and even)."""
    if args.json_schema_path is None:
        return [extra_body] * num_requests
    schema = json.loads(args.json_schema_path.read_text())
    constrained = {**extra_body, "response_format": {
        "type": "json_schema", "json_schema": {"name": args.json_schema_path.stem, "schema": schema}}}
    ratio = args.structured_output_ratio
    return [constrained if math.floor((i + 1) * ratio) > math.floor(i * ratio) else extra_body
            for i in range(num_requests)]


def request_models(model_name: str, lora_names: list[str] | None, num_requests: int) -> list[str]:
    """The model each request names: the served model, or the LoRA adapters in turn (an even spread)."""
    names = lora_names or [model_name]
    return [names[i % len(names)] for i in range(num_requests)]


def first_model(base_url: str) -> tuple[str, str]:
    """(served name, model path) of the first entry of /v1/models, as vLLM takes its id and root."""
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=auth_headers(), timeout=30.0)
        response.raise_for_status()
        models = response.json().get("data") or []
    except httpx.HTTPStatusError as exc:
        raise RuntimeError(f"cannot list models at {base_url}/v1/models: "
                           f"HTTP {exc.response.status_code}{status_hint(exc.response.status_code)}") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise RuntimeError(f"cannot list models at {base_url}/v1/models: {exc}") from None
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no models")
    return models[0]["id"], models[0].get("root") or models[0]["id"]


LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", socket.gethostname()}


class RunSampler(ResourceSampler):
    """The resource sampler, which every runner enters around exactly the timed run, plus the server's
    spec-decode counters read as it starts and ends (so warm-ups are not counted)."""

    def __init__(self, base_url: str, roots: list[int], interval_s: float, unavailable: str | None = None) -> None:
        super().__init__(roots, interval_s, unavailable)
        self.base_url = base_url
        self.spec_before: dict[str, Any] | None = None
        self.spec_after: dict[str, Any] | None = None

    def __enter__(self) -> "RunSampler":
        self.spec_before = fetch_spec_counters(self.base_url, auth_headers())
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.spec_after = fetch_spec_counters(self.base_url, auth_headers())

    def spec_decode(self) -> dict[str, Any] | None:
        return spec_decode_summary(self.spec_before, self.spec_after)


def resource_sampler(args: argparse.Namespace, base_url: str) -> RunSampler:
    """A sampler of --server-pid's tree, else of the tree listening on the server's port if it is local."""
    url = urlsplit(base_url)
    if args.server_pid is None and url.hostname not in LOCAL_HOSTS:
        return RunSampler(base_url, [], args.resource_interval, unavailable=f"the server ({url.hostname}) may not "
                          "be on this machine; pass --server-pid to sample a local one")
    port = url.port or (443 if url.scheme == "https" else 80)
    roots, why_not = server_pids(port=port, pid=args.server_pid)
    return RunSampler(base_url, roots, args.resource_interval, unavailable=why_not)


async def run_requests(
    args: argparse.Namespace, inputs: list[RequestInput], offsets: list[float], sampler: ResourceSampler
) -> tuple[list[RequestOutcome], float]:
    """Send the warm-ups, then every request at its arrival offset, sampling the server's resources
    meanwhile; (outcomes, duration in s)."""
    request_func = REQUEST_FUNCS[args.backend]

    def limiter() -> contextlib.AbstractAsyncContextManager[Any]:
        return asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()

    async with open_session(args.max_concurrency) as session:

        async def send(request: RequestInput, slots: contextlib.AbstractAsyncContextManager[Any],
                       pbar: tqdm | None) -> RequestOutcome:
            arrival = time.perf_counter()
            async with slots:
                outcome = await request_func(session, request)
            outcome.queue_time = outcome.start_time - arrival
            if pbar is not None:
                pbar.update(1)
            return outcome

        if args.num_warmups:
            print(f"Warming up with {args.num_warmups} requests...")
            pbar = None if args.disable_tqdm else tqdm(total=args.num_warmups)
            slots = limiter()
            await asyncio.gather(*(send(inputs[0], slots, pbar) for _ in range(args.num_warmups)))
            if pbar is not None:
                pbar.close()

        print("Starting main benchmark run...")
        pbar = None if args.disable_tqdm else tqdm(total=len(inputs))
        slots = limiter()
        tasks = []
        with sampler:
            start = time.perf_counter()
            for request, offset in zip(inputs, offsets):
                delay = start + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(request, slots, pbar)))
            outcomes = await asyncio.gather(*tasks)
            duration = time.perf_counter() - start
        if pbar is not None:
            pbar.close()
        return list(outcomes), duration


Runner = Callable[[argparse.Namespace, list[RequestInput], list[float], ResourceSampler],
                  Awaitable[tuple[list[RequestOutcome], float]]]


def main(argv: list[str] | None = None, runner: Runner | None = None) -> dict[str, Any]:
    """Run the benchmark; `runner` replaces `run_requests` (how requests are sent), e.g. static batching."""
    args = parse_args(argv)
    print(args)
    if args.base_url:
        base_url = args.base_url.rstrip("/")
    else:
        host = f"[{args.host}]" if ":" in args.host else args.host
        base_url = f"http://{host}:{args.port}"
    api_url = base_url + (args.endpoint or DEFAULT_ENDPOINTS[args.backend])

    if args.model is None:
        model_name, model_id = first_model(base_url)
        print(f"First model name: {model_name}, first model id: {model_id}")
    else:
        model_name, model_id = args.served_model_name or args.model, args.model
    tokenizer_id = args.tokenizer or model_id
    tokenizer = load_tokenizer(tokenizer_id)

    if args.dataset_name == "random" and not args.ignore_eos:
        # As vLLM does: random prompts must produce exactly the sampled output lengths.
        print("The random dataset always sets ignore_eos.")
        args.ignore_eos = True
    samples = sample_requests(args, tokenizer)
    goodput = parse_goodput(args.goodput)
    percentile_metrics = parse_percentile_metrics(args.percentile_metrics)
    percentiles = parse_percentiles(args.metric_percentiles)
    # As vLLM: client queueing exists only under a concurrency cap, and "including queue" only with a finite rate.
    if args.max_concurrency is None or math.isinf(args.request_rate):
        percentile_metrics = [m for m in percentile_metrics if m != "e2el_including_client_queue"]
    if args.max_concurrency is None:
        percentile_metrics = [m for m in percentile_metrics if m != "client_queue_time"]

    if args.temperature is None:
        print("WARNING: no --temperature given; the server's default sampling applies.")
    sampling = {"temperature": args.temperature} if args.temperature is not None else {}
    extra_body = {**sampling, **(args.extra_body or {})}
    inputs = [
        RequestInput(api_url, model, s.prompt, s.prompt_len, s.expected_output_len, args.ignore_eos, body)
        for s, body, model in zip(samples, structured_bodies(args, len(samples), extra_body),
                                  request_models(model_name, args.lora_names, len(samples)))
    ]
    offsets = arrival_offsets(len(inputs), args.request_rate, args.burstiness, args.seed)
    distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    print(f"Traffic request rate: {args.request_rate}")
    print(f"Burstiness factor: {args.burstiness} ({distribution})")
    print(f"Maximum request concurrency: {args.max_concurrency}")

    # Everything allocated so far lives to the end; keep the collector from rescanning it mid-run.
    sampler = resource_sampler(args, base_url)
    gc.collect()
    gc.freeze()
    outcomes, duration = asyncio.run((runner or run_requests)(args, inputs, offsets, sampler))

    failures = [o for o in outcomes if not o.success]
    if failures:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, failure in enumerate(failures[:10]):
            print(f"Error {i}: {failure.error}")
    metrics = calculate_metrics(outcomes, duration, tokenizer, percentile_metrics, percentiles, goodput)
    print(format_report(metrics, duration, args.max_concurrency, args.request_rate))
    resources, errors, spec_decode = sampler.summary(), error_summary(outcomes), sampler.spec_decode()
    print(format_resources(resources))
    print(format_spec_decode(spec_decode))
    print(format_errors(errors))
    print("=" * 50)

    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result: dict[str, Any] = {
        "date": date,
        "endpoint_type": args.backend,
        "backend": args.backend,
        "label": args.label,
        "model_id": model_id,
        "tokenizer_id": tokenizer_id,
        "num_prompts": len(samples),
        "request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "json_schema_path": str(args.json_schema_path) if args.json_schema_path else None,
        "structured_output_ratio": args.structured_output_ratio if args.json_schema_path else None,
        "lora_names": args.lora_names,
        **result_dict(metrics, outcomes, duration),
        "resources": resources,
        "spec_decode": spec_decode,
        "error_summary": errors,
        "environment": collect_environment(fetch_server_info(base_url, auth_headers())),
    }
    concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
    stem = f"{args.label or args.backend}-{args.request_rate}qps{concurrency}-{model_id.split('/')[-1]}-{date}"
    save_result(result, args, stem)
    return result


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError) as exc:
        sys.exit(f"error: {exc}")
