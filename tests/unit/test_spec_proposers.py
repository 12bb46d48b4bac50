"""`--speculative-config` parsing (errors name the field), the proposer registry (not-built methods refused,
one registration per proposer) and the n-gram prompt lookup (longest n first, latest occurrence, bounds)."""

from __future__ import annotations

import pytest

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.server_args import ServerArgs
from rapid_llm.spec_decode.ngram import NgramProposer
from rapid_llm.spec_decode.proposer import Proposal, Proposer
from rapid_llm.spec_decode.registry import build_proposer, check_method, register_proposer


def ngram(k: int = 3, low: int = 1, high: int = 4) -> NgramProposer:
    return NgramProposer(SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_min=low,
                                           prompt_lookup_max=high))


@pytest.mark.parametrize("context, limit, drafts", [
    ([1, 2, 3, 4, 1, 2, 3], 3, [4, 1, 2]),  # the 3-gram [1, 2, 3] matched at the start
    ([1, 2, 9, 1, 2, 8, 1, 2], 2, [8, 1]),  # latest occurrence of [1, 2] wins over the first
    ([7, 1, 2, 5, 9, 2, 6, 1, 2], 3, [5, 9, 2]),  # the 2-gram [1, 2] beats the later 1-gram [2]
    ([5, 6, 7], 3, []),  # no earlier occurrence of the last token
    ([3, 3], 3, [3]),  # drafts stop at the context's end
    ([1, 2, 3, 1, 2, 3], 1, [1]),  # truncated to the request's limit
    ([1, 2, 3, 1, 2, 3], 0, []),
    ([], 3, []),
])
def test_ngram_lookup(context: list[int], limit: int, drafts: list[int]) -> None:
    assert ngram().propose([context], [limit]) == [Proposal(drafts)]


def test_ngram_bounds() -> None:
    # A 1-gram match is ignored when at least 2 tokens must match.
    assert ngram(low=2).propose([[4, 9, 1, 2, 9]], [3]) == [Proposal([])]
    assert ngram(low=2).propose([[4, 9, 1, 4, 9]], [3]) == [Proposal([1, 4, 9])]
    # With max 1, only the last token is matched: its latest occurrence wins even where a longer match exists.
    assert ngram(high=1).propose([[1, 2, 7, 3, 2, 8, 1, 2]], [1]) == [Proposal([8])]
    assert ngram(high=2).propose([[1, 2, 7, 3, 2, 8, 1, 2]], [1]) == [Proposal([7])]


@pytest.mark.parametrize("text, message", [
    ('{"method": "ngram"', "not valid JSON"),
    ('[1, 2]', "must be a JSON object"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup": 2}', "prompt_lookup"),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', "$.num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be at least 1"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}',
     "prompt_lookup_max (2) must be at least prompt_lookup_min (3)"),
])
def test_bad_config_names_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--speculative-config") as error:
        SpeculativeConfig.parse(text)
    assert message in str(error.value)


def test_config_from_the_flag_and_the_offline_dict(tiny_checkpoint) -> None:
    checkpoint = str(tiny_checkpoint())
    args = ServerArgs.from_cli(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    config = args.engine_config(checkpoint)
    assert config.scheduler.speculative == SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    assert config.summary()["speculative_config"]["num_speculative_tokens"] == 2
    offline = ServerArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2})
    assert offline.engine_config(checkpoint).scheduler.speculative.prompt_lookup_max == 2
    assert ServerArgs().engine_config(checkpoint).scheduler.speculative is None
    with pytest.raises(ValueError, match="method 'eagle' is not built yet"):
        ServerArgs(speculative_config='{"method": "eagle", "num_speculative_tokens": 2}').engine_config(checkpoint)


def test_registry_refuses_unknown_and_not_built_methods() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope'; known: .*ngram"):
        check_method("nope")
    for planned in ("eagle", "eagle3", "medusa"):
        with pytest.raises(ValueError, match="not built yet"):
            check_method(planned)


def test_a_proposer_is_one_class_and_one_registration() -> None:
    class Repeat(Proposer):
        def propose(self, contexts, max_drafts):
            return [Proposal([context[-1]] * limit) for context, limit in zip(contexts, max_drafts)]

    register_proposer("test-repeat", Repeat)
    with pytest.raises(ValueError, match="registered already"):
        register_proposer("test-repeat", Repeat)
    proposer = build_proposer(SpeculativeConfig(method="test-repeat", num_speculative_tokens=2))
    assert proposer.propose([[4, 5]], [2]) == [Proposal([5, 5])]
