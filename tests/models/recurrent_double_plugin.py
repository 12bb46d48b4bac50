"""The recurrent test double as an out-of-tree plugin: `RAPID_LLM_PLUGINS=tests.models.recurrent_double_plugin`.

Torch-free, as a plugin module should be (the launcher imports it and otherwise never imports torch): it registers
the architecture by its "module:Class" target, imported only where the model is built (the worker).
"""

from __future__ import annotations

from rapid_llm.models.registry import register_model

register_model("RecurrentDoubleForCausalLM", "tests.models.recurrent_double:RecurrentDoubleForCausalLM")
