"""An out-of-tree model with recurrent layers, served by the real server through `RAPID_LLM_PLUGINS`.

The launcher, scheduler, detokenizer and worker each import tests.models.recurrent_double_plugin (which registers
the double by its "module:Class" target); the worker builds the model with a state cache group. A batch of
prompts with chunked prefill, async scheduling and preemption (a 9-block KV cache) must give the double's
full-sequence reference greedy tokens, and a repeated prompt starts from a prefix hit (KV blocks and the state
snapshot at its last block boundary); a beam-search request is refused with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rapid_llm.config import ModelConfig
from rapid_llm.utils.plugins import PLUGINS_ENV
from tests.e2e.server import ServerProcess
from tests.e2e.state_models import check_served_state_model
from tests.models.recurrent_double import build_recurrent_double, reference_greedy, reference_model

REPOSITORY = Path(__file__).resolve().parents[2]
NEW_TOKENS = 12


def test_the_recurrent_double_is_served_through_a_plugin(tmp_path: Path) -> None:
    checkpoint = build_recurrent_double(tmp_path / "double")
    generator = torch.Generator().manual_seed(9)
    prompts = [torch.randint(10, 500, (n,), generator=generator).tolist() for n in (21, 34, 8, 27)]
    prompts.append(prompts[1][:32] + prompts[0][:5])  # shares two 16-token blocks with the second prompt
    eos = ModelConfig.from_pretrained(str(checkpoint)).eos_token_ids
    expected = reference_greedy(reference_model(checkpoint), prompts, NEW_TOKENS, eos)
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    server = ServerProcess("--model", str(checkpoint), "--max-num-batched-tokens", "16", "--max-num-seqs", "4",
                           "--num-kv-blocks", "9", "--max-model-len", "128", "--dtype", "float32",
                           env={PLUGINS_ENV: "tests.models.recurrent_double_plugin", "PYTHONPATH": python_path})
    try:
        # Nine 16-token blocks hold two or three of the prompts with their outputs, not four.
        check_served_state_model(server, str(checkpoint), prompts, expected, NEW_TOKENS)
        beams = server.beam_search(str(checkpoint), prompts[0])
        assert beams.status_code == 400 and "beam search is refused for this model" in beams.text, beams.text
    finally:
        server.stop()
