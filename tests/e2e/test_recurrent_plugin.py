"""An out-of-tree model with recurrent layers, served by the real server through `RAPID_LLM_PLUGINS`.

The launcher, scheduler, detokenizer and worker each import tests.models.recurrent_double_plugin (which registers
the double by its "module:Class" target); the worker builds the model with a state cache group. A batch of
prompts with chunked prefill and async scheduling must give the double's full-sequence reference greedy tokens,
with prefix caching on and no hits; a beam-search request is refused with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
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
                           "--num-kv-blocks", "64", "--max-model-len", "128", "--dtype", "float32",
                           env={PLUGINS_ENV: "tests.models.recurrent_double_plugin", "PYTHONPATH": python_path})
    try:
        url = f"{server.base_url}/v1/completions"
        body = {"model": str(checkpoint), "prompt": prompts, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
                "temperature": 0.0, "return_token_ids": True}
        choices = httpx.post(url, json=body, timeout=120).raise_for_status().json()["choices"]
        assert [choice["token_ids"] for choice in sorted(choices, key=lambda choice: choice["index"])] == expected
        # Repeated: cached blocks would be hits for a model of paged layers only; this one finds none.
        again = httpx.post(url, json={**body, "prompt": prompts[1]}, timeout=60).raise_for_status().json()
        assert again["choices"][0]["token_ids"] == expected[1]
        metrics = server.metrics()
        assert metrics["rapid_llm:prefix_cache_queries_total"] > 0
        assert metrics["rapid_llm:prefix_cache_hits_total"] == 0
        beams = httpx.post(url, json={"model": str(checkpoint), "prompt": prompts[0], "max_tokens": 4, "n": 2,
                                      "use_beam_search": True, "temperature": 0.0}, timeout=60)
        assert beams.status_code == 400 and "beam search is refused for this model" in beams.text, beams.text
    finally:
        server.stop()
