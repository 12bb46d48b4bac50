"""DeepSeek-V3 and V4 checkpoints with their MTP layers appended load without them: the tensors are never read,
the logits are those of the checkpoint without them, one log line names what was skipped and why, and a
tensor no declaration covers (an MTP layer past num_nextn_predict_layers) is still refused."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rapid_llm.model_loader import safetensors_files
from rapid_llm.models.deepseek import mtp_checkpoint_keys as deepseek_mtp_keys
from rapid_llm.models.deepseek_v4 import mtp_checkpoint_keys as v4_mtp_keys
from rapid_llm.models.weight_mapping import MTP_REASON, skipped_by
from rapid_llm.utils.tiny_checkpoint import tiny_config
from tests.models.paged_generation import prefill_logits
from tests.models.test_hf_parity import _prompts, _runner

V2, V3, V4 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM"
LOADER_LOG = "rapid_llm.model_loader.loader"


def _mtp_tensors(tensors: dict[str, torch.Tensor], architecture: str, layers: int, index: int,
                 ) -> dict[str, torch.Tensor]:
    """MTP layer `index` as the real checkpoints store it: a copy of the last decoder layer plus the MTP extras
    (V3: model.layers.{layers + index}.enorm/hnorm/eh_proj/shared_head...; V4: mtp.{index}.e_proj/h_proj...)."""
    hidden = tensors["model.norm.weight"].shape[0]
    last = f"model.layers.{layers - 1}."
    prefix = f"model.layers.{layers + index}." if architecture == V3 else f"mtp.{index}."
    extras = {"enorm.weight": torch.ones(hidden), "hnorm.weight": torch.ones(hidden)}
    if architecture == V3:
        extras |= {"eh_proj.weight": torch.zeros(hidden, 2 * hidden), "embed_tokens.weight": torch.zeros(8, hidden),
                   "shared_head.norm.weight": torch.ones(hidden), "shared_head.head.weight": torch.zeros(8, hidden)}
    else:
        extras |= {"e_proj.weight": torch.zeros(hidden, hidden), "h_proj.weight": torch.zeros(hidden, hidden),
                   "norm.weight": torch.ones(hidden), "head.weight": torch.zeros(8, hidden),
                   "hc_head_fn": torch.zeros(2, 2 * hidden), "hc_head_base": torch.zeros(2),
                   "hc_head_scale": torch.ones(1)}
    layer = {prefix + name[len(last):]: tensor.clone() for name, tensor in tensors.items() if name.startswith(last)}
    return layer | {prefix + name: tensor for name, tensor in extras.items()}


def _with_mtp(source: Path, target: Path, architecture: str, indices: tuple[int, ...]) -> Path:
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    layers = tiny_config(architecture).num_hidden_layers
    for index in indices:
        tensors |= _mtp_tensors(tensors, architecture, layers, index)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


@pytest.mark.parametrize("architecture", [V3, V4])
def test_mtp_layers_are_skipped_unread_and_logged(tiny_checkpoint, tmp_path: Path, monkeypatch, caplog,
                                                  architecture: str) -> None:
    plain = tiny_checkpoint(architecture)
    with_mtp = _with_mtp(plain, tmp_path / "mtp", architecture, (0,))
    read: list[str] = []
    real_safe_open = safetensors_files.safe_open

    class RecordingSafeOpen:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.shard = real_safe_open(*args, **kwargs)

        def __enter__(self) -> RecordingSafeOpen:
            self.opened = self.shard.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.shard.__exit__(*exc)

        def keys(self) -> list[str]:
            return self.opened.keys()

        def get_tensor(self, name: str) -> torch.Tensor:
            read.append(name)
            return self.opened.get_tensor(name)

    monkeypatch.setattr(safetensors_files, "safe_open", RecordingSafeOpen)
    with caplog.at_level(logging.INFO, logger=LOADER_LOG):
        runner = _runner(with_mtp)
    mtp_names = set(load_file(with_mtp / "model.safetensors")) - set(load_file(plain / "model.safetensors"))
    assert read and not mtp_names & set(read), "skipped tensors must not be read"
    records = [r.getMessage() for r in caplog.records if r.name == LOADER_LOG]
    assert len(records) == 1, records
    assert f"{len(mtp_names)} tensors" in records[0] and MTP_REASON in records[0]
    assert any(name in records[0] for name in mtp_names) and ", ...)" in records[0]

    monkeypatch.undo()
    prompts = _prompts(runner.model_config.vocab_size, lengths=(7, 12), seed=3)
    for ours, reference in zip(prefill_logits(runner, prompts), prefill_logits(_runner(plain), prompts)):
        assert torch.equal(ours, reference)


@pytest.mark.parametrize(("architecture", "unexpected"), [
    (V3, "model.layers.3.enorm.weight"),  # a second MTP layer where the config declares one
    (V4, "mtp.1.enorm.weight"),
])
def test_mtp_layers_beyond_the_config_are_still_refused(tiny_checkpoint, tmp_path: Path, architecture: str,
                                                        unexpected: str) -> None:
    checkpoint = _with_mtp(tiny_checkpoint(architecture), tmp_path / "mtp", architecture, (0, 1))
    with pytest.raises(ValueError, match=f"does not use: .*{unexpected}"):
        _runner(checkpoint)


def test_the_declarations_follow_the_config() -> None:
    config = tiny_config(V2)
    assert not hasattr(config, "num_nextn_predict_layers")
    assert deepseek_mtp_keys(config) == ()  # V2 has no MTP layers: its layer N is refused like any stray tensor
    v3 = deepseek_mtp_keys(tiny_config(V3, num_nextn_predict_layers=2))  # two layers, after layers 0 and 1
    assert [i for i in range(5) if skipped_by(f"model.layers.{i}.enorm.weight", v3)] == [2, 3]
    v4 = v4_mtp_keys(tiny_config(V4))
    assert skipped_by("mtp.0.e_proj.weight", v4) and skipped_by("model.mtp.0.hnorm.weight", v4)
    assert not skipped_by("mtp.1.e_proj.weight", v4) and not skipped_by("model.layers.0.mtp.0.x", v4)
    assert v4_mtp_keys(tiny_config(V4, num_nextn_predict_layers=0)) == ()
