"""Result files and the environment block."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common.args import add_result_args
from benchmarks.common.environment import CPU_FLAGS, collect_environment, fetch_server_info
from benchmarks.common.results import save_result

RESULT = {"completed": 2, "latencies": [0.1, 0.2], "ttfts": [0.01, 0.02], "errors": ["", ""], "itls": [[], []]}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_result_args(parser)
    return parser.parse_args(list(argv))


def test_nothing_saved_without_save_result(tmp_path: Path) -> None:
    assert save_result(RESULT, parse("--result-dir", str(tmp_path)), "stem") is None
    assert list(tmp_path.iterdir()) == []


def test_default_name_drops_per_request_arrays_like_vllm(tmp_path: Path) -> None:
    path = save_result(RESULT, parse("--save-result", "--result-dir", str(tmp_path / "new")), "openai-run")
    assert path == tmp_path / "new" / "openai-run.json"
    assert json.loads(path.read_text()) == {"completed": 2, "latencies": [0.1, 0.2]}


def test_named_and_detailed(tmp_path: Path) -> None:
    args = parse("--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "r.json")
    path = save_result(RESULT, args, "ignored")
    assert path == tmp_path / "r.json"
    assert json.loads(path.read_text()) == RESULT


def test_environment_block() -> None:
    env = collect_environment({"max_num_seqs": 8})
    assert env["server_info"] == {"max_num_seqs": 8}
    assert env["versions"]["python"].count(".") == 2
    assert env["versions"]["transformers"]
    assert env["versions"]["rapid_llm"]
    assert env["cpu"]["count"] >= 1
    if Path("/proc/cpuinfo").exists():  # Linux: the flags the CPU kernels choose by, those present
        assert set(env["cpu"]["flags"]) <= set(CPU_FLAGS)
        assert ("avx2" in env["cpu"]["flags"]) == (" avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " "))
    assert isinstance(env["gpus"], list)
    assert json.loads(json.dumps(env)) == env


def test_server_info_is_none_when_unreachable() -> None:
    assert fetch_server_info("http://127.0.0.1:9") is None
