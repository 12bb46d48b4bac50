"""The model registry is lazy and its errors name what went wrong."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.models import resolve_model_class, supported_architectures
from rapid_llm.worker_proc.model_runner import ModelRunner


def test_importing_models_loads_no_model_module() -> None:
    code = (
        "import sys, rapid_llm.models\n"
        "loaded = [m for m in sys.modules if m.startswith('rapid_llm.models.') and m != 'rapid_llm.models.registry']\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_resolving_imports_the_model_on_demand() -> None:
    assert resolve_model_class("Qwen3ForCausalLM").__name__ == "Qwen3ForCausalLM"
    assert set(supported_architectures()) == {
        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Lfm2ForCausalLM", "LlamaForCausalLM",
        "MistralForCausalLM", "MixtralForCausalLM", "NemotronHForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM"}


def test_unknown_architecture_error_lists_supported_ones() -> None:
    with pytest.raises(ValueError) as error:
        resolve_model_class("GPTNeoXForCausalLM")
    message = str(error.value)
    assert "'GPTNeoXForCausalLM' is not supported" in message
    assert all(name in message for name in supported_architectures())


def test_loading_a_checkpoint_of_unknown_architecture_names_it(tiny_checkpoint, tmp_path) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    config_text = (checkpoint / "config.json").read_text().replace("LlamaForCausalLM", "FancyNewForCausalLM")
    for item in checkpoint.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    (tmp_path / "config.json").write_text(config_text)
    with pytest.raises(ValueError, match="'FancyNewForCausalLM' is not supported.*LlamaForCausalLM"):
        ModelRunner(ModelConfig.from_pretrained(str(tmp_path)), CacheConfig(num_blocks=4), DeviceConfig("cpu"))
