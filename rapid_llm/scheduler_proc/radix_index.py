"""The radix tree prefix index (`--prefix-cache-policy radix`): blocks as tree nodes, hits to the token.

A node is one KV block: a full block is keyed under its parent by its chained hash (so a run of full blocks is
matched as fast as in the hash table), a partly filled block -- the tail a request left when it ended -- hangs
under its parent as a leaf. Children are also indexed by their first token, so that a prompt which leaves the
cached path inside a block still finds the cached block sharing the longest run of its tokens: that is a
token-granular hit, served by copying the block (copy-on-write: the new request writes its own tokens into the
copy, the cached block stays as it is). Key design choice: only leaves are evictable -- an unreferenced block
with no cached child -- so a prefix is always evicted from its tail and no cached block is ever stranded behind
an evicted one (the hash table's failure mode); a parent becomes evictable when its last child goes.
Usage: through `BlockManager` (built by `make_index("radix", ...)`); `PrefixCache` offers partial blocks with
`keep_partial` and asks `match_partial` at admission.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rapid_llm.scheduler_proc.cache_index import CacheIndex
from rapid_llm.utils.block_hash import BlockHash


@dataclass(eq=False, slots=True)
class _Node:
    block: int
    tokens: tuple[int, ...]
    parent: _Node | None
    block_hash: BlockHash | None  # None: a partly filled block (always a leaf)
    written_by: int  # the step that writes its KV at the latest
    children: dict[BlockHash, _Node] = field(default_factory=dict)
    partials: list[_Node] = field(default_factory=list)
    by_first_token: dict[int, list[_Node]] = field(default_factory=dict)  # children and partials

    @property
    def is_leaf(self) -> bool:
        return not self.children and not self.partials

    def attach(self, child: _Node) -> None:
        if child.block_hash is None:
            self.partials.append(child)
        else:
            self.children[child.block_hash] = child
        self.by_first_token.setdefault(child.tokens[0], []).append(child)

    def detach(self, child: _Node) -> None:
        if child.block_hash is None:
            self.partials.remove(child)
        else:
            del self.children[child.block_hash]
        siblings = self.by_first_token[child.tokens[0]]
        siblings.remove(child)
        if not siblings:
            del self.by_first_token[child.tokens[0]]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RadixIndex(CacheIndex):
    """A tree of cached blocks; only unreferenced leaves are evictable."""

    partial_hits = True

    def __init__(self, num_blocks: int, eviction: str = "lru") -> None:
        super().__init__(num_blocks, eviction)
        self._roots: dict[str | None, _Node] = {}
        self._nodes: dict[int, _Node] = {}
        self._by_hash: dict[BlockHash, _Node] = {}
        self._locked = [False] * num_blocks
        self._num_unlocked = 0
        self._stamp = 0
        self._settled = -1

    @property
    def num_unreferenced(self) -> int:
        # Inner blocks count too: they become leaves as their subtrees are evicted.
        return self._num_unlocked

    def holds(self, block: int) -> bool:
        return block in self._nodes

    def hash_of(self, block: int) -> BlockHash | None:
        node = self._nodes.get(block)
        return None if node is None else node.block_hash

    def insert(self, block: int, block_hash: BlockHash, parent: BlockHash | None, tokens: Sequence[int],
               start: int, namespace: str | None = None) -> None:
        if block in self._nodes:
            raise ValueError(f"KV block {block} is cached already")
        parent_node = self._parent(parent, namespace, create=True)
        # The same content cached twice keeps the first copy; a block whose prefix is gone cannot be matched.
        if block_hash not in self._by_hash and parent_node is not None:
            self._by_hash[block_hash] = self._add(block, tuple(tokens), parent_node, block_hash, start)

    def insert_partial(self, block: int, parent: BlockHash | None, tokens: Sequence[int], start: int,
                       namespace: str | None = None) -> bool:
        parent_node = self._parent(parent, namespace, create=True)
        if not tokens or block in self._nodes or parent_node is None:
            return False
        tokens = tuple(tokens)
        siblings = parent_node.by_first_token.get(tokens[0], ())
        if any(sibling.tokens[:len(tokens)] == tokens for sibling in siblings):
            return False  # a sibling holds these tokens already
        self._add(block, tokens, parent_node, None, start)
        return True

    def cached_block(self, block_hash: BlockHash) -> int | None:
        node = self._by_hash.get(block_hash)
        return None if node is None else node.block

    def match_partial(self, parent: BlockHash | None, tokens: Sequence[int],
                      namespace: str | None = None) -> tuple[int, int] | None:
        parent_node = self._parent(parent, namespace)
        if not tokens or parent_node is None:
            return None
        best: tuple[int, int] | None = None
        for node in parent_node.by_first_token.get(tokens[0], ()):
            if node.written_by <= self._settled:
                length = _common_prefix(node.tokens, tokens)
                if best is None or length > best[1]:
                    best = (node.block, length)
        return best

    def stamp(self, step_id: int) -> None:
        self._stamp = step_id

    def settle(self, step_id: int) -> None:
        self._settled = step_id

    def lock(self, block: int) -> None:
        self._locked[block] = True
        self._num_unlocked -= 1
        super().lock(block)

    def unlock(self, block: int) -> None:
        self._locked[block] = False
        self._num_unlocked += 1
        if self._nodes[block].is_leaf:
            self.queue.push(block)

    def evict(self) -> list[int]:
        if len(self.queue):
            return super().evict()
        # Every unreferenced block is above a referenced one (a block cached under its copy's hash while that copy
        # was in use): evict one with its subtree, whose referenced blocks just stop being cached.
        victim = next(node for node in self._nodes.values() if not self._locked[node.block])
        self.num_evictions += 1
        self._evicting(victim.block)
        return self.remove(victim.block)

    def remove(self, block: int) -> list[int]:
        node = self._nodes.get(block)
        if node is None:
            return []
        removed, stack = [], [node]
        while stack:
            current = stack.pop()
            stack.extend(current.children.values())
            stack.extend(current.partials)
            self.queue.remove(current.block)
            self._drop(current)
            removed.append(current.block)
        self._detach(node)
        return removed

    def reset(self) -> None:
        for block in self._nodes:
            self.queue.remove(block)
        self._num_unlocked = 0
        self._roots.clear()
        self._nodes.clear()
        self._by_hash.clear()

    def _parent(self, parent: BlockHash | None, namespace: str | None, create: bool = False) -> _Node | None:
        if parent is not None:
            return self._by_hash.get(parent)
        # One root per namespace: a first block's tokens alone do not say whose KV it holds (LoRA adapters).
        root = self._roots.get(namespace)
        if root is None and create:
            root = self._roots[namespace] = _Node(-1, (), None, None, 0)
        return root

    def _add(self, block: int, tokens: tuple[int, ...], parent: _Node, block_hash: BlockHash | None,
             start: int) -> _Node:
        """A new node for a block in use (locked); its parent stops being a leaf."""
        node = _Node(block, tokens, parent, block_hash, self._stamp)
        parent.attach(node)
        if parent.block >= 0:
            self.queue.remove(parent.block)
        self._nodes[block] = node
        self._locked[block] = True
        self.queue.reset(block, start, len(tokens))
        return node

    def _forget(self, block: int) -> None:
        node = self._nodes[block]
        self._drop(node)
        self._detach(node)

    def _drop(self, node: _Node) -> None:
        if not self._locked[node.block]:
            self._num_unlocked -= 1
        del self._nodes[node.block]
        if node.block_hash is not None:
            del self._by_hash[node.block_hash]

    def _detach(self, node: _Node) -> None:
        """Unhook `node` from its parent, which becomes evictable if that made it an unreferenced leaf."""
        parent = node.parent
        parent.detach(node)
        if parent.block >= 0 and parent.is_leaf and not self._locked[parent.block]:
            self.queue.push(parent.block)
