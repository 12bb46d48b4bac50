"""bench_ops.py runs every op x implementation at tiny shapes, one iteration, and writes a complete JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rapid_llm.ops import REGISTRY
from rapid_llm.ops.op_cases import OP_CASES

REPO = Path(__file__).resolve().parents[2]


def test_bench_ops_times_every_implementation_or_says_why_not(tmp_path: Path) -> None:
    out = tmp_path / "ops.json"
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_ops.py"), "--model-shape", "tiny", "--vocab-size", "300",
         "--num-tokens", "1,5", "--context-len", "20", "--dtype", "fp32,bf16", "--iters", "1", "--warmup", "0",
         "--threads", "1", "--json", str(out)],
        check=True, cwd=REPO, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["shape"]["vocab_size"] == 300 and result["iters"] == 1
    rows, skipped = result["rows"], result["skipped"]
    expected = {(op, backend) for op, backends in REGISTRY.backends().items() for backend in backends}
    assert {(r["op"], r["backend"]) for r in rows} | {(s["op"], s["backend"]) for s in skipped} == expected
    calls = {(r["op"], r["variant"], r["dtype"], r["num_tokens"]) for r in rows}
    assert {(op, variant) for op, variant, _, _ in calls} == {(op, v) for op, case in OP_CASES.items()
                                                               for v in case.variants}
    for call in calls:  # torch_ref always runs; dispatch picks exactly one implementation of each call
        same = [r for r in rows if (r["op"], r["variant"], r["dtype"], r["num_tokens"]) == call]
        assert [r["vs_torch_ref"] for r in same if r["backend"] == "torch_ref"] == [1.0]
        assert sum(r["picked"] for r in same) == 1 and all(r["median_us"] > 0 for r in same)
    assert {r["dtype"] for r in rows if r["op"] == "top_k_top_p_filter"} == {"float32"}
    assert all(s["reason"].startswith("no implementation of op") for s in skipped)
    assert "* = what dispatch picks for that call" in completed.stdout
