"""N-gram proposer (prompt lookup): the context's last n tokens matched against earlier context.

The longest match within [prompt_lookup_min, prompt_lookup_max] wins, the latest occurrence among equally
long ones (recent text predicts best); the drafts are the tokens that followed it. One backward scan per
request in plain Python (torch-free, over the token list the scheduler keeps, without copying it into an
array every step): only positions whose token equals the context's last token are compared further, and a
match of the maximum length stops the scan.
"""

from __future__ import annotations

from typing import Sequence

from rapid_llm.spec_decode.proposer import Proposal, Proposer


class NgramProposer(Proposer):
    def propose(self, contexts: Sequence[Sequence[int]], max_drafts: Sequence[int]) -> list[Proposal]:
        return [Proposal(self._lookup(context, limit) if limit > 0 else []) for context, limit in
                zip(contexts, max_drafts)]

    def _lookup(self, context: Sequence[int], limit: int) -> list[int]:
        low, high = self.config.prompt_lookup_min, self.config.prompt_lookup_max
        size = len(context)
        if size < low + 1:
            return []
        last = context[-1]
        best_end, best_len = -1, low - 1
        # `end` is the last index of a candidate occurrence; it needs a following token, so end <= size - 2.
        for end in range(size - 2, low - 2, -1):
            if context[end] != last:
                continue
            length = 1
            cap = min(high, end + 1)
            while length < cap and context[end - length] == context[size - 1 - length]:
                length += 1
            if length > best_len:
                best_end, best_len = end, length
                if length == high:
                    break
        if best_end < 0:
            return []
        return list(context[best_end + 1 : best_end + 1 + limit])
