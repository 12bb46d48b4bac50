"""Workload generators on the project's local byte-level BPE tokenizer (vocabulary 512; nothing downloaded)."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.common.args import add_dataset_args, add_result_args
from benchmarks.common.datasets import (
    load_tokenizer,
    sample_custom,
    sample_generated_shared_prefix,
    sample_random,
    sample_requests,
    sample_sharegpt,
)
from rapid_llm.utils.tiny_checkpoint import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return load_tokenizer(str(tokenizer_dir))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dataset_args(parser)
    add_result_args(parser)
    return parser.parse_args(list(argv))


def encoded_len(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_random_lengths_span_the_range_ratio(tokenizer) -> None:
    requests = sample_random(tokenizer, 64, input_len=40, output_len=10, range_ratio=0.5, prefix_len=0, seed=0)
    outputs = [r.expected_output_len for r in requests]
    inputs = [r.prompt_len for r in requests]
    assert all(5 <= n <= 15 for n in outputs)
    # vLLM's current meaning: [L(1-r), L(1+r)] -- so lengths above L occur, unlike the old [L*r, L].
    assert max(outputs) > 10 and min(outputs) < 10
    assert min(inputs) >= 20 and max(inputs) > 40
    # prompt_len is the prompt's real length in this tokenizer.
    assert all(r.prompt_len == encoded_len(tokenizer, r.prompt) for r in requests)


def test_random_fixed_lengths_are_exact(tokenizer) -> None:
    requests = sample_random(tokenizer, 16, input_len=32, output_len=8, range_ratio=0.0, prefix_len=0, seed=1)
    assert [r.expected_output_len for r in requests] == [8] * 16
    assert Counter(r.prompt_len for r in requests).most_common(1)[0][0] == 32


def test_random_prefix_is_shared(tokenizer) -> None:
    with_prefix = sample_random(tokenizer, 8, input_len=16, output_len=4, range_ratio=0.0, prefix_len=24, seed=0)
    shared = os.path.commonprefix([r.prompt for r in with_prefix])
    assert encoded_len(tokenizer, shared) >= 23  # the last prefix token may merge with the first own token
    assert all(r.prompt_len >= 24 + 15 for r in with_prefix)
    without = sample_random(tokenizer, 8, input_len=16, output_len=4, range_ratio=0.0, prefix_len=0, seed=0)
    assert encoded_len(tokenizer, os.path.commonprefix([r.prompt for r in without])) < 3


def test_random_separate_input_and_output_ratios(tokenizer) -> None:
    requests = sample_random(tokenizer, 32, input_len=24, output_len=20, range_ratio={"input": 0.0, "output": 0.5},
                             prefix_len=0, seed=0)
    assert all(10 <= r.expected_output_len <= 30 for r in requests)
    assert len({r.expected_output_len for r in requests}) > 1
    assert Counter(r.prompt_len for r in requests).most_common(1)[0][0] == 24
    args = parse("--random-range-ratio", '{"input": 0.1, "output": 0.2}')
    assert args.random_range_ratio == {"input": 0.1, "output": 0.2}
    assert parse("--random-range-ratio", "0.25").random_range_ratio == 0.25


def test_random_is_seeded(tokenizer) -> None:
    def prompts(seed: int) -> list[str]:
        return [r.prompt for r in sample_random(tokenizer, 8, 32, 8, 0.3, 4, seed)]

    assert prompts(0) == prompts(0)
    assert prompts(0) != prompts(1)


@pytest.mark.parametrize("overrides", [{"range_ratio": 1.0}, {"range_ratio": -0.1}, {"input_len": 0},
                                       {"num_requests": 0}, {"range_ratio": {"input": 0.1}}])
def test_random_rejects_bad_settings(tokenizer, overrides: dict) -> None:
    settings = {"num_requests": 4, "input_len": 16, "output_len": 4, "range_ratio": 0.0, "prefix_len": 0,
                "seed": 0, **overrides}
    with pytest.raises(ValueError):
        sample_random(tokenizer, **settings)


def test_generated_shared_prefix_groups(tokenizer) -> None:
    requests = sample_generated_shared_prefix(tokenizer, num_groups=4, prompts_per_group=3, system_prompt_len=64,
                                              question_len=8, output_len=5, seed=0)
    assert len(requests) == 12
    assert all(r.expected_output_len == 5 for r in requests)
    assert all(r.prompt_len == len(tokenizer.encode(r.prompt)) for r in requests)
    assert len({r.prompt for r in requests}) == 12
    # 64 byte-level tokens are at least 16 characters, and random system prompts differ within 8.
    groups: dict[str, list[str]] = {}
    for r in requests:
        groups.setdefault(r.prompt[:8], []).append(r.prompt)
    assert sorted(len(members) for members in groups.values()) == [3, 3, 3, 3]
    for members in groups.values():
        assert encoded_len(tokenizer, os.path.commonprefix(members)) >= 60
    # Shuffled: the first three requests are not simply one group.
    assert len({r.prompt[:8] for r in requests[:3]}) > 1
    again = sample_generated_shared_prefix(tokenizer, 4, 3, 64, 8, 5, seed=0)
    assert [r.prompt for r in again] == [r.prompt for r in requests]
    assert [r.prompt for r in sample_generated_shared_prefix(tokenizer, 4, 3, 64, 8, 5, seed=1)] != [
        r.prompt for r in requests
    ]


def conversation(human: str, reply: str) -> dict:
    return {"conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": reply}]}


@pytest.fixture
def sharegpt_file(tmp_path: Path) -> Path:
    data = [
        conversation("What is the capital of France, please?", "The capital of France is Paris, of course."),
        conversation("How many days are there in a week?", "There are seven days in a week."),
        conversation("Hi", "A reply long enough to pass the filter."),  # prompt under 4 tokens
        conversation("Please explain what a function is.", "Ok"),  # reply under 4 tokens
        conversation("word " * 1100, "A reply long enough to pass the filter."),  # prompt over 1024 tokens
        {"conversations": [{"from": "human", "value": "A question without any answer at all?"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_filters_like_vllm(tokenizer, sharegpt_file: Path) -> None:
    requests = sample_sharegpt(tokenizer, sharegpt_file, num_requests=2, output_len=None, seed=0)
    assert sorted(r.prompt for r in requests) == [
        "How many days are there in a week?", "What is the capital of France, please?",
    ]
    for r in requests:
        assert r.prompt_len == len(tokenizer(r.prompt).input_ids)
    by_prompt = {r.prompt: r for r in requests}
    assert by_prompt["How many days are there in a week?"].expected_output_len == len(
        tokenizer("There are seven days in a week.").input_ids
    )


def test_sharegpt_fixed_output_len_keeps_short_replies_and_oversamples(tokenizer, sharegpt_file: Path) -> None:
    requests = sample_sharegpt(tokenizer, sharegpt_file, num_requests=7, output_len=3, seed=0)
    assert len(requests) == 7
    assert all(r.expected_output_len == 3 for r in requests)
    # With a fixed output length the short-reply entry is valid too, so three distinct prompts exist.
    assert len({r.prompt for r in requests}) == 3
    assert len(sample_sharegpt(tokenizer, sharegpt_file, 7, 3, seed=0, oversample=False)) == 3


def test_sharegpt_shuffle_is_seeded(tokenizer, sharegpt_file: Path) -> None:
    def order(seed: int, shuffle: bool = True) -> list[str]:
        return [r.prompt for r in sample_sharegpt(tokenizer, sharegpt_file, 3, 8, seed, shuffle, oversample=False)]

    assert order(0) == order(0)
    assert {tuple(order(seed)) for seed in range(6)} != {tuple(order(0))}
    assert order(5, shuffle=False)[0] == "What is the capital of France, please?"


@pytest.fixture
def custom_file(tmp_path: Path) -> Path:
    rows = [{"prompt": "First prompt", "output_tokens": 7}, {"prompt": "Second prompt", "output_len": 9},
            {"prompt": "Third prompt", "output_tokens": 3}]
    path = tmp_path / "custom.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    return path


def test_custom_lines_and_output_lengths(tokenizer, custom_file: Path) -> None:
    def sample(output_len: int) -> list:
        return sample_custom(tokenizer, custom_file, num_requests=0, output_len=output_len, seed=0,
                             apply_chat_template=False, shuffle=False)

    # As in vLLM: --custom-output-len applies to every line unless it is -1.
    assert [(r.prompt, r.expected_output_len) for r in sample(11)] == [
        ("First prompt", 11), ("Second prompt", 11), ("Third prompt", 11),
    ]
    assert [r.expected_output_len for r in sample(-1)] == [7, 9, 3]
    assert sample(11)[0].prompt_len == len(tokenizer("First prompt").input_ids)


def test_custom_per_line_length_must_be_there(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "partial.jsonl"
    path.write_text('{"prompt": "a", "output_tokens": 4}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match="output_tokens"):
        sample_custom(tokenizer, path, 0, -1, seed=0, apply_chat_template=False, shuffle=False)


def test_custom_chat_template_and_oversampling(tokenizer, custom_file: Path) -> None:
    requests = sample_custom(tokenizer, custom_file, num_requests=5, output_len=11, seed=0)
    assert len(requests) == 5
    assert all(r.prompt.startswith("<|im_start|>user\n") and r.prompt.endswith("<|im_start|>assistant\n")
               for r in requests)


def test_custom_rejects_lines_without_prompt(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "no prompt here"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        sample_custom(tokenizer, path, 1, 4, seed=0)


def test_sample_requests_dispatch(tokenizer, sharegpt_file: Path) -> None:
    requests = sample_requests(parse("--num-prompts", "3", "--input-len", "24", "--output-len", "6"), tokenizer)
    assert [r.expected_output_len for r in requests] == [6, 6, 6]
    args = parse("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2", "--gsp-prompts-per-group",
                 "2", "--gsp-system-prompt-len", "16", "--gsp-question-len", "4", "--gsp-output-len", "3")
    assert len(sample_requests(args, tokenizer)) == 4
    args = parse("--dataset-name", "sharegpt", "--dataset-path", str(sharegpt_file), "--num-prompts", "2",
                 "--sharegpt-output-len", "5")
    assert [r.expected_output_len for r in sample_requests(args, tokenizer)] == [5, 5]
    with pytest.raises(ValueError, match="needs --dataset-path"):
        sample_requests(parse("--dataset-name", "custom"), tokenizer)
    with pytest.raises(ValueError, match="not used"):
        sample_requests(parse("--dataset-path", str(sharegpt_file)), tokenizer)


def test_load_tokenizer_never_downloads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "missing"))
