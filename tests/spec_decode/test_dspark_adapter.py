"""The DSpark adapter (spec_decode/dspark.py) against the stand-in DeepSpec (tests/spec_decode/mock_deepspec):
without DeepSpec, with another version, with a checkpoint of another architecture or reading the embedding or
final layer, building it fails saying why; through the worker its greedy and seeded tokens equal plain decoding,
the block forward gets the target's states of its layers and a `start` that continues its cache, and the
confidence threshold cuts every proposal where the predicted prefix acceptance falls below it."""

from __future__ import annotations

import sys

import pytest
import torch

from rapid_llm.config.speculative_config import SpeculativeConfig
from tests.hf_reference import hf_model
from tests.spec_decode.drafter_harness import GREEDY, PROMPTS, SEEDED, checkpoint, runner, serve, use_library

FIELDS = {"architectures": ["Qwen3DSparkModel"], "hidden_size": 64, "vocab_size": 512, "target_layer_ids": [0],
          "block_size": 5, "mask_token_id": 3, "confidence_logit": 2.0}


@pytest.fixture
def mock_deepspec(monkeypatch: pytest.MonkeyPatch):
    draft_ops = use_library(monkeypatch, "mock_deepspec", "deepspec", "deepspec.eval.dspark.draft_ops")
    draft_ops.CALLS.clear()
    return draft_ops


def _config(path: str, k: int = 4, threshold: float = 0.0) -> SpeculativeConfig:
    return SpeculativeConfig(method="dspark", model=path, num_speculative_tokens=k, confidence_threshold=threshold)


def test_refusals_say_why(tiny_checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    monkeypatch.setitem(sys.modules, "deepspec", None)
    with pytest.raises(RuntimeError, match="method 'dspark' needs the 'deepspec' library"):
        runner(target, _config(checkpoint(tmp_path / "a", FIELDS)))
    monkeypatch.delitem(sys.modules, "deepspec")
    deepspec = use_library(monkeypatch, "mock_deepspec", "deepspec")
    cases = [({"architectures": ["LlamaForCausalLM"]}, ValueError, "is not a DSpark checkpoint"),
             ({"target_layer_ids": [-1, 0]}, ValueError, r"embedding output \(-1\) and the final layer \(1\)"),
             ({"target_layer_ids": [1]}, ValueError, "are not exported to proposers")]
    for index, (change, error, message) in enumerate(cases):
        with pytest.raises(error, match=message):
            runner(target, _config(checkpoint(tmp_path / f"c{index}", {**FIELDS, **change})))
    monkeypatch.setattr(deepspec, "__version__", "0.2.0")
    with pytest.raises(RuntimeError, match="supports deepspec 0.1.0; 0.2.0 is installed"):
        runner(target, _config(checkpoint(tmp_path / "v", FIELDS)))


def test_tokens_equal_plain_decoding_and_the_block_forward_sees_the_targets_states(
        tiny_checkpoint, tmp_path, mock_deepspec) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = _config(checkpoint(tmp_path / "draft", FIELDS))
    spec_runner, plain = runner(target, speculative), runner(target, None)
    for params in (GREEDY, SEEDED):
        tokens, stats = serve(spec_runner, speculative, params)
        assert tokens == serve(plain, None, params)[0]
        assert stats.spec_decode_num_drafts > 0
    first = mock_deepspec.CALLS[0]
    prompt = next(p for p in PROMPTS if len(p) == first["start"])
    with torch.inference_mode():
        reference = hf_model(target)(torch.tensor([prompt]), output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(first["target_hidden_states"][0], reference[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("threshold", "most"), [(0.0, 4), (0.65, 3), (0.75, 2)])
def test_the_confidence_threshold_cuts_proposals(tiny_checkpoint, tmp_path, mock_deepspec, threshold: float,
                                                 most: int) -> None:
    # sigmoid(2) = 0.881: the predicted prefix acceptance is 0.881, 0.776, 0.684, 0.602 for drafts 1..4.
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = _config(checkpoint(tmp_path / "draft", FIELDS), threshold=threshold)
    _, stats = serve(runner(target, speculative), speculative, GREEDY)
    assert 0 < stats.spec_decode_num_draft_tokens <= most * stats.spec_decode_num_drafts
    assert len(stats.spec_decode_num_accepted_tokens_per_pos) <= most
