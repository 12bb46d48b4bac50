"""Benchmark workloads: random (vLLM's), generated-shared-prefix (SGLang's), ShareGPT and custom JSONL.

Key design choice: the random, ShareGPT and custom generators reproduce vLLM 0.32's sampling -- the
same length ranges, the same draws from the same seeded generators in the same order, the same
filters -- so that `--seed` and the length flags select the very prompts `vllm bench serve` sends;
generated-shared-prefix follows SGLang's construction. Each generator owns its seeded RNG; none
touches global random state.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# vLLM's ShareGPT filter (vllm/benchmarks/datasets/utils.py: is_valid_sequence).
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT_LEN = 1024
SHAREGPT_MAX_TOTAL_LEN = 2048
# Decode/re-encode rounds before a random prompt's length is accepted as it is (vLLM's max_retry).
MAX_LENGTH_FIX_ROUNDS = 10


@dataclass(frozen=True)
class SampleRequest:
    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a local directory (or the local Hugging Face cache); never downloads."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"cannot load a tokenizer from {name_or_path!r} without downloading ({exc}); "
            "pass --tokenizer with a local directory holding the served model's tokenizer"
        ) from None


def sample_requests(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> list[SampleRequest]:
    """The workload selected by the flags of `add_dataset_args` (and `--seed`)."""
    name = args.dataset_name
    needs_path = name in ("sharegpt", "custom")
    if needs_path and args.dataset_path is None:
        raise ValueError(f"--dataset-name {name} needs --dataset-path")
    if not needs_path and args.dataset_path is not None:
        raise ValueError(f"--dataset-name {name} generates its prompts; --dataset-path is not used")
    output_len = args.output_len
    if name == "random":
        return sample_random(
            tokenizer,
            num_requests=args.num_prompts,
            input_len=args.input_len if args.input_len is not None else args.random_input_len,
            output_len=output_len if output_len is not None else args.random_output_len,
            range_ratio=args.random_range_ratio,
            prefix_len=args.random_prefix_len,
            seed=args.seed,
        )
    if name == "generated-shared-prefix":
        return sample_generated_shared_prefix(
            tokenizer,
            num_groups=args.gsp_num_groups,
            prompts_per_group=args.gsp_prompts_per_group,
            system_prompt_len=args.gsp_system_prompt_len,
            question_len=args.gsp_question_len,
            output_len=args.gsp_output_len,
            seed=args.seed,
        )
    if name == "sharegpt":
        return sample_sharegpt(
            tokenizer,
            path=args.dataset_path,
            num_requests=args.num_prompts,
            output_len=output_len if output_len is not None else args.sharegpt_output_len,
            seed=args.seed,
            shuffle=not args.disable_shuffle,
            oversample=not args.no_oversample,
        )
    if name == "custom":
        return sample_custom(
            tokenizer,
            path=args.dataset_path,
            num_requests=args.num_prompts,
            output_len=output_len if output_len is not None else args.custom_output_len,
            seed=args.seed,
            apply_chat_template=not args.skip_chat_template,
            shuffle=not args.disable_shuffle,
            oversample=not args.no_oversample,
        )
    raise ValueError(f"unknown --dataset-name {name!r}")


def _range_ratios(range_ratio: float | dict[str, float]) -> tuple[float, float]:
    """(input ratio, output ratio) from one number or {"input": ..., "output": ...}."""
    if isinstance(range_ratio, dict):
        if set(range_ratio) != {"input", "output"}:
            raise ValueError(f"--random-range-ratio as an object takes keys input and output, got {range_ratio}")
        ratios = (float(range_ratio["input"]), float(range_ratio["output"]))
    else:
        ratios = (float(range_ratio), float(range_ratio))
    if not all(0.0 <= r < 1.0 for r in ratios):
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    return ratios


def sample_random(
    tokenizer: PreTrainedTokenizerBase,
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float | dict[str, float],
    prefix_len: int,
    seed: int,
) -> list[SampleRequest]:
    """vLLM's RandomDataset: lengths uniform in [L(1-r), L(1+r)], prompts of consecutive vocabulary ids."""
    if num_requests < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {num_requests}")
    input_ratio, output_ratio = _range_ratios(range_ratio)
    if prefix_len < 0:
        raise ValueError(f"--random-prefix-len must be non-negative, got {prefix_len}")
    rng = np.random.default_rng(seed)
    # The server adds these (e.g. BOS) to every prompt, so they count towards the input length.
    real_input_len = max(0, input_len - int(tokenizer.num_special_tokens_to_add()))
    input_low = math.floor(real_input_len * (1 - input_ratio))
    input_high = math.ceil(real_input_len * (1 + input_ratio))
    if prefix_len + input_low < 1:
        raise ValueError("--random-input-len/--random-prefix-len leave prompts with no tokens")
    output_low = max(math.floor(output_len * (1 - output_ratio)), 1)
    output_high = max(math.ceil(output_len * (1 + output_ratio)), 1)

    vocab_size = tokenizer.vocab_size
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    offsets = rng.integers(0, vocab_size, size=num_requests)
    allowed = np.array(sorted(set(range(vocab_size)) - set(tokenizer.all_special_ids)))
    prefix: list[int] = []
    if prefix_len > 0:
        # Normalised like a prompt, so the shared ids are the ones the server will see.
        prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist()
        _, prefix = _decode_to_length(tokenizer, prefix, prefix_len, rng)

    requests = []
    for i in range(num_requests):
        inner = allowed[(offsets[i] + i + np.arange(input_lens[i])) % len(allowed)].tolist()
        prompt, token_ids = _decode_to_length(tokenizer, prefix + inner, prefix_len + int(input_lens[i]), rng)
        requests.append(SampleRequest(prompt, len(token_ids), int(output_lens[i])))
    mismatch = sum(r.prompt_len for r in requests) - prefix_len * num_requests - int(input_lens.sum())
    if mismatch:
        logger.warning("random prompts have %+d tokens in total against their sampled lengths: "
                       "some token runs do not survive decoding and re-encoding (vLLM's prompts neither)", mismatch)
    return requests


