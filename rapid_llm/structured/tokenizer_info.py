"""The vocabulary xgrammar compiles grammars against, built once per worker from the model's tokenizer.

Key design choice: the size is the model's logits width (config.json vocab_size), which may exceed the
tokenizer's (padded embeddings); xgrammar then never allows the ids past the tokenizer, and the bitmask
has one bit per logit. The stop tokens are the model's EOS ids (generation_config.json), so a matcher
allows EOS exactly where the grammar is complete and the scheduler's normal EOS handling finishes the
request there.
Usage: `info = build_tokenizer_info("/path/to/tokenizer", vocab_size=32000, eos_token_ids=(2,))`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rapid_llm.utils.tokenizer_loading import load_tokenizer

if TYPE_CHECKING:
    import xgrammar


def build_tokenizer_info(tokenizer_dir: str, vocab_size: int, eos_token_ids: Sequence[int],
                         trust_remote_code: bool = False) -> xgrammar.TokenizerInfo:
    import xgrammar

    tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"the tokenizer at {tokenizer_dir} has {len(tokenizer)} tokens, more than the model's "
                         f"{vocab_size} logits; structured output needs a bit per token")
    if not eos_token_ids:
        raise ValueError("structured output needs the model's EOS token id (generation_config.json or "
                         "config.json eos_token_id) to end a completed grammar")
    return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                   stop_token_ids=list(eos_token_ids))
