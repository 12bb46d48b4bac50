"""load_tokenizer: the Hugging Face tokenizer (frontend, offline LLM), loaded without torch when possible.

`AutoTokenizer` imports torch (through transformers' model auto-mapping); `PreTrainedTokenizerFast`
does not, and builds the same tokenizer from tokenizer.json plus tokenizer_config.json (special
tokens, chat template). A directory without tokenizer.json, or custom tokenizer code
(--trust-remote-code), still goes through `AutoTokenizer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    if (Path(path) / "tokenizer.json").is_file() and not trust_remote_code:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
