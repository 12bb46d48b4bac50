"""The DFlash adapter (spec_decode/dflash.py) against the stand-in library (tests/spec_decode/mock_dflash):
without the library or with another version building it fails with what to install; through the worker its
greedy and seeded tokens equal plain decoding, the drafter is fed the target's hidden states of its layers
(equal to transformers') with position ids that continue its cache, and drafts are verified; a draft request
without context (a prefix-cache hit) is an error. When the real dflash is installed, the stand-in's signatures
must equal its own."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest
import torch

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode.model_proposer import ProposerStep
from rapid_llm.spec_decode.registry import runs_in_worker
from tests.hf_reference import hf_model
from tests.spec_decode.drafter_harness import GREEDY, PROMPTS, SEEDED, checkpoint, runner, serve, use_library

FIELDS = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_hidden_layers": 1,
          "dflash_config": {"target_layer_ids": [0], "block_size": 4, "mask_token_id": 3}}


@pytest.fixture
def mock_dflash(monkeypatch: pytest.MonkeyPatch):
    dflash = use_library(monkeypatch, "mock_dflash", "dflash")
    dflash.CALLS.clear()
    return dflash


def _config(path: str, k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="dflash", model=path, num_speculative_tokens=k)


def test_without_the_library_or_with_another_version_it_refuses(tiny_checkpoint, tmp_path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    draft = checkpoint(tmp_path / "draft", FIELDS)
    assert runs_in_worker("dflash")
    monkeypatch.setitem(sys.modules, "dflash", None)  # import fails, as when it is not installed
    with pytest.raises(RuntimeError, match=r"needs the 'dflash' library \(pip install 'dflash\[local\]==0.1.0'\)"):
        runner(target, _config(draft))
    monkeypatch.delitem(sys.modules, "dflash")
    dflash = use_library(monkeypatch, "mock_dflash", "dflash")
    monkeypatch.setattr(dflash, "__version__", "0.2.0")
    with pytest.raises(RuntimeError, match="supports dflash 0.1.0; 0.2.0 is installed"):
        runner(target, _config(draft))


def test_more_drafts_than_the_block_holds_is_refused(tiny_checkpoint, tmp_path, mock_dflash) -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens 4 exceeds what a dflash block of 4 drafts"):
        runner(str(tiny_checkpoint("LlamaForCausalLM")), _config(checkpoint(tmp_path / "d", FIELDS), k=4))


@pytest.mark.parametrize("architecture", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_tokens_equal_plain_decoding_and_the_drafter_sees_the_targets_states(
        tiny_checkpoint, tmp_path, mock_dflash, architecture: str) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    draft = checkpoint(tmp_path / "draft", {**FIELDS, "architectures": [architecture]})
    speculative = _config(draft)
    spec_runner, plain = runner(target, speculative), runner(target, None)
    for params in (GREEDY, SEEDED):
        tokens, stats = serve(spec_runner, speculative, params)
        assert tokens == serve(plain, None, params)[0]
        assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_draft_tokens <= 3 * stats.spec_decode_num_drafts
    first = mock_dflash.CALLS[0]
    assert first["cached"] == 0 and first["positions"][:1] == [0]
    prompt = next(p for p in PROMPTS if len(p) == first["target_hidden"].shape[1])
    with torch.inference_mode():
        reference = hf_model(target)(torch.tensor([prompt]), output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(first["target_hidden"][0], reference[0], rtol=1e-4, atol=1e-4)


def test_a_drafting_row_without_context_is_an_error(tiny_checkpoint, tmp_path, mock_dflash) -> None:
    proposer = runner(str(tiny_checkpoint("LlamaForCausalLM")), _config(checkpoint(tmp_path / "d", FIELDS))).drafting.proposer
    hidden = torch.zeros(2, 64)
    step = ProposerStep(slots=np.array([0]), starts=np.array([8]), query_lens=np.array([2]), block_tables=[[5, 6, 7]],
                        hidden_states={0: hidden}, draft_rows=np.array([0]), num_tokens=np.array([11]),
                        num_outputs=np.array([1]), max_drafts=np.array([2]), token_pool=torch.zeros(4, 65),
                        sampling=None)
    with pytest.raises(RuntimeError, match="slot 0 has no target hidden states before position 10 .*"
                                           "--disable-prefix-caching"):
        proposer.propose(step)


def test_the_stand_in_matches_the_installed_library() -> None:
    pytest.importorskip("dflash", reason="the real dflash is not installed")
    real = sys.modules["dflash"]
    if getattr(real, "CALLS", None) is not None:
        pytest.skip("the stand-in is on the path")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mock_dflash", __file__.replace("test_dflash_adapter.py",
                                                                                  "mock_dflash/dflash/__init__.py"))
    mock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mock)
    for name in ("extract_context_feature", "sample"):
        assert inspect.signature(getattr(mock, name)).parameters.keys() == \
            inspect.signature(getattr(real, name)).parameters.keys(), name
    for cls, method in (("DFlashDraftModel", "forward"), ("DFlashDraftModel", "compute_logits"),
                        ("DFlash2DraftModel", "propose")):
        mine = list(inspect.signature(getattr(getattr(mock, cls), method)).parameters)
        theirs = list(inspect.signature(getattr(getattr(real, cls), method)).parameters)
        assert mine[: len(theirs)] == theirs[: len(mine)] or set(theirs) <= set(mine), (cls, method)
