"""SpeculativeConfig: `--speculative-config '{"method": "ngram", ...}'` (vLLM's spelling), parsed and checked once.

A frozen msgspec Struct so it rides inside `SchedulerConfig` to the scheduler process (the n-gram proposer)
and to the worker (model proposers: `model` is the draft checkpoint directory or a demo name). Unknown fields, wrong types and out-of-range values are start-up errors naming the field;
the method is checked against the proposer registry (`spec_decode/registry.py`) by `ServerArgs`.

Usage:
    config = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
"""

from __future__ import annotations

from typing import Any

import msgspec

from rapid_llm.config.json_flag import convert_json_flag

FLAG = "--speculative-config"


class SpeculativeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How many tokens to draft per decode step and where drafts come from (`method`)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1  # shortest n-gram matched (ngram)
    prompt_lookup_max: int = 4  # longest n-gram matched, tried first (ngram)
    model: str | None = None  # the draft checkpoint: a directory or a demo name such as demo-draft (draft_model)
    # Adaptive off (spec_decode/adaptive.py): a request whose acceptance over its last `acceptance_window`
    # draft opportunities (a step without drafts: all rejected) is below `acceptance_threshold` (0 turns this
    # off) stops drafting for `probe_after_tokens` plain tokens (doubling after each failed probe).
    # dspark: cut a proposal where the confidence head's predicted prefix acceptance falls below this (DeepSpec's
    # name; 0 keeps every draft).
    confidence_threshold: float = 0.0
    acceptance_threshold: float = 0.1
    acceptance_window: int = 8
    probe_after_tokens: int = 64
    # The speed gate (spec_decode/speed_gate.py): speculation on vs off compared over windows of this many
    # decode-only steps; the faster is kept. 0 turns the gate off.
    speed_check_window: int = 64

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1], got {self.confidence_threshold}")
        if not 0.0 <= self.acceptance_threshold <= 1.0:
            raise ValueError(f"acceptance_threshold must be in [0, 1], got {self.acceptance_threshold}")
        if self.acceptance_window < 1:
            raise ValueError(f"acceptance_window must be at least 1, got {self.acceptance_window}")
        if self.probe_after_tokens < 1:
            raise ValueError(f"probe_after_tokens must be at least 1, got {self.probe_after_tokens}")
        if self.speed_check_window < 0:
            raise ValueError(f"speed_check_window must be 0 (off) or more, got {self.speed_check_window}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be at least 1, got {self.num_speculative_tokens}")
        if self.prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min must be at least 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max ({self.prompt_lookup_max}) must be at least "
                             f"prompt_lookup_min ({self.prompt_lookup_min})")
        if self.method in ("draft_model", "draft") and not self.model:
            raise ValueError(f"method {self.method!r} needs \"model\": the draft checkpoint directory or demo name")

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """A JSON object (the flag) or a dict (the offline `LLM`); None leaves speculation off."""
        if value is None:
            return None
        return convert_json_flag(value, cls, FLAG)
