"""The GPU's own ceilings, measured where the numbers are taken: copy bandwidth and dense bf16 matmul rate.

    python benchmarks/gpu/ceilings.py --json ceilings.json

Key design choice: ratios in docs/benchmarks.md are against what this machine does with plain torch ops
(a device-to-device copy of 4 GiB; an 8192^3 bf16 matmul), not against datasheet numbers. Each figure is the
median of CUDA-event-timed repetitions after warm-ups; bytes count both the read and the write.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

COPY_BYTES = 4 << 30
MATMUL_SIZE = 8192
REPEATS = 10


def _median_seconds(fn, repeats: int = REPEATS, warmups: int = 3) -> float:
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure() -> dict[str, float | str]:
    if not torch.cuda.is_available():
        raise RuntimeError("ceilings.py measures a CUDA device; none is visible")
    source = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    target = torch.empty_like(source)
    copy_s = _median_seconds(lambda: target.copy_(source))
    del source, target
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device="cuda")
    matmul_s = _median_seconds(lambda: a @ b)
    return {"device": torch.cuda.get_device_name(), "copy_bandwidth_gb_s": 2 * COPY_BYTES / copy_s / 1e9,
            "bf16_matmul_tflops": 2 * MATMUL_SIZE**3 / matmul_s / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", help="Write the figures here.")
    args = parser.parse_args()
    result = measure()
    print(f"{result['device']}: copy {result['copy_bandwidth_gb_s']:.0f} GB/s, "
          f"bf16 matmul {result['bf16_matmul_tflops']:.0f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
