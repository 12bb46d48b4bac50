"""What the expert-parallel rank tests share: random stacked expert weights (checkpoint layout) and inputs, and
loading them into an experts layer through its weight_loader, one checkpoint matrix at a time as the loader does."""

from __future__ import annotations

import torch

EXPERTS, HIDDEN, INTERMEDIATE, TOP_K = 4, 16, 8, 2


def expert_tensors(seed: int, tokens: int) -> dict[str, torch.Tensor]:
    """gate/up [E, I, H], down [E, H, I], hidden states x [tokens, H] and routing weights w [tokens, k]."""
    generator = torch.Generator().manual_seed(seed)
    return {"gate": torch.randn(EXPERTS, INTERMEDIATE, HIDDEN, generator=generator),
            "up": torch.randn(EXPERTS, INTERMEDIATE, HIDDEN, generator=generator),
            "down": torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=generator),
            "x": torch.randn(tokens, HIDDEN, generator=generator), "w": torch.rand(tokens, TOP_K, generator=generator)}


def load_experts(experts: torch.nn.Module, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """Load every expert of `t` into `experts`, prepare it, and return the full w13 [E, 2I, H] for the reference."""
    for expert in range(EXPERTS):
        for shard in ("gate", "up"):
            experts.weight_loader(experts.w13_weight, t[shard][expert], (expert, shard))
        experts.weight_loader(experts.w2_weight, t["down"][expert], (expert, "down"))
    experts.prepare_weights()
    return torch.cat((t["gate"], t["up"]), dim=1)
