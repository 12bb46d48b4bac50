"""benchmarks/bench_state_decode.py runs end to end on a tiny model and times both kinds of layer."""

from __future__ import annotations

from benchmarks import bench_state_decode


def test_the_state_decode_benchmark_times_state_layers_and_attention_per_context() -> None:
    report = bench_state_decode.main(["--architecture", "Lfm2ForCausalLM", "--contexts", "16", "40", "--steps", "2",
                                      "--threads", "1"])
    assert [row["context"] for row in report["rows"]] == [16, 40]
    assert all(row["state_layers_ms"] > 0 and row["attention_ops_ms"] > 0 for row in report["rows"])
