"""benchmarks/spec_decode_inprocess.py: its prompts come from the held-out files' middles, and a short interleaved
run reports every method with n-gram drafts verified (acceptance in [0, 1]) and the base's ratios equal to 1."""

from __future__ import annotations

import re

import pytest

from benchmarks.spec_decode_inprocess import code_prompts, main


def test_prompts_are_held_out_windows_with_the_file_header():
    prompts = code_prompts(2, 300)
    assert len(prompts) == 2
    assert all(prompt.startswith("#<|file|> ") and prompt.endswith("\n") for prompt in prompts)
    assert all(len(prompt) > 300 for prompt in prompts)
    with pytest.raises(ValueError, match="held-out files hold"):
        code_prompts(10_000, 300)


def test_short_run_prints_each_method_with_ratios(capsys):
    assert main(["--methods", "off,ngram", "--prompts", "1", "--prompt-chars", "200", "--output-len", "8",
                 "--pairs", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pair 0")]
    assert [line.split()[2] for line in lines] == ["off", "ngram"]
    assert "time/base 1.000" in lines[0] and "cpu/base 1.000" in lines[0]
    acceptance = float(re.search(r"acceptance (\S+)", lines[1]).group(1))
    assert 0.0 <= acceptance <= 1.0
