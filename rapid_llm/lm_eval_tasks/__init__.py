"""lm-evaluation-harness tasks that ship with rapid_llm, found from any folder once it is installed.

`demo_held_out`: the demo models' held-out split (tools/demo_model/data/held_out.txt, one document per
standard-library file) as a rolling-loglikelihood task; its documents ship as demo_held_out.jsonl, so
neither the repository nor an export step is needed. `python -m rapid_llm.lm_eval_tasks` prints this
folder for lm-eval's `--include_path`, and `--tokenizer MODEL` the checkpoint folder of a model name
(`demo-target`) for lm-eval's `tokenizer=`; README.md "Evaluate with lm-eval" has the command.
"""

from __future__ import annotations

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
