"""Every third-party import is declared in pyproject.toml, in a group its code may rely on.

A fresh `pip install -e .` must be enough to run `rapid_llm/`; `.[bench]` adds what `benchmarks/`
needs and `.[test]` what `tests/` needs; `tools/` (the demo-model trainer) uses runtime ones only. Imports are read with `ast`, mapped to their distribution
with `importlib.metadata.packages_distributions()`, and compared with the requirement names of each
group. An import inside `try: ... except ImportError` is optional and may stay undeclared.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Iterator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the `test` extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "rapid-llm"
# The groups each tree may import from: runtime code may not rely on a bench- or test-only package.
ALLOWED_GROUPS = {
    "rapid_llm": ("runtime",),
    "benchmarks": ("runtime", "bench"),
    "tests": ("runtime", "bench", "test"),
    "tools": ("runtime",),
}
LOCAL_PACKAGES = set(ALLOWED_GROUPS)
# Files executed by another project's interpreter, or importing another project's tree that they put on
# sys.path at run time (convert_to_gguf.py: llama.cpp's converter), or loaded by path by lm-eval, whose
# `datasets` they use (the [eval] extra's task helpers).
RUN_ELSEWHERE = {"tests/benchmarks/vllm_reference.py", "benchmarks/peers/convert_to_gguf.py",
                 "rapid_llm/lm_eval_tasks/demo_held_out.py"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def normalize(name: str) -> str:
    """PEP 503 name normalisation: `Jinja2`, `prometheus_client` -> `jinja2`, `prometheus-client`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_groups(pyproject: dict) -> dict[str, set[str]]:
    """Group name ("runtime" or an extra) -> normalised distribution names, self-references expanded."""
    project = pyproject["project"]
    raw = {"runtime": project.get("dependencies", []), **project.get("optional-dependencies", {})}

    def names(group: str) -> set[str]:
        result: set[str] = set()
        for requirement in raw[group]:
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(\[([^\]]*)\])?", requirement)
            if match is None:
                raise ValueError(f"cannot read the requirement {requirement!r} of group {group}")
            name = normalize(match[1])
            if name == PROJECT:
                result |= set().union(*(names(extra.strip()) for extra in match[3].split(",")))
            else:
                result.add(name)
        return result

    return {group: names(group) for group in raw}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(kind, ast.Name) and kind.id in _IMPORT_ERRORS for kind in kinds)


def required_imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(top-level module, line) of every absolute import that is not guarded by `except ImportError`."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            optional |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            yield module.split(".")[0], node.lineno


def undeclared_imports(root: Path, groups: dict[str, set[str]],
                       distributions: dict[str, list[str]]) -> list[str]:
    """One line per import whose distribution is not declared in a group its tree may use."""
    problems = []
    for tree_name, allowed in ALLOWED_GROUPS.items():
        declared = set().union(*(groups.get(group, set()) for group in allowed))
        for path in sorted((root / tree_name).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in RUN_ELSEWHERE:
                continue
            for module, line in required_imports(ast.parse(path.read_text(), relative)):
                if module in sys.stdlib_module_names or module in LOCAL_PACKAGES:
                    continue
                owners = {normalize(d) for d in distributions.get(module, [module])}
                if owners & declared:
                    continue
                elsewhere = sorted(g for g, names in groups.items() if owners & names)
                where = (f"declared only in {elsewhere}, which {tree_name}/ may not rely on" if elsewhere
                         else "not declared in pyproject.toml")
                problems.append(f"{relative}:{line}: imports {module!r} (distribution "
                                f"{'/'.join(sorted(owners))}): {where}; add it to {list(allowed)[-1]}")
    return problems


def _project_groups() -> dict[str, set[str]]:
    return requirement_groups(tomllib.loads((ROOT / "pyproject.toml").read_text()))


def test_every_third_party_import_is_declared_in_its_group() -> None:
    assert undeclared_imports(ROOT, _project_groups(), packages_distributions()) == []


def test_an_undeclared_or_misplaced_import_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "rapid_llm"
    package.mkdir()
    (package / "fresh.py").write_text(
        "import json\n"
        "import msgspec\n"
        "from openai import OpenAI\n"
        "import not_a_real_distribution.sub\n"
        "try:\n"
        "    import also_not_real\n"
        "except ImportError:\n"
        "    also_not_real = None\n"
    )
    problems = undeclared_imports(tmp_path, _project_groups(), packages_distributions())
    assert problems == [
        "rapid_llm/fresh.py:3: imports 'openai' (distribution openai): declared only in ['test'], "
        "which rapid_llm/ may not rely on; add it to runtime",
        "rapid_llm/fresh.py:4: imports 'not_a_real_distribution' (distribution not-a-real-distribution): "
        "not declared in pyproject.toml; add it to runtime",
    ]


def test_extras_that_name_the_project_include_that_extra() -> None:
    groups = requirement_groups({"project": {
        "name": "rapid_llm",
        "dependencies": ["torch>=2.13", "uvloop>=0.23; sys_platform != 'win32'"],
        "optional-dependencies": {"bench": ["numpy>=2"], "test": ["rapid_llm[bench]", "pytest"]},
    }})
    assert groups == {"runtime": {"torch", "uvloop"}, "bench": {"numpy"}, "test": {"numpy", "pytest"}}
