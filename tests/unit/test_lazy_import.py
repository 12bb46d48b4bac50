"""utils/lazy_import.py: "module:attribute" targets resolve on use; malformed ones name the target."""

from __future__ import annotations

import pytest

from rapid_llm.utils.lazy_import import import_target, is_target


def test_a_target_resolves_to_its_attribute() -> None:
    from rapid_llm.utils.block_hash import hash_block

    assert import_target("rapid_llm.utils.block_hash:hash_block") is hash_block


@pytest.mark.parametrize("target", ["rapid_llm.utils.block_hash", ":hash_block", "rapid_llm.utils.block_hash:"])
def test_a_malformed_target_is_refused_by_name(target: str) -> None:
    with pytest.raises(ValueError, match="is not a 'module:attribute' target"):
        import_target(target)


def test_a_missing_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        import_target("rapid_llm.utils.block_hash:no_such_name")


def test_the_shape_check_matches_what_import_target_accepts() -> None:
    for text, shaped in (("a.b:c", True), ("a.b", False), (":c", False), ("a:", False), (None, False), (3, False)):
        assert is_target(text) is shaped
