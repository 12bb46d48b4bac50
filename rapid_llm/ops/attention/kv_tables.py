"""KV tables: which block table each paged layer reads, so sliding-window layers give back the blocks their window
has passed while full-attention layers keep every block (vLLM's hybrid KV-cache groups over one block pool).

Key design choice: one pool of block ids, one page size. Layers with the same window are cut, in layer order, into
tables of G layers, G the greatest common divisor of the layer counts per window; layer j of every table shares
the j-th cache tensor, so a block id costs G layers' pages whichever table holds it. A table keeps one block id
per block of positions (every table grows in step); a windowed table's blocks behind its window go back to the
pool. Table 0 is a full-attention one when there is any. One table, every layer with its own tensor, when the
windows agree or when the layers' pages differ (MLA, DeepSeek-V4, mixed head shapes): its window is then the
longest when every layer has one, else None.
Usage: `tables = kv_tables(specs)`; `tables.windows[t]`, `tables.table_of[i]`, `tables.tensor_of[i]` for specs[i].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from rapid_llm.ops.attention.kv_cache_spec import FullAttentionSpec, KVCacheSpec


@dataclass(frozen=True)
class KVTables:
    windows: tuple[int | None, ...]  # per table: its layers' attention window (None: the whole context)
    table_of: tuple[int, ...]  # per layer: the block table it reads
    tensor_of: tuple[int, ...]  # per layer: the cache tensor it is bound to (shared across tables)

    @property
    def num_tables(self) -> int:
        return len(self.windows)

    @property
    def num_tensors(self) -> int:
        return max(self.tensor_of, default=-1) + 1


def _window(spec: KVCacheSpec) -> int | None:
    return spec.sliding_window if isinstance(spec, FullAttentionSpec) else None


def _page(spec: KVCacheSpec) -> tuple:
    """What must agree for two layers to share a tensor: the layout, whatever the window."""
    return (type(spec), spec.dtype, spec.page_shape(1, 1))


def kv_tables(specs: Sequence[KVCacheSpec]) -> KVTables:
    """Split the paged layers (their `specs`, in layer order) into block tables."""
    windows = [_window(spec) for spec in specs]
    distinct = sorted(set(windows), key=lambda window: -1 if window is None else window)
    if len(distinct) < 2 or len({_page(spec) for spec in specs}) > 1:
        window = None if not windows or None in windows else max(windows)
        return KVTables((window,), (0,) * len(specs), tuple(range(len(specs))))
    size = math.gcd(*(windows.count(window) for window in distinct))
    table_windows: list[int | None] = []
    table_of, tensor_of = [0] * len(specs), [0] * len(specs)
    for window in distinct:
        members = [index for index, layer_window in enumerate(windows) if layer_window == window]
        for start in range(0, len(members), size):
            for position, index in enumerate(members[start : start + size]):
                table_of[index], tensor_of[index] = len(table_windows), position
            table_windows.append(window)
    return KVTables(tuple(table_windows), tuple(table_of), tuple(tensor_of))
