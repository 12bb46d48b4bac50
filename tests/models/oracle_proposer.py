"""A speculative proposer for tests of rollback: it drafts from known greedy outputs, two right then one wrong.

Verification then accepts some drafts and rejects others in the same chunk, so a model's state must come back to
just after the accepted ones. `register_oracle(monkeypatch, prompts, outputs)` registers it as ORACLE in a copy of
the proposer registry (no other test sees it) and returns its SpeculativeConfig.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode import registry
from rapid_llm.spec_decode.proposer import Proposal, Proposer

ORACLE = "oracle-two-right"
_REFERENCES: dict[tuple[int, ...], list[int]] = {}


class OracleProposer(Proposer):
    def propose(self, contexts: Sequence[Sequence[int]], max_drafts: Sequence[int]) -> list[Proposal]:
        proposals = []
        for context, limit in zip(contexts, max_drafts):
            prompt = max((p for p in _REFERENCES if tuple(context[:len(p)]) == p), key=len, default=None)
            drafts: list[int] = []
            if prompt is not None:
                outputs, done = _REFERENCES[prompt], len(context) - len(prompt)
                drafts = outputs[done:done + 2] + [(token + 1) % 500 for token in outputs[done + 2:done + 3]]
            proposals.append(Proposal(drafts[:limit]))
        return proposals


def register_oracle(monkeypatch: pytest.MonkeyPatch, prompts: Sequence[Sequence[int]],
                    outputs: Sequence[Sequence[int]]) -> SpeculativeConfig:
    monkeypatch.setattr(registry, "_PROPOSERS", copy.deepcopy(registry._PROPOSERS))
    registry.register_proposer(ORACLE, OracleProposer)
    _REFERENCES.clear()
    _REFERENCES.update({tuple(prompt): list(output) for prompt, output in zip(prompts, outputs)})
    return SpeculativeConfig(method=ORACLE, num_speculative_tokens=3)
