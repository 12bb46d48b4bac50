"""The documents of the demo_held_out task, read from the JSONL beside this file (lm-eval's custom_dataset).

lm-eval imports this file by path (`!function demo_held_out.documents` in demo_held_out.yaml), not as
part of the rapid_llm package, so it locates its data from `__file__`; `datasets` comes with lm-eval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

DOCUMENTS = Path(__file__).resolve().parent / "demo_held_out.jsonl"


def documents(**_task_metadata: Any) -> datasets.DatasetDict:
    """A "test" split of {"path", "text"} records, one per held-out file; lm-eval passes the task's metadata."""
    with DOCUMENTS.open(encoding="utf-8") as file:
        return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(line) for line in file])})
