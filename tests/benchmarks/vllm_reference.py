"""Run by vLLM 0.32's own interpreter (not collected by pytest): vLLM's benchmark code on the parity fixtures.

    <vllm venv>/bin/python vllm_reference.py CASES_JSON OUT_JSON

CASES_JSON holds the tokenizer directory, the random-dataset cases, the ShareGPT file, the request
outcomes for the metrics and the arrival-schedule settings; OUT_JSON receives what vLLM makes of them.
"""

from __future__ import annotations

import asyncio
import json
import sys

from transformers import AutoTokenizer

import vllm.benchmarks.serve as serve
from vllm.benchmarks.datasets import RandomDataset, ShareGPTDataset
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput


def requests_as_lists(requests) -> list[list]:
    return [[r.prompt, r.prompt_len, r.expected_output_len] for r in requests]


def arrival_times(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """vLLM's get_request on a fake clock that only its sleeps advance, so the schedule comes out exact."""
    clock = [0.0]

    class FakeTime:
        @staticmethod
        def time() -> float:
            return clock[0]

    async def fake_sleep(seconds: float) -> None:
        clock[0] += seconds

    serve.time = FakeTime
    serve.asyncio.sleep = fake_sleep
    serve.np.random.seed(seed)

    async def collect() -> list[float]:
        return [clock[0] async for _ in serve.get_request(list(range(num_requests)), request_rate, burstiness)]

    return asyncio.run(collect())


def main(cases_path: str, out_path: str) -> None:
    cases = json.load(open(cases_path))
    tokenizer = AutoTokenizer.from_pretrained(cases["tokenizer"])
    out = {
        "random": [
            requests_as_lists(RandomDataset(random_seed=case["seed"]).sample(
                tokenizer=tokenizer, num_requests=case["num_requests"], input_len=case["input_len"],
                output_len=case["output_len"], range_ratio=case["range_ratio"], prefix_len=case["prefix_len"],
            ))
            for case in cases["random"]
        ],
        "sharegpt": requests_as_lists(ShareGPTDataset(random_seed=cases["seed"], dataset_path=cases["sharegpt"]).sample(
            tokenizer=tokenizer, num_requests=cases["sharegpt_num_requests"], output_len=None,
        )),
    }
    outputs = [RequestFuncOutput(**outcome) for outcome in cases["outcomes"]]
    metrics, _ = serve.calculate_metrics(
        None, outputs, cases["duration"], tokenizer, cases["percentiles"], cases["goodput"]
    )
    out["metrics"] = {k: v for k, v in vars(metrics).items()}
    out["arrivals"] = arrival_times(**cases["arrivals"])
    json.dump(out, open(out_path, "w"), default=float)


if __name__ == "__main__":
    main(*sys.argv[1:])
