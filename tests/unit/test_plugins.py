"""Out-of-tree plugins: RAPID_LLM_PLUGINS imports its modules in order, and `register_model` serves a new
architecture (in a copy of the model registry, so no other test sees it)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from torch import nn

from rapid_llm.models import registry
from rapid_llm.utils.plugins import PLUGINS_ENV, load_plugins, plugin_modules


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_MODELS", copy.deepcopy(registry._MODELS))


class PluginModel(nn.Module):
    pass


def test_plugin_modules_are_split_on_commas() -> None:
    assert plugin_modules(" first, ,second.module ,") == ["first", "second.module"]
    assert plugin_modules("") == []


def test_every_named_module_is_imported_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["rapid_llm_test_plugin_a", "rapid_llm_test_plugin_b"]
    (tmp_path / "rapid_llm_test_plugin_log.py").write_text("imported = []\n")
    for name in names:
        (tmp_path / f"{name}.py").write_text(f"import rapid_llm_test_plugin_log\n"
                                             f"rapid_llm_test_plugin_log.imported.append({name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_ENV, f"{names[1]}, {names[0]}")
    try:
        load_plugins()
        load_plugins()  # a second call imports nothing again
        assert sys.modules["rapid_llm_test_plugin_log"].imported == [names[1], names[0]]
    finally:
        for name in [*names, "rapid_llm_test_plugin_log"]:
            sys.modules.pop(name, None)


def test_a_module_that_fails_to_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGINS_ENV, "rapid_llm_no_such_plugin")
    with pytest.raises(ValueError, match="RAPID_LLM_PLUGINS names 'rapid_llm_no_such_plugin', which failed to "
                                         "import: ModuleNotFoundError"):
        load_plugins()


def test_register_model_serves_a_new_architecture(models: None) -> None:
    with pytest.raises(ValueError, match="'PluginForCausalLM' is not supported"):
        registry.check_supported("PluginForCausalLM")
    registry.register_model("PluginForCausalLM", f"{__name__}:PluginModel")
    registry.register_model("OtherPluginForCausalLM", PluginModel)
    assert registry.resolve_model_class("PluginForCausalLM") is PluginModel
    assert registry.resolve_model_class("OtherPluginForCausalLM") is PluginModel
    assert "PluginForCausalLM" in registry.supported_architectures()


def test_register_model_refuses_taken_names_and_bad_targets(models: None) -> None:
    with pytest.raises(ValueError, match="'LlamaForCausalLM' is registered already"):
        registry.register_model("LlamaForCausalLM", f"{__name__}:PluginModel")
    with pytest.raises(ValueError, match="'module:Class' string or the class itself"):
        registry.register_model("PluginForCausalLM", "no_colon_here")
    with pytest.raises(ValueError, match="architecture name"):
        registry.register_model("", PluginModel)
