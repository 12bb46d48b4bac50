"""bench_accuracy.py: windows, next-line cases, server response parsing, and the transformers backend
checked against a perplexity computed with the model's own loss on a tiny random checkpoint."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from benchmarks import bench_accuracy
from benchmarks.common.accuracy import (
    agreement,
    line_cases,
    predicted_line,
    select_documents,
    windows,
)
from rapid_llm.lm_eval_tasks import TASKS_DIR
from tools.demo_model.data import join_files

CODE = "import os\n\n\ndef area(width, height):\n    result = width * height\n    return result\n"
DOCS = {"a.py": CODE, "b.py": "x = 1\n\n\ndef double(value):\n    doubled = value * 2\n    return doubled\n"}


def test_windows_score_every_token_once_after_bos() -> None:
    assert windows([5, 6, 7, 8, 9], bos=0, window=2) == [([0, 5, 6], 2), ([6, 7, 8], 2), ([7, 8, 9], 1)]
    assert windows([5, 6], bos=0, window=4) == [([0, 5, 6], 2)]
    assert windows([5, 6, 7], bos=0, window=2) == [([0, 5, 6], 2), ([5, 6, 7], 1)]
    with pytest.raises(ValueError):
        windows([5], bos=0, window=0)


def test_select_documents_keeps_whole_documents_in_order() -> None:
    assert select_documents([10, 10, 10], None, 25) == [0, 1]
    assert select_documents([30, 10, 10], None, 25) == [0]
    assert select_documents([10, 10, 10], 2, None) == [0, 1]
    assert select_documents([10, 10, 10], None, None) == [0, 1, 2]


def test_line_cases_predict_function_body_lines_after_a_non_blank_line() -> None:
    cases = line_cases(list(DOCS.items()), lambda text: list(text.encode()), bos=0, num_lines=10, context_tokens=8)
    assert [(c.path, c.lineno, c.line) for c in cases] == [
        ("a.py", 5, "result = width * height"), ("a.py", 6, "return result"),
        ("b.py", 5, "doubled = value * 2"), ("b.py", 6, "return doubled")]
    assert bytes(cases[1].prompt) == b"* height"
    full = line_cases([("a.py", CODE)], lambda text: list(text.encode()), bos=0, num_lines=1, context_tokens=999)
    assert full[0].prompt[0] == 0 and bytes(full[0].prompt[1:]) == CODE[:CODE.index("\n    result")].encode()


def test_predicted_line() -> None:
    assert predicted_line("\n    return x\n    y") == "return x"
    assert predicted_line("\n    return x") == "return x"
    assert predicted_line(" + 1\n    return x") is None


def test_server_layouts_parse_to_the_same_scores() -> None:
    window = [0, 5, 6]
    prompt_logprobs = [None, {"5": {"logprob": -1.0, "rank": 1, "decoded_token": "a"}},
                       {"6": {"logprob": -2.0, "rank": 3, "decoded_token": "b"},
                        "9": {"logprob": -0.5, "rank": 1, "decoded_token": "c"}}]
    score = bench_accuracy._from_prompt_logprobs(prompt_logprobs + [None], window)
    assert (score.logprobs, score.top1, score.argmax) == ([-1.0, -2.0], [True, False], [5, 9])
    echo = {"tokens": ["<s>", "a", "b", "gen"], "token_logprobs": [None, -1.0, -2.0, -0.1],
            "top_logprobs": [None, {"a": -1.0}, {"c": -0.5}, {"gen": -0.1}], "text_offset": [0, 0, 1, 2]}
    score = bench_accuracy._from_echo(echo, len(window))
    assert (score.logprobs, score.top1, score.argmax) == ([-1.0, -2.0], [True, False], None)


def test_server_without_prompt_logprobs_falls_back_to_the_echo_layout() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "prompt_logprobs" in body:
            return httpx.Response(400, json={"error": {"message": "unknown field prompt_logprobs"}})
        logprobs = {"tokens": ["<s>", "a", "b", "c"], "token_logprobs": [None, -1.0, -2.0, -0.1],
                    "top_logprobs": [None, {"a": -1.0}, {"c": -0.5}, {"c": -0.1}], "text_offset": [0, 0, 1, 2]}
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "c", "logprobs": logprobs}]})

    backend = bench_accuracy.ServerBackend("http://server", "m")
    backend.client = httpx.Client(transport=httpx.MockTransport(handler))
    assert backend.score([0, 5, 6]).top1 == [True, False]
    assert backend.score([0, 5, 6]).logprobs == [-1.0, -2.0]
    assert ["prompt_logprobs" in b for b in bodies] == [True, False, False]
    assert all(b["prompt"] == [0, 5, 6] and b["echo"] and b["temperature"] == 0 for b in bodies)


def test_transformers_backend_matches_the_models_own_loss(tiny_checkpoint, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = tiny_checkpoint()
    data = tmp_path / "held_out.txt"
    data.write_text(join_files(DOCS), encoding="utf-8")
    common = ["--backend", "transformers", "--model", str(checkpoint), "--data", str(data), "--window", "8",
              "--num-lines", "2", "--line-max-tokens", "6"]
    result = bench_accuracy.main([*common, "--output", str(tmp_path / "ref.json"), "--label", "ref"])

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    total_nll, count = 0.0, 0
    for text in DOCS.values():
        ids = [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        for start in range(1, len(ids), 8):
            end = min(start + 8, len(ids))
            chunk = torch.tensor([ids[max(0, end - 9):end]])
            labels = chunk.clone()
            labels[0, :chunk.shape[1] - (end - start)] = -100  # context only: scored by the window before
            with torch.no_grad():
                total_nll += float(model(chunk, labels=labels).loss) * (end - start)
            count += end - start
    assert result["scored_tokens"] == count == len(result["argmax_ids"])
    assert result["perplexity"] == pytest.approx(math.exp(total_nll / count), rel=1e-5)
    assert 0 <= result["top1_accuracy"] <= 1 and result["next_line"]["num_cases"] == 2
    assert result["num_bytes"] == sum(len(t) for t in DOCS.values())

    again = bench_accuracy.main([*common, "--reference", str(tmp_path / "ref.json")])
    assert again["agreement"] == [{"reference_label": "ref", "next_line_agreement": 1.0, "token_top1_agreement": 1.0}]
    shorter = bench_accuracy.main([*common, "--num-lines", "1"])
    with pytest.raises(ValueError, match="other lines"):
        agreement(shorter, json.loads((tmp_path / "ref.json").read_text()))


def test_export_jsonl_writes_the_selected_documents(tmp_path: Path) -> None:
    data = tmp_path / "held_out.txt"
    data.write_text(join_files(DOCS), encoding="utf-8")
    output = tmp_path / "missing" / "docs.jsonl"
    bench_accuracy.main(["--data", str(data), "--limit", "1", "--export-jsonl", str(output)])
    assert [json.loads(line) for line in output.read_text().splitlines()] == [{"path": "a.py", "text": CODE}]


def test_the_packaged_lm_eval_documents_are_the_held_out_split(tmp_path: Path) -> None:
    """rapid_llm/lm_eval_tasks ships bench_accuracy's export of the held-out text; regenerate it when they differ."""
    bench_accuracy.main(["--export-jsonl", str(tmp_path / "docs.jsonl")])
    assert (tmp_path / "docs.jsonl").read_bytes() == (TASKS_DIR / "demo_held_out.jsonl").read_bytes()


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_lm_eval_accepts_the_task() -> None:
    lm_eval = str(Path(sys.executable).parent / "lm-eval")
    output = subprocess.run([lm_eval, "validate", "--tasks", "demo_held_out", "--include_path", str(TASKS_DIR)],
                            capture_output=True, text=True, timeout=300, check=True).stdout
    assert "All tasks found and valid" in output