def _decode_to_length(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], target_len: int, rng: np.random.Generator
) -> tuple[str, list[int]]:
    """Text whose encoding is `target_len` tokens where the tokenizer allows it (vLLM's procedure).

    Consecutive ids need not survive decode + encode (merges change), so the ids are re-encoded and
    truncated, or padded with random ids, until the length holds or the rounds run out.
    """
    for attempt in range(MAX_LENGTH_FIX_ROUNDS + 1):
        prompt = tokenizer.decode(token_ids)
        token_ids = tokenizer.encode(prompt, add_special_tokens=False)
        if len(token_ids) == target_len or attempt == MAX_LENGTH_FIX_ROUNDS:
            break
        if len(token_ids) < target_len:
            token_ids += rng.integers(0, tokenizer.vocab_size, size=target_len - len(token_ids)).tolist()
        else:
            token_ids = token_ids[:target_len]
    return prompt, token_ids


def sample_generated_shared_prefix(
    tokenizer: PreTrainedTokenizerBase,
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    seed: int,
) -> list[SampleRequest]:
    """SGLang's generated-shared-prefix: `num_groups` random system prompts, each followed by
    `prompts_per_group` random questions, shuffled together.

    As in SGLang the text is decoded from uniformly drawn token ids and `prompt_len` is measured by
    re-encoding; unlike SGLang, special tokens are not drawn, so no prompt carries a stray EOS.
    """
    sizes = {
        "--gsp-num-groups": num_groups,
        "--gsp-prompts-per-group": prompts_per_group,
        "--gsp-system-prompt-len": system_prompt_len,
        "--gsp-question-len": question_len,
        "--gsp-output-len": output_len,
    }
    for flag, value in sizes.items():
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    rng = random.Random(seed)
    vocabulary = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))

    def random_text(num_tokens: int) -> str:
        return tokenizer.decode(rng.choices(vocabulary, k=num_tokens))

    system_prompts = [random_text(system_prompt_len) for _ in range(num_groups)]
    questions = [random_text(question_len) for _ in range(num_groups * prompts_per_group)]
    requests = []
    for group, system_prompt in enumerate(system_prompts):
        for question in questions[group * prompts_per_group : (group + 1) * prompts_per_group]:
            prompt = f"{system_prompt}\n\n{question}"
            requests.append(SampleRequest(prompt, len(tokenizer.encode(prompt)), output_len))
    rng.shuffle(requests)
    return requests


