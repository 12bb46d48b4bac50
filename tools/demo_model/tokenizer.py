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
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rapid_llm.utils.tiny_checkpoint import BOS_TOKEN, EOS_TOKEN, IM_END_TOKEN, IM_START_TOKEN, PAD_TOKEN, \
    SPECIAL_TOKENS
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
    tokenizer = Tokenizer(models.BPE())
    # ByteLevel's regex keeps runs of spaces together, so indentation becomes a few whole tokens.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        # The cleanup rewrites " ." as "." and the like, which breaks decode(encode(text)) == text.
        clean_up_tokenization_spaces=False,
    )
    # The template goes into tokenizer_config.json (not chat_template.jinja), where every
    # transformers version and other runtimes look for it.
    hf_tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    return hf_tokenizer


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
