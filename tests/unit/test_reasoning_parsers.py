"""The reasoning parsers alone: whole replies, and streams cut at every position (tags split across deltas)."""

from __future__ import annotations

import pytest

from rapid_llm.frontend.reasoning_parsers import REASONING_PARSERS
from rapid_llm.frontend.reasoning_parsers.base import ReasoningParser
from rapid_llm.server_args import ServerArgs

# (parser, reply, reasoning, content); reasoning None: no think block opened.
CASES = [
    ("qwen3", "<think>\nThe user asks for 2+2.\n</think>\n\nIt is 4.", "\nThe user asks for 2+2.\n", "\n\nIt is 4."),
    ("qwen3", "It is 4.", None, "It is 4."),  # enable_thinking=False: no think block
    ("qwen3", "\n<think>a < b</think>b > a", "a < b", "b > a"),  # whitespace before the tag; lone '<' is text
    ("qwen3", "4 <think>not at the start</think>", None, "4 <think>not at the start</think>"),
    ("qwen3", "<think>cut by max_tokens", "cut by max_tokens", ""),
    ("qwen3", "<thin", None, "<thin"),  # a final reply that only began like the tag
    ("qwen3", "", None, ""),
    ("deepseek_r1", "The user asks.</think>\n\nIt is 4.", "The user asks.", "\n\nIt is 4."),
    ("deepseek_r1", "<think>Repeated tag.</think>4", "Repeated tag.", "4"),
    ("deepseek_r1", "Never closed </thi", "Never closed </thi", ""),
    ("deepseek_r1", "</think>", "", ""),
    ("deepseek_r1", "a</think>b</think>c", "a", "b</think>c"),  # one block: later tags are content
]


def parser(name: str, constrained: bool = False) -> ReasoningParser:
    return REASONING_PARSERS.get(name)(constrained=constrained)


def streamed(name: str, pieces: list[str]) -> tuple[list[str], list[str]]:
    stream = parser(name).stream()
    reasoning, content = [], []
    for number, piece in enumerate(pieces):
        new_reasoning, new_content = stream.feed(piece, final=number == len(pieces) - 1)
        reasoning.append(new_reasoning)
        content.append(new_content)
    return reasoning, content


@pytest.mark.parametrize(("name", "reply", "reasoning", "content"), CASES)
def test_a_whole_reply_splits_at_the_think_tags(name: str, reply: str, reasoning: str | None, content: str) -> None:
    assert parser(name).split(reply) == (reasoning, content)


@pytest.mark.parametrize(("name", "reply", "reasoning", "content"), CASES)
def test_a_stream_cut_anywhere_adds_up_to_the_whole_split(name: str, reply: str, reasoning: str | None,
                                                          content: str) -> None:
    cuts = [[reply[:i], reply[i:j], reply[j:]] for i in range(len(reply) + 1) for j in range(i, len(reply) + 1)]
    for pieces in [*cuts, list(reply) or [""]]:
        reasoning_parts, content_parts = streamed(name, pieces)
        assert ("".join(reasoning_parts), "".join(content_parts)) == (reasoning or "", content), pieces


def test_a_tag_split_across_deltas_is_never_sent_as_text() -> None:
    reply = "<think>why</think>answer"
    for i in range(len(reply) + 1):
        reasoning, content = streamed("qwen3", [reply[:i], reply[i:], ""])
        # Each piece is what one chunk carries: none may hold any part of a tag.
        assert all(not part or "<" not in part and ">" not in part for part in reasoning + content), reasoning + content
        assert ("".join(reasoning), "".join(content)) == ("why", "answer")


def test_reasoning_is_sent_as_it_grows_not_at_the_end() -> None:
    reasoning, content = streamed("deepseek_r1", ["Let", " me think", " now</", "think>Done", ""])
    assert reasoning == ["Let", " me think", " now", "", ""]
    assert content == ["", "", "", "Done", ""]


def test_a_constrained_reply_does_not_start_in_reasoning() -> None:
    """A grammar shapes the output from its first token, so deepseek_r1 reads JSON as content, not thought."""
    assert parser("deepseek_r1", constrained=True).split('{"a": 1}') == (None, '{"a": 1}')
    assert parser("deepseek_r1", constrained=True).split("<think>x</think>y") == ("x", "y")


def test_an_unknown_parser_fails_at_start_up_listing_the_choices() -> None:
    with pytest.raises(ValueError, match=r"^unknown --reasoning-parser 'deepseek'; known: deepseek_r1, qwen3$"):
        ServerArgs(reasoning_parser="deepseek").check_http()
    args = ServerArgs.from_cli(["--reasoning-parser", "qwen3"])
    args.check_http()
    assert args.frontend_options({}).reasoning_parser == "qwen3"
