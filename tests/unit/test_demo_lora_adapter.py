"""The packaged demo LoRA adapter is a PEFT adapter folder that fits the packaged demo target, module by module.

Reads only adapter_config.json and the two safetensors files (no training); the last test also loads the adapter
with PEFT, when it is installed (it is not a rapid_llm dependency; tools/demo_model/train_lora.py needs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

DEMO_MODELS = Path(__file__).resolve().parents[2] / "rapid_llm" / "demo_models"
ADAPTER = DEMO_MODELS / "lora-tkinter"
BASE = DEMO_MODELS / "target"
TARGET_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
RANK, ALPHA = 8, 16
PEFT_PREFIX = "base_model.model."


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(path, framework="pt") as file:
        return {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}


def test_folder_holds_exactly_the_peft_files_and_is_small() -> None:
    files = {path.name: path.stat().st_size for path in ADAPTER.iterdir()}
    assert set(files) == {"adapter_config.json", "adapter_model.safetensors"}
    assert sum(files.values()) < 2 * 2**20


def test_config_is_plain_lora_of_rank_8_on_every_projection() -> None:
    config = json.loads((ADAPTER / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    assert set(config["target_modules"]) == TARGET_MODULES
    assert config["base_model_name_or_path"] == "demo-target"
    assert not (config["use_dora"] or config["use_rslora"] or config["modules_to_save"] or config["rank_pattern"]
                or config["alpha_pattern"] or config["fan_in_fan_out"])
    assert config["bias"] == "none"


def test_every_target_linear_of_the_base_has_an_a_and_b_of_its_shape() -> None:
    base = _shapes(BASE / "model.safetensors")
    expected = {}
    for name, (out_features, in_features) in ((n, s) for n, s in base.items() if len(s) == 2):
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in TARGET_MODULES:
            expected[f"{PEFT_PREFIX}{module}.lora_A.weight"] = (RANK, in_features)
            expected[f"{PEFT_PREFIX}{module}.lora_B.weight"] = (out_features, RANK)
    num_layers = json.loads((BASE / "config.json").read_text())["num_hidden_layers"]
    assert len(expected) == 2 * len(TARGET_MODULES) * num_layers
    assert _shapes(ADAPTER / "adapter_model.safetensors") == expected


def test_weights_are_finite_bf16_and_trained() -> None:
    with safe_open(ADAPTER / "adapter_model.safetensors", framework="pt") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    assert {tensor.dtype for tensor in tensors.values()} == {torch.bfloat16}
    assert all(torch.isfinite(tensor).all() for tensor in tensors.values())
    # PEFT initialises every B to zero: a B still zero would be a module the training never changed.
    assert all(tensor.abs().max() > 0 for name, tensor in tensors.items() if ".lora_B." in name)


def test_peft_loads_it_onto_the_target_and_it_changes_the_logits() -> None:
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, ADAPTER).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(BASE)
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer("class Foo(Widget):", add_special_tokens=False).input_ids]])
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    assert adapted.shape == plain.shape and (adapted - plain).abs().max() > 0.1
