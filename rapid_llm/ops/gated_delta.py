"""The gated delta rule (op `gated_delta_rule`): Gated DeltaNet's recurrence over a step's sequences, three forms.

Per value head, a [key dim, value dim] state S folds each token in: S = S * exp(g); u = beta * (v - S^T k);
S += k u^T; o = S^T q. Value head h reads key head h // (value heads / key heads). Every form takes
(query [T, Hk, Dk] (normalised and scaled), key [T, Hk, Dk] (normalised), value [T, Hv, Dv], g [T, Hv] (log
decay), beta [T, Hv], state [rows, Hv, Dk, Dv], metadata) in float32, returns [T, Hv, Dv] and updates the
sequences' state rows (and the kept ones, for speculative decoding).
- `gated_delta_rule` (torch_ref): token by token, every sequence of the step at once.
- `gated_delta_rule_decode`: one token per sequence, with batched matrix products on the state instead of
  broadcast products (no [n, Hv, Dk, Dv] temporary but the gathered state).
- `gated_delta_rule_chunked`: the chunked (WY) form for prefill: within a chunk of C tokens the writes u solve a
  unit lower-triangular system, so a sequence takes T / C sequential steps instead of T; a kept token's state is
  rebuilt from its chunk's start. Sequences shorter than one chunk go token by token.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.state_chunks import CHUNK_SIZE, ChunkPadding, kept_positions, split_by_length
from rapid_llm.ops.state_metadata import StateMetadata, token_offsets


def _expand_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    return x.repeat_interleave(num_value_heads // x.shape[1], dim=1)


def gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    num_value_heads = value.shape[1]
    query, key = _expand_heads(query, num_value_heads), _expand_heads(key, num_value_heads)
    output = torch.empty_like(value)
    for rows, slots, keep in token_offsets(metadata):
        matrix = state[slots] * g[rows].exp()[..., None, None]  # [n, Hv, Dk, Dv]
        k = key[rows]
        delta = (value[rows] - (matrix * k[..., None]).sum(dim=-2)) * beta[rows][..., None]
        matrix = matrix + k[..., None] * delta[..., None, :]
        output[rows] = (matrix * query[rows][..., None]).sum(dim=-2)
        state[slots] = matrix
        if keep is not None:
            index, targets = keep
            state[targets] = matrix[index]
    return output


def gated_delta_rule_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                            beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """One token per sequence (token i is sequence i's), kept states included: the decay in place, S^T k and
    S^T q as batched matrix-vector products, the rank-one write fused into one baddbmm."""
    num_seqs, num_value_heads = value.shape[:2]
    key_dim, value_dim = key.shape[-1], value.shape[-1]
    query, key = _expand_heads(query, num_value_heads), _expand_heads(key, num_value_heads)
    matrix = state[metadata.slots]
    matrix.mul_(g.exp()[..., None, None])
    flat = matrix.view(num_seqs * num_value_heads, key_dim, value_dim)
    remembered = torch.bmm(key.reshape(-1, 1, key_dim), flat).view(value.shape)  # S^T k
    delta = (value - remembered).mul_(beta[..., None])
    flat.baddbmm_(key.reshape(-1, key_dim, 1), delta.view(-1, 1, value_dim))
    state[metadata.slots] = matrix
    if metadata.kept is not None:
        state[metadata.kept.targets] = matrix[metadata.kept.tokens]
    return torch.bmm(query.reshape(-1, 1, key_dim), flat).view(value.shape)


def gated_delta_rule_chunked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """The chunked form for the sequences of at least one chunk, token by token for the others."""
    return split_by_length(metadata, torch.empty_like(value), _chunked, gated_delta_rule,
                           lambda form, tokens, sub: form(query[tokens], key[tokens], value[tokens], g[tokens],
                                                          beta[tokens], state, sub))


def _chunked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """Every sequence padded to the longest one's whole chunks: a padding token (k = v = 0, g = 0, beta = 0)
    writes nothing and decays nothing. Shapes below: [sequences, chunks, heads, C, dim]."""
    num_value_heads = value.shape[1]
    layout = ChunkPadding.of(metadata)
    chunks = layout.num_chunks

    def padded(x: torch.Tensor) -> torch.Tensor:
        return layout.pad(x).transpose(2, 3)

    q = padded(_expand_heads(query, num_value_heads))  # [s, c, H, C, Dk]
    k = padded(_expand_heads(key, num_value_heads))
    v = padded(value)  # [s, c, H, C, Dv]
    b = padded(beta)  # [s, c, H, C]
    cumulative = padded(g).cumsum(dim=-1)  # G_t: the log decay from the chunk start through t
    # exp(G_t - G_j) for j <= t (zero above the diagonal, where the difference could overflow).
    causal = torch.ones(CHUNK_SIZE, CHUNK_SIZE, dtype=torch.bool, device=value.device).tril()
    decay = torch.where(causal, (cumulative[..., :, None] - cumulative[..., None, :]).clamp(max=0).exp(), 0)
    # The writes u solve (I + L) u = beta * (v - exp(G) S0^T k), L[t, j] = beta_t exp(G_t - G_j) k_t.k_j (j < t).
    system = (b[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1) + torch.eye(CHUNK_SIZE, device=value.device)
    written_values = torch.linalg.solve_triangular(system, b[..., None] * v, upper=False, unitriangular=True)
    written_keys = torch.linalg.solve_triangular(system, (b * cumulative.exp())[..., None] * k, upper=False,
                                                 unitriangular=True)
    within = (q @ k.transpose(-1, -2)) * decay  # q_t.k_j exp(G_t - G_j), j <= t
    kept = kept_positions(metadata)
    current = state[metadata.slots]  # [s, H, Dk, Dv]
    output = torch.empty_like(v)
    for chunk in range(chunks):
        writes = written_values[:, chunk] - written_keys[:, chunk] @ current  # u: [s, H, C, Dv]
        output[:, chunk] = (q[:, chunk] * cumulative[:, chunk, ..., None].exp()) @ current \
            + within[:, chunk] @ writes
        if kept is not None and chunk in kept:
            # S_t = exp(G_t) S0 + sum_{j <= t} exp(G_t - G_j) k_j u_j^T, for the kept tokens t of this chunk.
            seqs, offsets, targets = kept[chunk]
            weights = decay[seqs, chunk, :, offsets]  # [n, H, C]: exp(G_t - G_j), zero for j > t
            state[targets] = current[seqs] * cumulative[seqs, chunk, :, offsets].exp()[..., None, None] \
                + (k[seqs, chunk] * weights[..., None]).transpose(-1, -2) @ writes[seqs]
        last = cumulative[:, chunk, :, -1:]  # G_C: [s, H, 1]
        current = current * last[..., None].exp() \
            + (k[:, chunk] * (last - cumulative[:, chunk]).exp()[..., None]).transpose(-1, -2) @ writes
    state[metadata.slots] = current
    return layout.unpad(output.transpose(2, 3))
