"""Project rules checked on the source: half precision is named only in the dtype table."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rapid_llm"
DTYPE_TABLE = PACKAGE / "config" / "dtypes.py"


def test_no_float16_outside_the_dtype_table() -> None:
    pattern = re.compile(r"torch\.float16|\.half\(\)|torch\.half\b")
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path != DTYPE_TABLE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
