"""docs/models/README.md is what tools/model_key_tables.py derives from the models' weight mapping today."""

from __future__ import annotations

from tools import model_key_tables


def test_the_key_tables_are_up_to_date() -> None:
    assert model_key_tables.main(["--check"]) == 0, "run python tools/model_key_tables.py and commit the result"


def test_a_stacked_and_an_expert_row_read_as_the_loader_maps_them() -> None:
    text = model_key_tables.OUTPUT.read_text()
    assert "| `model.layers.{L}.self_attn.k_proj.weight` | `model.layers.{L}.self_attn.qkv_proj.weight` | k |" in text
    assert ("| `model.layers.{L}.block_sparse_moe.experts.{e}.w3.weight` | `model.layers.{L}.mlp.experts.w13_weight` "
            "| ({e}, up) |") in text
