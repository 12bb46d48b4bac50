"""ForwardBatch: everything one model forward needs, passed down as an argument.

Each cache group (worker_proc/cache_groups.py: a paged group per attention op and KV table, the state group) builds
its metadata once per step; `groups` maps the group name to it and `metadata_for(layer)` hands a layer its own.
`attention` is the first paged group's metadata (positions, sequence index, lengths: what rotary embeddings read),
so a model whose layers all read one group may pass `batch.attention`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import torch

from rapid_llm.ops.attention import AttentionMetadata


class CacheLayer(Protocol):
    @property
    def cache_group(self) -> str: ...


@dataclass
class ForwardBatch:
    """Flat tokens of a mixed prefill/decode step and their cache groups' metadata."""

    input_ids: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    # Cache group name -> its metadata for this step; empty for a batch of one paged group (a draft model's).
    groups: Mapping[str, Any] = field(default_factory=dict)
    # Pipeline stages after the first: the previous stage's [2, num_tokens, hidden] hidden states and residual.
    intermediate: torch.Tensor | None = None
    token_seq_lens: torch.Tensor = field(init=False)  # [num_tokens] length of each token's sequence after the step
    _memo: dict[Any, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.token_seq_lens = self.attention.seq_lens[self.attention.seq_index]

    def metadata_for(self, layer: CacheLayer) -> Any:
        """The step metadata of `layer`'s cache group."""
        if not self.groups:
            return self.attention
        metadata = self.groups.get(layer.cache_group)
        if metadata is None:
            raise ValueError(f"this forward has no metadata for cache group {layer.cache_group!r} (it has "
                             f"{sorted(self.groups)}): the layer was not grouped by the worker")
        return metadata

    def once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` the first time a layer asks for `key` in this forward, the stored result after:
        what depends only on the batch (rotary cos/sin) is built once, not once per layer."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def positions(self) -> torch.Tensor:
        return self.attention.positions