def sample_sharegpt(
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    num_requests: int,
    output_len: int | None,
    seed: int,
    shuffle: bool = True,
    oversample: bool = True,
) -> list[SampleRequest]:
    """vLLM's ShareGPTDataset: first human turn as prompt, first reply's length as output length."""
    if num_requests < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {num_requests}")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} entries")
    entries = [entry for entry in data if len(entry.get("conversations", [])) >= 2]
    if shuffle:
        random.Random(seed).shuffle(entries)
    requests: list[SampleRequest] = []
    for entry in entries:
        if len(requests) >= num_requests:
            break
        prompt = entry["conversations"][0]["value"]
        prompt_len = len(tokenizer(prompt).input_ids)
        reply_len = len(tokenizer(entry["conversations"][1]["value"]).input_ids)
        request_output_len = reply_len if output_len is None else output_len
        too_short = prompt_len < SHAREGPT_MIN_LEN or (output_len is None and reply_len < SHAREGPT_MIN_LEN)
        too_long = (
            prompt_len > SHAREGPT_MAX_PROMPT_LEN or prompt_len + request_output_len > SHAREGPT_MAX_TOTAL_LEN
        )
        if not (too_short or too_long):
            requests.append(SampleRequest(prompt, prompt_len, request_output_len))
    return _oversample(requests, num_requests, seed, oversample, path)


def sample_custom(
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    num_requests: int,
    output_len: int,
    seed: int,
    apply_chat_template: bool = True,
    shuffle: bool = True,
    oversample: bool = True,
) -> list[SampleRequest]:
    """vLLM's CustomDataset: one JSON object per line with a "prompt" (num_requests <= 0: every line).

    As in vLLM, `output_len` applies to every request unless it is -1; then each line must carry its
    own "output_tokens" (here also accepted as "output_len").
    """
    rows = _read_jsonl(path)
    if shuffle:
        random.Random(seed).shuffle(rows)
    if num_requests <= 0:
        num_requests = len(rows)
    if apply_chat_template and tokenizer.chat_template is None:
        raise ValueError("the tokenizer has no chat template; pass --skip-chat-template to send prompts as written")
    requests = []
    for row in rows[:num_requests]:
        prompt = row["prompt"]
        if apply_chat_template:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        request_output_len = row.get("output_tokens", row.get("output_len")) if output_len == -1 else output_len
        if not isinstance(request_output_len, int) or request_output_len < 1:
            raise ValueError(
                f"{path}: output length must be a positive integer (with --custom-output-len -1, from each "
                f"line's output_tokens field), got {request_output_len!r}"
            )
        requests.append(SampleRequest(prompt, len(tokenizer(prompt).input_ids), request_output_len))
    return _oversample(requests, num_requests, seed, oversample, path)


def _read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path}:{number}: each line must be a JSON object with a string 'prompt'")
            rows.append(row)
    return rows


def _oversample(
    requests: list[SampleRequest], num_requests: int, seed: int, oversample: bool, path: str | Path
) -> list[SampleRequest]:
    """Top up to `num_requests` with repeats drawn at random, as vLLM does for short datasets."""
    if not requests:
        raise ValueError(f"{path}: no usable samples")
    if oversample and len(requests) < num_requests:
        rng = random.Random(seed)
        requests = requests + [rng.choice(requests) for _ in range(num_requests - len(requests))]
    return requests
