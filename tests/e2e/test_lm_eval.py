"""lm-eval's `local-completions` model against a real server: README's "Evaluate with lm-eval" command as written.

The command is read from README.md (marker `lm-eval`), pointed at this test's demo-target server, limited to
the first documents and run from an empty folder; the word and byte perplexity it writes must be finite and
equal bench_accuracy's over the same documents through the same server (both score BOS + text in rolling
256-token windows), so a wrong window, tokenizer or logprob layout fails here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from benchmarks import bench_accuracy
from tests.e2e.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = 2  # 31 and 1367 tokens: 7 windows
README_BASE_URL = "http://127.0.0.1:30000"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                reason="lm-eval is not installed: pip install -e '.[eval]'")


@pytest.fixture(scope="module")
def demo_server() -> Iterator[ServerProcess]:
    server = ServerProcess("--dtype", "float32")
    yield server
    server.stop()


def readme_command() -> str:
    return subprocess.run([sys.executable, str(REPO / ".ci" / "readme_command.py"), "lm-eval"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_readme_command_prints_the_perplexity_bench_accuracy_computes(demo_server: ServerProcess,
                                                                      tmp_path: Path) -> None:
    command = readme_command()
    assert README_BASE_URL in command
    command = (command.replace(README_BASE_URL, demo_server.base_url)
               + f" --limit {DOCUMENTS} --output_path {tmp_path / 'results'}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "word_perplexity" in run.stdout, run.stdout
    [results_file] = (tmp_path / "results").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]["demo_held_out"]

    expected = bench_accuracy.main(["--backend", "server", "--base-url", demo_server.base_url,
                                    "--limit", str(DOCUMENTS), "--num-lines", "0"])
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert math.isfinite(results[f"{metric},none"])
        assert results[f"{metric},none"] == pytest.approx(expected[metric], rel=1e-6), metric
    assert results["word_perplexity,none"] > 1
