"""NemotronH's block types: "moe" blocks are refused when the model is built, naming the block type.

Logits and greedy tokens are checked in tests/models/test_hf_parity.py, serving in tests/models/test_hybrid_serving.py.
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm.models.nemotron_h import NemotronHForCausalLM
from rapid_llm.utils.tiny_checkpoint import tiny_config


def test_moe_blocks_are_refused_naming_the_block_type() -> None:
    config = tiny_config("NemotronHForCausalLM", layers_block_type=["linear_attention", "moe"],
                         n_routed_experts=4, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32)
    with torch.device("meta"), pytest.raises(ValueError, match="NemotronH 'moe' blocks .* are not supported"):
        NemotronHForCausalLM(config)
