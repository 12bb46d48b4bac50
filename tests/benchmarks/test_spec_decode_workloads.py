"""benchmarks/spec_decode_workloads.py: the fixed workloads come from the shipped held-out files only, in the
training format, and are the same on every call."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import spec_decode_workloads as workloads
from tools.demo_model.data import load_held_out


def test_code_windows_end_at_line_breaks_inside_held_out_files() -> None:
    files = load_held_out()
    prompts = workloads.code_prompts(files, prompt_chars=1200, per_file=4)
    assert prompts == workloads.code_prompts(files, prompt_chars=1200, per_file=4)
    assert len(prompts) == 80  # 20 held-out files of at least 2,400 characters
    for prompt in prompts:
        header, _, body = prompt.partition("\n")
        path = header.removeprefix("#<|file|> ")
        assert header.startswith("#<|file|> ") and body in files[path] and body.endswith("\n")
        assert 600 <= len(body) <= 1200


def test_open_prompts_are_each_files_first_line(tmp_path: Path) -> None:
    out = tmp_path / "open.jsonl"
    assert workloads.main(["open", str(out)]) == 0
    rows = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    files = load_held_out()
    assert len(rows) == sum(1 for text in files.values() if text.strip())
    assert rows[1] == '#<|file|> chunk.py\n"""Simple class to read IFF chunks.\n'
