"""ForwardBatch: everything one model forward needs, passed down as an argument."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rapid_llm.ops.attention import AttentionMetadata


@dataclass
class ForwardBatch:
    """Flat tokens of a mixed prefill/decode step and their attention metadata."""

    input_ids: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    token_seq_lens: torch.Tensor = field(init=False)  # [num_tokens] length of each token's sequence after the step
    _memo: dict[Any, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.token_seq_lens = self.attention.seq_lens[self.attention.seq_index]

    def once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` the first time a layer asks for `key` in this forward, the stored result after:
        what depends only on the batch (rotary cos/sin) is built once, not once per layer."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def positions(self) -> torch.Tensor:
        return self.attention.positions
