"""AFDConfig: attention-FFN disaggregation, `--afd-config '{"num_ffn_ranks": 2}'`.

The replica's TP ranks become attention ranks (KV cache, scheduler plans, sampling) and `num_ffn_ranks` more ranks,
without KV cache or scheduler, compute every MoE layer's FFN (router, experts, shared experts; split over the FFN
ranks by TP, or partitioned with `--enable-expert-parallel`). The JSON object follows the shape vLLM's AFD work
gives its attention/FFN split (`num_ffn_ranks`, there `afd_size` "1A2F"); the launcher starts both kinds of rank, so
no role flag is needed. Checked at start (`ServerArgs`): MoE architectures of the Llama-family stack only, and not
with PP, DCP/PCP, DP, multi-node, speculation, LoRA, KV transfer, EPLB or quantization.
Usage: `AFDConfig.parse('{"num_ffn_ranks": 1}')`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rapid_llm.config.json_flag import convert_json_flag

FLAG = "--afd-config"


class AFDConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    num_ffn_ranks: int = 1

    def __post_init__(self) -> None:
        if self.num_ffn_ranks < 1:
            raise ValueError(f"num_ffn_ranks must be at least 1, got {self.num_ffn_ranks}")

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> AFDConfig | None:
        return None if value is None else convert_json_flag(value, cls, FLAG)
