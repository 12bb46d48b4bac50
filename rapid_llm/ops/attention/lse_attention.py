"""Attention that also returns each row's log-sum-exp: the `attention_lse` op, for algorithms that merge partials.

Decode context parallelism attends a query over one rank's share of its keys and merges the ranks' outputs by
their log-sum-exps (ops/attention/dcp_backend.py, dcp_mla_backend.py); a kernel that returns only the normalised
output cannot take part, so this op is the registry's seam for ones that can. torch_ref: plain torch in float32,
materialising every score; cpu_flash: torch's fused CPU flash-attention kernel, which returns the log-sum-exp
too and never holds the [Q, K] scores (chosen for calls of several queries: measured 5.3x faster on a 1024-query
chunk over 4096 keys, 1.2x slower on single-token decodes). Every call is float32. A row with no visible key gets
log-sum-exp -inf and output 0, so it drops out of the merge.
Usage: `out, lse = ops.attention_lse(queries [B, H, Q, D], keys [B, K, D], values [B, K, Dv], key_mask [B, 1, Q, K],
scale)` -> out [B, H, Q, Dv], lse [B, H, Q]; every head reads the one key/value head.
"""

from __future__ import annotations

import torch


def attention_lse(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.einsum("bhqd,bkd->bhqk", queries.float(), keys.float()) * scale
    scores = scores.masked_fill(~key_mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
    return torch.einsum("bhqk,bkd->bhqd", weights, values.float()), lse


def attention_lse_flash(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    heads = queries.shape[1]
    bias = torch.zeros(key_mask.shape, dtype=torch.float32, device=key_mask.device).masked_fill_(~key_mask,
                                                                                                 float("-inf"))
    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries.float(), keys.float().unsqueeze(1).expand(-1, heads, -1, -1),
        values.float().unsqueeze(1).expand(-1, heads, -1, -1), 0.0, False, attn_mask=bias, scale=scale)
    # The kernel reports 0 for a row that sees no key; the merge needs -inf there.
    return output, lse.masked_fill_(~key_mask.any(dim=-1), float("-inf"))
