"""Start-up errors as a user meets them: the launcher exits non-zero at once with one line on stderr."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.e2e.server import free_port

LAUNCHER = [sys.executable, "-m", "rapid_llm.launch_server"]


def launch(*args: str) -> tuple[int, list[str], float]:
    """(exit code, stderr lines, seconds) of a launcher expected to fail before starting any child."""
    started = time.monotonic()
    result = subprocess.run([*LAUNCHER, *args], capture_output=True, text=True, timeout=120)
    return result.returncode, result.stderr.splitlines(), time.monotonic() - started


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "99999"], "--port 99999 is out of range; pass a port in 1-65535"),
    (["--model", "meta-llama/Llama-3-8B"], "hub ids are not downloaded; pass a local directory"),
    (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'"),
])
def test_bad_flag_is_one_line_before_any_import_of_the_engine(args: list[str], message: str) -> None:
    code, lines, seconds = launch(*args)
    assert code == 2
    assert len(lines) == 1 and message in lines[0]
    assert seconds < 10


def test_model_without_tokenizer_is_refused_with_the_tokenizer_flag(checkpoint, tmp_path) -> None:
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(checkpoint, broken)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (broken / name).unlink(missing_ok=True)
    code, lines, _ = launch("--model", str(broken))
    assert code == 2 and len(lines) == 1
    assert "has no tokenizer files" in lines[0] and "pass --tokenizer DIR" in lines[0]


def test_port_in_use_is_found_before_the_engine_starts(checkpoint) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, lines, seconds = launch("--model", str(checkpoint), "--port", str(port))
    assert code == 2 and len(lines) == 1
    assert f"--port {port} is already in use on 127.0.0.1" in lines[0]
    assert seconds < 10


def test_rapid_llm_serve_runs_the_same_checks() -> None:
    result = subprocess.run([sys.executable, "-m", "rapid_llm.cli", "serve", "org/model", "--port", "8000"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "--model 'org/model' is not a local directory" in result.stderr
