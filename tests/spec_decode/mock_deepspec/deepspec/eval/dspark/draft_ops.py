"""Stand-in `draft_ops`: `forward_dspark_draft_block` checks the context rows, the position ids (from 0 through
the block) and `start` against the cache, writes the cache through `DynamicCache.update` and crops it back to
`start`; `build_dspark_proposal` picks tokens greedily (the Markov head at temperature 0) and cuts the proposal
where the cumulative product of sigmoid(confidence) falls below `confidence_threshold` (0 keeps all).
Calls are kept in CALLS."""

from __future__ import annotations

from dataclasses import dataclass

import torch

CALLS: list[dict] = []


@dataclass
class DSparkDraftProposal:
    draft_token_count: int
    verify_input_ids: torch.Tensor
    draft_probs: torch.Tensor | None
    confidence_logits: torch.Tensor | None = None


def forward_dspark_draft_block(model, *, draft_input_ids, position_ids, past_key_values_draft, target_hidden_states,
                               start, block_size):
    cached = past_key_values_draft.get_seq_length()
    context = target_hidden_states.shape[1]
    if cached + context != start or position_ids.shape[1] < start + block_size:
        raise ValueError(f"context of {cached} cached + {context} new rows does not reach start {start}")
    projected = model.fc(target_hidden_states)
    keys = torch.cat([projected, model.embed_tokens(draft_input_ids)], dim=1)[:, None, :, :1]
    past_key_values_draft.update(keys, keys, 0)
    past_key_values_draft.crop(-block_size)
    CALLS.append({"target_hidden_states": target_hidden_states.detach().clone(), "start": start})
    return model.embed_tokens(draft_input_ids) + projected.mean(dim=1, keepdim=True)


def build_dspark_proposal(*, model, draft_input_ids, block_hidden, block_size, temperature, confidence_threshold):
    tokens = model.lm_head(block_hidden[:, 1:]).argmax(dim=-1)
    confidence = model.confidence_logits(block_size - 1)
    prefix = torch.sigmoid(confidence).cumprod(dim=1)[0]
    count = block_size - 1 if confidence_threshold == 0 else int((prefix >= confidence_threshold).sum())
    verify = torch.cat([draft_input_ids[:, :1], tokens[:, :count]], dim=1)
    return DSparkDraftProposal(count, verify, None, confidence)
