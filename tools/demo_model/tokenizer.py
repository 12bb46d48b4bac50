"""The demo models' tokenizer: a byte-level BPE trained on the train split, saved as an HF folder.

Key design choice: the special tokens and their ids (0-4) are those of ``rapid_llm.utils.tiny_checkpoint``
and the folder is written by ``PreTrainedTokenizerFast.save_pretrained`` as there, so
``AutoTokenizer.from_pretrained(dir)`` loads it unchanged. No post-processor adds BOS/EOS: encoding
is lossless (``decode(encode(x)) == x``) and the chat template writes the special tokens itself.
The template renders system/user/assistant/tool turns; given ``tools``, it lists them as JSON lines
in the system turn (the block tool calling will parse against later).

Usage:
    python -m tools.demo_model.tokenizer [--out tools/demo_model/artifacts/tokenizer] [--vocab-size 8192]
"""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Iterable

import transformers

from rapid_llm.utils.tiny_checkpoint import train_byte_level_bpe
from tools.demo_model import data

ARTIFACT_DIR = pathlib.Path(__file__).resolve().parent / "artifacts" / "tokenizer"
VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 2048

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- endif %}"
    "{%- if system or tools %}"
    "{{- '<|im_start|>system\n' + system }}"
    "{%- if tools %}"
    "{{- ('\n\n' if system else '') + '# Tools\n<tools>\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\n' }}{%- endfor %}"
    "{{- '</tools>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['user', 'assistant', 'tool'] %}"
    "{{- raise_exception('Unsupported chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = VOCAB_SIZE,
                    model_max_length: int = MODEL_MAX_LENGTH) -> transformers.PreTrainedTokenizerFast:
    """Train the BPE on ``texts`` (one item per file), save it to ``out_dir`` and return it."""
    return train_byte_level_bpe(texts, out_dir, vocab_size, CHAT_TEMPLATE, model_max_length)


def chars_per_token(tokenizer: transformers.PreTrainedTokenizerBase, texts: Iterable[str]) -> float:
    texts = list(texts)
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return sum(map(len, texts)) / sum(len(encoding.ids) for encoding in encodings)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdlib", type=pathlib.Path, default=data.DEFAULT_STDLIB)
    parser.add_argument("--out", type=pathlib.Path, default=ARTIFACT_DIR)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    train_texts = data.load_train(args.stdlib).values()
    tokenizer = train_tokenizer(train_texts, args.out, args.vocab_size)
    ratio = chars_per_token(tokenizer, data.load_held_out().values())
    print(f"vocab {len(tokenizer)} tokens, {ratio:.2f} chars/token on held-out, saved to {args.out}")


if __name__ == "__main__":
    main()
