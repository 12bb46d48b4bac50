"""Mamba2's selective state space scan (op `ssd_scan`) over a step's sequences, in two forms.

Per head h (head dim P, state dim N; B and C shared by the heads of a group), a [P, N] state S folds each token
in: S = S * exp(dt A_h) + dt x (outer) B; y = S C + D_h x. Both forms take (x [T, H, P], dt [T, H] (after
dt_bias, softplus and the limit), A [H] (-exp(A_log)), B [T, G, N], C [T, G, N], D [H], state [rows, H, P, N]
float32, metadata), compute in float32 as transformers' scan does, return float32 y [T, H, P] (D's skip
included) and update the sequences' state rows.
- `ssd_scan` (torch_ref): token by token, every sequence of the step at once; keeps the states
  `metadata.kept` names (speculative decoding).
- `ssd_scan_chunked`: the chunked (state space duality) form for prefill: within a chunk of C tokens the
  outputs are one masked [C, C] product, so a sequence takes T / C sequential steps instead of T; a kept token's
  state is rebuilt from its chunk's start. Sequences shorter than a chunk go token by token.
The chunk size and the split of a step by length: ops/state_chunks.py.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.state_chunks import CHUNK_SIZE, ChunkPadding, kept_positions, split_by_length
from rapid_llm.ops.state_metadata import StateMetadata, token_offsets


def _per_head(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """A group's B or C [T, G, N] as each of its heads reads it: [T, H, N] float32."""
    return x.float().repeat_interleave(num_heads // x.shape[1], dim=1)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    num_heads = x.shape[1]
    x, dt = x.float(), dt.float()
    B, C = _per_head(B, num_heads), _per_head(C, num_heads)
    decay = (dt * A.float()).exp()  # [T, H]
    output = torch.empty_like(x)
    for rows, slots, keep in token_offsets(metadata):
        matrix = state[slots].mul_(decay[rows][..., None, None])  # a gathered copy: [n, H, P, N]
        # transformers' selective_state_update: the decayed state plus (dt B) x, in place (no [n, H, P, N] temporary).
        matrix.addcmul_((dt[rows][..., None] * B[rows])[:, :, None, :], x[rows][..., None])
        output[rows] = (matrix @ C[rows][..., None]).squeeze(-1)
        state[slots] = matrix
        if keep is not None:
            index, targets = keep
            state[targets] = matrix[index]
    return output + D.float()[:, None] * x


def ssd_scan_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                     D: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """The chunked form for the sequences of at least one chunk, token by token for the others."""
    return split_by_length(metadata, x.new_empty(x.shape, dtype=torch.float32), _chunked, ssd_scan,
                           lambda form, tokens, sub: form(x[tokens], dt[tokens], A, B[tokens], C[tokens], D, state,
                                                          sub))


def _chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """Every sequence padded to the longest one's whole chunks: a padding token (x = 0, dt = 0) writes nothing and
    decays nothing. Heads stay in their groups, so B and C are read per group, never copied per head. Shapes below:
    [sequences, chunks, groups, heads per group, C, dim]."""
    num_heads, num_groups = x.shape[1], B.shape[1]
    per_group = num_heads // num_groups
    layout = ChunkPadding.of(metadata)
    chunks = layout.num_chunks

    def padded(values: torch.Tensor) -> torch.Tensor:
        """[T, heads or groups, ...] -> [s, c, groups, heads per group (1 for B, C), C, ...]."""
        return layout.pad(values.float()).transpose(2, 3).unflatten(2, (num_groups, -1))

    xs, steps, b, c = padded(x), padded(dt), padded(B), padded(C)  # x: [s, c, G, R, C, P]; B, C: [s, c, G, 1, C, N]
    cumulative = (steps * A.float().view(num_groups, per_group, 1)).cumsum(dim=-1)  # log decay from the chunk start
    # exp(cum_t - cum_j) for j <= t (zero above the diagonal, where the difference could overflow).
    causal = torch.ones(CHUNK_SIZE, CHUNK_SIZE, dtype=torch.bool, device=x.device).tril()
    decay = torch.where(causal, (cumulative[..., :, None] - cumulative[..., None, :]).clamp(max=0).exp(), 0)
    # Within a chunk: y_t = sum_{j <= t} (C_t . B_j) exp(cum_t - cum_j) dt_j x_j.
    within = ((c @ b.transpose(-1, -2)) * decay * steps[..., None, :]) @ xs
    # What each token writes into the state at its chunk's end: exp(cum_C - cum_j) dt_j x_j (outer) B_j.
    to_end = ((cumulative[..., -1:] - cumulative).exp() * steps)[..., None] * xs  # [s, c, G, R, C, P]
    kept = kept_positions(metadata)
    current = state[metadata.slots].unflatten(1, (num_groups, per_group))  # [s, G, R, P, N]
    output = torch.empty_like(xs)
    for chunk in range(chunks):
        carried = (c[:, chunk] @ current.transpose(-1, -2)) * cumulative[:, chunk, ..., None].exp()  # [s, G, R, C, P]
        output[:, chunk] = within[:, chunk] + carried
        if kept is not None and chunk in kept:
            # S_t = exp(cum_t) S0 + sum_{j <= t} exp(cum_t - cum_j) dt_j x_j (outer) B_j, for the kept tokens t.
            seqs, offsets, targets = kept[chunk]
            weights = decay[seqs, chunk, :, :, offsets] * steps[seqs, chunk]  # [n, G, R, C], zero for j > t
            kept_state = current[seqs] * cumulative[seqs, chunk, :, :, offsets].exp()[..., None, None] \
                + (xs[seqs, chunk] * weights[..., None]).transpose(-1, -2) @ b[seqs, chunk]
            state[targets] = kept_state.flatten(1, 2)
        current = current * cumulative[:, chunk, ..., -1, None, None].exp() \
            + to_end[:, chunk].transpose(-1, -2) @ b[:, chunk]
    state[metadata.slots] = current.flatten(1, 2)
    return layout.unpad(output.flatten(2, 3).transpose(2, 3)) + D.float()[:, None] * x.float()
