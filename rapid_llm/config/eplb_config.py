"""EPLBConfig: `--eplb-config '{"num_redundant_experts": 2, "window_size": 1000, "step_interval": 3000}'`.

vLLM's current spelling (its older `--num-redundant-experts` flag is folded into this object); it takes
effect with `--enable-eplb`, which needs `--enable-expert-parallel`. A frozen msgspec Struct: unknown
fields, wrong types and out-of-range values are start-up errors naming the field. The balancer that uses
it is rapid_llm/distributed/eplb.py.
Usage: `EPLBConfig.parse('{"num_redundant_experts": 2}')`.
"""

from __future__ import annotations

from typing import Any

import msgspec

FLAG = "--eplb-config"


class EPLBConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Redundant expert slots per MoE layer and how often their placement is recomputed."""

    num_redundant_experts: int = 0  # extra physical slots per layer, filled with copies of hot experts
    window_size: int = 1000  # forward steps of per-expert load the rebalancing looks at
    step_interval: int = 3000  # forward steps between two rebalancings

    def __post_init__(self) -> None:
        if self.num_redundant_experts < 0:
            raise ValueError(f"num_redundant_experts must be at least 0, got {self.num_redundant_experts}")
        if self.window_size < 1 or self.step_interval < 1:
            raise ValueError(f"window_size and step_interval must be at least 1, got {self.window_size} and "
                             f"{self.step_interval}")

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> EPLBConfig:
        """A JSON object (the flag) or a dict (the offline `LLM`); None gives the defaults."""
        try:
            if value is None:
                return cls()
            return msgspec.json.decode(value, type=cls) if isinstance(value, str) else msgspec.convert(value, cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            raise ValueError(f"{FLAG}: {error}") from None
