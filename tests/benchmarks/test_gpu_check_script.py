"""benchmarks/gpu_check.sh parses, and the stage names that docs/benchmarks.md tells a GPU session
to pass in GPU_CHECK_STAGES are stages the script has (a misspelt name would silently run nothing)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _stages() -> set[str]:
    return set(re.findall(r"^stage ([a-z0-9-]+) ", SCRIPT.read_text(), flags=re.MULTILINE))


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_documented_stage_lists_name_real_stages() -> None:
    stages = _stages()
    assert {"install", "environment", "tests-engine", "tests-kernels-core", "tests-kernels-rest"} <= stages
    documented = re.findall(r'GPU_CHECK_STAGES="([^"]+)"', (ROOT / "docs" / "benchmarks.md").read_text())
    assert documented
    for names in documented:
        assert set(names.replace("\\\n", " ").split()) <= stages, names
