"""Content hashes of full KV blocks, chained so that one hash stands for a block and its whole prefix.

Key design choice: a block's hash covers its parent block's hash, its token ids and an optional
extra key (anything besides the tokens that changes the KV, such as a LoRA adapter id), so equal
hashes mean equal KV. SHA-256 keeps a collision -- which would silently serve another prompt's
KV -- out of reach even for crafted prompts, at about a microsecond per block.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import sha256

BlockHash = bytes

_ROOT = bytes(32)  # the parent of a sequence's first block
_NO_EXTRA_KEY = b"\x00"
_EXTRA_KEY = b"\x01"


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_key: str | None) -> BlockHash:
    """The hash of a full block holding `token_ids`, after the block whose hash is `parent` (None: first)."""
    digest = sha256(_ROOT if parent is None else parent)
    if extra_key is None:
        digest.update(_NO_EXTRA_KEY)
    else:
        key = extra_key.encode()
        # Length-prefixed, so that no key's bytes can read as the start of the token ids.
        digest.update(_EXTRA_KEY + len(key).to_bytes(8, "little") + key)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()
