"""Config resolution: dtype auto vs user, max_model_len limits, flags, and errors that name the setting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig
from rapid_llm.server_args import ServerArgs


def test_dtype_auto_follows_the_checkpoint_and_a_user_dtype_wins(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint(dtype=torch.bfloat16)
    assert ModelConfig.from_pretrained(str(checkpoint)).dtype == torch.bfloat16
    assert ModelConfig.from_pretrained(str(checkpoint), dtype="float32").dtype == torch.float32


def test_unknown_dtype_names_the_flag(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="--dtype='float8'.*bfloat16"):
        ModelConfig.from_pretrained(str(tiny_checkpoint()), dtype="float8")


def test_max_model_len_defaults_to_the_model_and_may_be_lowered(tiny_checkpoint) -> None:
    checkpoint = str(tiny_checkpoint())
    assert ModelConfig.from_pretrained(checkpoint).max_model_len == 512
    assert ModelConfig.from_pretrained(checkpoint, max_model_len=100).max_model_len == 100


def test_max_model_len_beyond_the_model_names_both_numbers(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match=r"--max-model-len 4096 is more than the model supports \(512"):
        ModelConfig.from_pretrained(str(tiny_checkpoint()), max_model_len=4096)


def test_rope_scaling_stretches_the_supported_length(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint(max_position_embeddings=32,
                                 rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    assert ModelConfig.from_pretrained(str(checkpoint)).max_model_len == 128


def test_rope_parameters_are_resolved_once_without_touching_the_hf_config(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint(max_position_embeddings=32,
                                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    config = ModelConfig.from_pretrained(str(checkpoint))
    before = config.hf_config.to_dict()
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 4.0
    config.rope_parameters["factor"] = 1.0  # the stored dict is a copy, not the HF config's own
    assert config.hf_config.rope_parameters["factor"] == 4.0 and config.hf_config.to_dict() == before


def _copy_with_config(checkpoint: Path, target: Path, **changes: object) -> Path:
    """A copy of `checkpoint` whose config.json has `changes` applied (None deletes a key)."""
    shutil.copytree(checkpoint, target)
    _edit_config(target, **changes)
    return target


def _edit_config(checkpoint: Path, **changes: object) -> None:
    values = {**json.loads((checkpoint / "config.json").read_text()), **changes}
    kept = {key: value for key, value in values.items() if value is not None}
    (checkpoint / "config.json").write_text(json.dumps(kept))


def test_a_transformers_4_config_json_resolves_as_transformers_reads_it(tiny_checkpoint, tmp_path) -> None:
    checkpoint = _copy_with_config(tiny_checkpoint(max_position_embeddings=32), tmp_path / "v4", dtype=None,
                                   torch_dtype="bfloat16", rope_parameters=None, rope_theta=10000.0,
                                   rope_scaling={"type": "linear", "factor": 4.0})
    config = ModelConfig.from_pretrained(str(checkpoint))
    assert (config.dtype, config.max_model_len) == (torch.bfloat16, 128)
    assert config.hf_config.max_position_embeddings == 32  # built, and it agreed with the JSON reading


def test_the_worker_refuses_a_config_transformers_reads_differently(tiny_checkpoint, tmp_path) -> None:
    checkpoint = _copy_with_config(tiny_checkpoint(), tmp_path / "changed")
    config = ModelConfig.from_pretrained(str(checkpoint))
    _edit_config(checkpoint, vocab_size=config.vocab_size + 1)  # changed after the launcher read it
    with pytest.raises(ValueError, match="as JSON gives .*vocab_size=512.* but transformers reads .*vocab_size=513"):
        config.hf_config


def test_a_config_json_without_max_position_embeddings_is_refused(tiny_checkpoint, tmp_path) -> None:
    checkpoint = _copy_with_config(tiny_checkpoint(), tmp_path / "no-positions", max_position_embeddings=None)
    with pytest.raises(ValueError, match="names no max_position_embeddings"):
        ModelConfig.from_pretrained(str(checkpoint))


def test_not_a_checkpoint_directory(tmp_path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        ModelConfig.from_pretrained(str(tmp_path))


def test_eos_comes_from_generation_config(tiny_checkpoint) -> None:
    assert ModelConfig.from_pretrained(str(tiny_checkpoint())).eos_token_ids == (1,)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"block_size": 0}, "--block-size"),
        ({"num_blocks": 0}, "--num-kv-blocks"),
        ({"kv_cache_memory_bytes": -1}, "--kv-cache-memory"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
        ({"cache_dtype": "int3"}, "--kv-cache-dtype"),
    ],
)
def test_cache_config_errors_name_the_flag(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"max_num_seqs": 0}, "--max-num-seqs"), ({"max_num_batched_tokens": 0}, "--max-num-batched-tokens")],
)
def test_scheduler_config_is_checked_when_built(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(max_model_len=64, **kwargs)


def test_kv_dtype_auto_is_the_model_dtype() -> None:
    assert CacheConfig().kv_dtype(torch.bfloat16) == torch.bfloat16
    assert CacheConfig(cache_dtype="float32").kv_dtype(torch.bfloat16) == torch.float32


def test_device_auto_picks_what_exists() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert DeviceConfig().torch_device.type == expected == DeviceConfig().type
    assert DeviceConfig("cpu").type == "cpu"
    with pytest.raises(ValueError, match="--device"):
        DeviceConfig("tpu")


@pytest.mark.parametrize(("argv", "enabled"), [([], True), (["--enable-prefix-caching"], True),
                                               (["--disable-prefix-caching"], False)])
def test_prefix_caching_is_on_by_default_and_can_be_turned_off(tiny_checkpoint, argv: list[str],
                                                               enabled: bool) -> None:
    args = ServerArgs.from_cli(argv)
    assert args.enable_prefix_caching is enabled
    assert args.engine_config(str(tiny_checkpoint())).scheduler.enable_prefix_caching is enabled
