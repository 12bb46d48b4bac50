"""The proposer interface: given each request's tokens, draft up to k next tokens (torch-free).

A proposer only proposes; verification (one target forward over 1 + k positions) and the accept
decision (`rejection_sampler.py`) are the framework's, so swapping the draft source never touches them.
`Proposal.probs` is the draft distribution a model-based proposer would return (None: one-hot on the
drafted tokens, as for n-gram lookup).

Usage:
    proposals = proposer.propose([context_ids, ...], [max_drafts, ...])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

from rapid_llm.config.speculative_config import SpeculativeConfig


@dataclass
class Proposal:
    token_ids: list[int] = field(default_factory=list)  # at most the request's max_drafts; may be empty
    probs: Any = None  # [len(token_ids), V] draft probabilities; None means one-hot on token_ids


class Proposer(ABC):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    @abstractmethod
    def propose(self, contexts: Sequence[Sequence[int]], max_drafts: Sequence[int]) -> list[Proposal]:
        """One Proposal per context (every known token of a request, prompt then outputs), each with at most
        `max_drafts[i]` tokens that would follow `contexts[i]`."""
