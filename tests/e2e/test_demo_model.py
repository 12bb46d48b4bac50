"""The packaged demo models: the default server writes plausible Python, and every folder is a plain HF checkpoint.

Plausibility prompts are taken deterministically from the held-out text the models never trained on:
the first PROMPTS methods `    def name(self` written directly in a top-level `class ...:` line, each
prompted as the file's `#<|file|>` header, the class line and the def line up to and including "(self".
A greedy completion counts as plausible when some prefix of class line + def + completion ending at a
line end parses with `ast` and the method's first body statement lies on a line after the def line, so
the model must close the signature and write at least one real body line. The stricter rate of
completions that also compile (the compiler refuses e.g. duplicate argument names) is printed too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import torch

from rapid_llm.server_args import ServerArgs
from rapid_llm.utils.demo_checkpoint import DEMO_MODELS, demo_model_dir, model_dir_or_demo
from tests.e2e.server import ServerProcess

HELD_OUT = Path(__file__).resolve().parents[2] / "tools" / "demo_model" / "data" / "held_out.txt"
PROMPTS = 20
# Measured 11/20 on the packaged target (greedy, 64 tokens; 2/20 also compile); the bound leaves room for
# numeric drift across machines and batch shapes.
MIN_PLAUSIBLE = 7
METHOD = re.compile(r"    def (\w+)\(self")


def method_prompts(count: int = PROMPTS) -> list[tuple[str, str, str]]:
    """(file header, class line, def line up to "(self") of the first `count` methods of top-level classes."""
    prompts, header, class_line = [], "", None
    for line in HELD_OUT.read_text().splitlines(keepends=True):
        if line.startswith("#<|file|> "):
            header, class_line = line, None
        elif line.startswith("class ") and line.rstrip().endswith(":"):
            class_line = line
        elif line[:1] not in ("", " ", "\t", "\n", "#"):
            class_line = None  # top-level code after the class ends it
        elif class_line is not None and (match := METHOD.match(line)):
            prompts.append((header, class_line, line[:match.end()]))
            if len(prompts) == count:
                break
    return prompts


def plausible(code: str, method: str, compiles: bool = False) -> bool:
    """Whether a prefix of `code` ending at a line end parses (and, with `compiles`, compiles) and holds
    `method` with a body line below its def."""
    lines = code.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # an unfinished last line is never part of the prefix
    for end in range(len(lines), 2, -1):
        try:
            tree = ast.parse("".join(lines[:end]))
            if compiles:
                compile(tree, "<completion>", "exec")  # the checks ast.parse skips, e.g. duplicate argument names
        except SyntaxError:
            continue
        function = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == method),
                        None)
        return function is not None and function.body[0].lineno > function.lineno
    return False


@pytest.fixture(scope="module")
def default_server() -> Iterator[ServerProcess]:
    server = ServerProcess("--num-kv-blocks", "256")
    yield server
    server.stop()


def test_default_server_completes_held_out_methods_with_parsable_python(default_server: ServerProcess) -> None:
    prompts = method_prompts()
    assert len(prompts) == PROMPTS
    body = {"prompt": ["".join(parts) for parts in prompts], "max_tokens": 64, "temperature": 0}
    response = httpx.post(f"{default_server.base_url}/v1/completions", json=body, timeout=120).json()
    completions = {choice["index"]: choice["text"] for choice in response["choices"]}
    codes = [(prompts[i][1] + prompts[i][2] + completions[i], METHOD.match(prompts[i][2]).group(1))
             for i in range(PROMPTS)]
    results = [plausible(code, method) for code, method in codes]
    compiled = sum(plausible(code, method, compiles=True) for code, method in codes)
    print(f"plausible Python: {sum(results)}/{PROMPTS} parse, {compiled}/{PROMPTS} also compile")
    assert sum(results) >= MIN_PLAUSIBLE, [completions[i] for i, ok in enumerate(results) if not ok]


def test_plausibility_check_rejects_what_is_not_a_method_body() -> None:
    assert plausible("class A:\n    def f(self):\n        return self.x\n", "f")
    assert not plausible("class A:\n    def f(self): return self.x\n", "f")
    assert not plausible("class A:\n    def f(self, x]\n        return x\n", "f")
    assert not plausible("class A:\n    def f(self):\n        return self.x", "f")
    assert plausible("class A:\n    def f(self, a, a):\n        return a\n", "f")
    assert not plausible("class A:\n    def f(self, a, a):\n        return a\n", "f", compiles=True)


def test_demo_names_resolve_to_the_packaged_folders_unless_a_path_has_that_name(tmp_path, monkeypatch) -> None:
    target = str(demo_model_dir("demo-target"))
    assert model_dir_or_demo(None) == model_dir_or_demo("demo") == target
    assert model_dir_or_demo("demo-draft") == str(demo_model_dir("demo-draft"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    assert model_dir_or_demo("demo") == "demo"
    assert ServerArgs(model="demo").engine_config(target).served_model_name == "demo-target"
    assert ServerArgs(served_model_name="mine").engine_config(target).served_model_name == "mine"


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_packaged_folder_loads_in_transformers_unchanged(name: str) -> None:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(demo_model_dir(name), output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert model.dtype == torch.bfloat16 and sum(parameter.numel() for parameter in model.parameters()) > 1_000_000


def test_demo_moe_greedy_completion_matches_transformers() -> None:
    """The served Qwen3-MoE (fp32, so the two engines' roundings cannot flip a greedy pick) completes a
    held-out method prompt with exactly transformers' greedy tokens."""
    from rapid_llm.entrypoints.llm import LLM
    from rapid_llm.sampling import SamplingParams
    from tests.hf_reference import hf_greedy, hf_model

    prompt = "".join(method_prompts(1)[0])
    params = SamplingParams(temperature=0.0, max_tokens=32, min_tokens=32)
    with LLM(model="demo-moe", dtype="float32", num_kv_blocks=160) as llm:
        prompt_ids = llm.tokenizer.encode(prompt)
        output = llm.generate([prompt_ids], params)[0]
    expected = hf_greedy(hf_model(demo_model_dir("demo-moe"), torch.float32), [prompt_ids], 32)[0]
    assert output.token_ids == expected
    assert len(set(expected)) > 5, "degenerate test: the completion barely varies"
