"""Refusing flag combinations at start, one line naming both flags and the reason (ServerArgs and the configs)."""

from __future__ import annotations


def refuse_combinations(flag: str, refusals: list[tuple[bool, str, str]]) -> None:
    """Raise for the first (refused, other flag, why) that holds."""
    for refused, other, why in refusals:
        if refused:
            raise ValueError(f"{flag} with {other}: {why}; drop one of the flags")
