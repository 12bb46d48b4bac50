"""An out-of-tree model with recurrent layers, served by the real server through `RAPID_LLM_PLUGINS`.

The launcher, scheduler, detokenizer and worker each import tests.models.recurrent_double_plugin (which registers
the double by its "module:Class" target); the worker builds the model with a state cache group. A batch of
prompts with chunked prefill, async scheduling and preemption (a 9-block KV cache) must give the double's
full-sequence reference greedy tokens, with prefix caching on and no hits; a beam-search request is refused with
the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rapid_llm.config import ModelConfig
from rapid_llm.utils.plugins import PLUGINS_ENV
from tests.e2e.server import ServerProcess
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
        model = str(checkpoint)
        assert server.greedy_token_ids(model, prompts, NEW_TOKENS) == expected
        # Repeated: cached blocks would be hits for a model of paged layers only; this one finds none.
        assert server.greedy_token_ids(model, prompts[1:2], NEW_TOKENS, timeout=60) == expected[1:2]
        metrics = server.metrics()
        assert metrics["rapid_llm:prefix_cache_queries_total"] > 0
        assert metrics["rapid_llm:prefix_cache_hits_total"] == 0
        # Nine 16-token blocks hold two or three of the prompts with their outputs, not four: some were preempted
        # and recomputed from token 0, their state afresh.
        assert sum(value for name, value in metrics.items() if "preemption" in name) > 0, metrics
        beams = server.beam_search(model, prompts[0])
        assert beams.status_code == 400 and "beam search is refused for this model" in beams.text, beams.text
    finally:
        server.stop()
