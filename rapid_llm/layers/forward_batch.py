"""ForwardBatch: everything one model forward needs, passed down as an argument."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rapid_llm.ops.attention import AttentionMetadata


@dataclass
class ForwardBatch:
    """Flat tokens of a mixed prefill/decode step and their attention metadata."""

    input_ids: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    token_seq_lens: torch.Tensor = field(init=False)  # [num_tokens] length of each token's sequence after the step

    def __post_init__(self) -> None:
        self.token_seq_lens = self.attention.seq_lens[self.attention.seq_index]

    @property
    def positions(self) -> torch.Tensor:
        return self.attention.positions
