"""The package's floors (docs/architecture.md, "Floors"): a module imports only modules on its own floor or
below, the process packages never import one another, and no modules import each other in a loop.

The floor table is data: each floor lists module prefixes, and a module stands on the floor of its longest
matching prefix (so `rapid_llm.quantization.fp8_math` can stand below the rest of `quantization/`). Imports are
read by `import_graph.py` (every import in a file, function bodies included; `if TYPE_CHECKING:` left out).
A face, a package whose `__init__` only hands names on, stands on the highest floor it imports (importing
`a.b.c` runs `a` and `a.b` too); the root package holds `__version__` and lazy exports (`LLM` in `__getattr__`),
so importing it is allowed from any floor and its own lazy imports make no edge. A low floor names code above it
only as a "module:attribute" string (utils/lazy_import.py), which is no import.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_graph import Graph, cycles, faces, import_graph

PACKAGE = Path(__file__).resolve().parents[2] / "rapid_llm"
ROOT = "rapid_llm"
QUANT = "rapid_llm.quantization"
FLOORS: list[tuple[str, list[str]]] = [
    # Torch-free tables and formats: what the launcher reads before any engine process starts.
    ("ground", ["rapid_llm.utils", "rapid_llm.config", "rapid_llm.sampling", "rapid_llm.ipc",
                "rapid_llm.distributed", "rapid_llm.structured", "rapid_llm.models.registry",
                "rapid_llm.models.weight_mapping", "rapid_llm.lora.adapter_files", f"{QUANT}.base", f"{QUANT}.registry",
                f"{QUANT}.methods", f"{QUANT}.fp4_config", f"{QUANT}.fp8_config", f"{QUANT}.int4_config",
                f"{QUANT}.compressed_tensors_config"]),
    ("kernels", ["rapid_llm.ops", f"{QUANT}.fp4_math", f"{QUANT}.fp8_math", f"{QUANT}.int4_math"]),
    ("layers", ["rapid_llm.layers", "rapid_llm.lora.lora_linear", "rapid_llm.lora.lora_vocab", f"{QUANT}.linear_method", f"{QUANT}.moe_method"]),
    ("models", ["rapid_llm.models", QUANT]),
    ("loading", ["rapid_llm.model_loader", "rapid_llm.spec_decode", "rapid_llm.quantize", "rapid_llm.lora"]),
    ("processes", ["rapid_llm.scheduler_proc", "rapid_llm.worker_proc", "rapid_llm.detokenizer_proc",
                   "rapid_llm.frontend"]),
    ("entry", ["rapid_llm.server_args", "rapid_llm.entrypoints", "rapid_llm.launch_server", "rapid_llm.cli",
               "rapid_llm.router",
               "rapid_llm.build_ops", "rapid_llm.lm_eval_tasks",
               "rapid_llm"]),
]
SIDE_BY_SIDE = "processes"  # packages on this floor are separate processes: none imports another


def floor_of(module: str) -> tuple[int, str]:
    """(floor index, the prefix that placed it); the longest matching prefix wins."""
    # A package prefix covers its submodules; the root package covers only itself (else it would place
    # every module, and a new package would land on the top floor unnoticed).
    matches = [(len(prefix), level, prefix) for level, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
               if module == prefix or (prefix != ROOT and module.startswith(prefix + "."))]
    if not matches:
        raise LookupError(f"{module} stands on no floor: add its package to FLOORS")
    _, level, prefix = max(matches)
    return level, prefix


def layering_violations(graph: Graph, face_modules: set[str]) -> set[str]:
    """Every cycle, upward and sideways import of `graph`; a face stands on the highest floor it imports."""
    graph = {module: {t: line for t, line in edges.items() if t != ROOT}
             for module, edges in graph.items() if module != ROOT}
    placed: dict[str, tuple[int, str]] = {}

    def place(module: str) -> tuple[int, str]:
        if module not in placed:
            if module in face_modules:
                placed[module] = (0, module)  # a guard, should faces ever import each other in a loop
                placed[module] = (max((place(t)[0] for t in graph.get(module, {})), default=0), module)
            else:
                placed[module] = floor_of(module)
        return placed[module]

    found = {"cycle " + " ".join(component) for component in cycles(graph)}
    side_by_side = [name for name, _ in FLOORS].index(SIDE_BY_SIDE)
    for module, edges in graph.items():
        level, prefix = place(module)
        for target in edges:
            target_level, target_prefix = place(target)
            if target_level > level:
                found.add(f"upward {module} -> {target}")
            elif target_level == level == side_by_side and target_prefix != prefix and target not in face_modules:
                found.add(f"sideways {module} -> {target}")
    return found


def test_every_module_stands_on_a_floor() -> None:
    for module in import_graph(PACKAGE):
        floor_of(module)


def test_no_import_cycle_and_no_upward_or_sideways_import() -> None:
    assert sorted(layering_violations(import_graph(PACKAGE), faces(PACKAGE))) == [], "see docs/architecture.md, Floors"


def test_a_package_missing_from_the_table_is_named() -> None:
    with pytest.raises(LookupError, match="rapid_llm.new_package.module stands on no floor"):
        floor_of("rapid_llm.new_package.module")


def test_the_check_sees_an_upward_import_a_sideways_one_and_a_cycle() -> None:
    graph = {"rapid_llm.ops.registry": {"rapid_llm.models.llama": 3},
             "rapid_llm.models.llama": {"rapid_llm.ops.registry": 1},
             "rapid_llm.frontend.app": {"rapid_llm.scheduler_proc.scheduler": 5, "rapid_llm": 2},
             "rapid_llm.scheduler_proc.scheduler": {}}
    assert layering_violations(graph, set()) == {
        "upward rapid_llm.ops.registry -> rapid_llm.models.llama",
        "cycle rapid_llm.models.llama rapid_llm.ops.registry",
        "sideways rapid_llm.frontend.app -> rapid_llm.scheduler_proc.scheduler",
    }


def test_the_graph_reads_relative_submodule_parent_and_type_checking_imports(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/a.py": "from . import b\nfrom typing import TYPE_CHECKING\n"
             "if TYPE_CHECKING:\n    import pkg.c\n", "pkg/b.py": "def f():\n    from pkg.sub.d import x\n",
             "pkg/c.py": "", "pkg/sub/__init__.py": "import pkg.c\n", "pkg/sub/d.py": "x = 1\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.a"] == {"pkg.b": 1}
    assert graph["pkg.b"] == {"pkg.sub": 2, "pkg.sub.d": 2}
    assert graph["pkg.sub"] == {"pkg.c": 1}
    assert faces(tmp_path / "pkg") == {"pkg", "pkg.sub"}
