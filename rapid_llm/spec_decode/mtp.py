"""MTP proposer: a DeepSeek-V3 target's own multi-token-prediction layers draft k tokens per step, in the worker.

V3 stores `num_nextn_predict_layers` MTP layers after its decoder layers (`model.layers.{N + i}.*`): enorm, hnorm,
eh_proj, a full decoder layer and shared_head (norm, head); the embedding (and the head when the checkpoint has
none) is the target's. MTP slot t pairs h_t (the target's residual stream after its last layer) with token t + 1:
out_t = layer(eh_proj([enorm(embed(token t+1)); hnorm(h_t)])) at position t (vLLM's; RoPE is relative), and
shared_head.head(shared_head.norm(out_t)) predicts token t + 2. Each step's catch-up covers every position the
target computed (token t + 1 is in the token pool: a prompt token, this step's sample, or a stale draft at a
rejected position the next catch-up rewrites); a drafting row's ends before its new token, and that slot's output
gives draft 1. Draft j > 1 feeds out and draft j - 1 to layer (j - 1) mod num_nextn_predict_layers at the next
position (vLLM's recurrence). Tables, scratch blocks and draws are the draft model's (`draft_model.py`).

Usage: --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'  ("deepseek_mtp" is an alias)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.embedding import ParallelLMHead
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import LinearBase
from rapid_llm.model_loader.loader import default_dtype, load_weights
from rapid_llm.model_loader.safetensors_files import iterate_tensors
from rapid_llm.models.deepseek import DeepseekV2ForCausalLM
from rapid_llm.models.llama import LlamaDecoderLayer
from rapid_llm.models.weight_mapping import SkippedKeys
from rapid_llm.quantization.apply import quantize_model
from rapid_llm.spec_decode.draft_model import DraftModelProposer
from rapid_llm.spec_decode.model_proposer import Drafts, ModelProposer, ProposerStep, TargetContext
from rapid_llm.utils.host_staging import to_device


class MTPLayer(LlamaDecoderLayer):
    """One MTP layer, its modules named as the checkpoint names them: the target's decoder layer (MLA attention,
    MoE or dense MLP, built by the target's class for layer `layer_id`) plus enorm, hnorm, eh_proj, shared_head."""

    def __init__(self, config: PretrainedConfig, layer_id: int, model_class: type[DeepseekV2ForCausalLM],
                 rotary_emb: nn.Module, own_head: bool) -> None:
        super().__init__(config, model_class.make_attention(config, layer_id, rotary_emb),
                         model_class.make_mlp(config, layer_id))
        hidden = config.hidden_size
        self.enorm = RMSNorm(hidden, config.rms_norm_eps)
        self.hnorm = RMSNorm(hidden, config.rms_norm_eps)
        self.eh_proj = LinearBase(2 * hidden, hidden, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(hidden, config.rms_norm_eps)
        if own_head:
            self.shared_head.head = ParallelLMHead(config.vocab_size, hidden)

    def predict(self, embeds: torch.Tensor, previous: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """The layer's output state (before shared_head.norm) for next-token embeddings and the states at the
        slots they follow (the target's, or this head's own for a later draft)."""
        fused = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(previous)), dim=-1))
        hidden, residual = self(fused, None, batch)
        return hidden + residual


class MTPWeights(nn.Module):
    """The MTP layers under their checkpoint names, filled by the model loader's `load_weights`; every other
    tensor (the target's, and the MTP layers' copy of the embedding) is declared skipped, so it is never read."""

    def __init__(self, target: DeepseekV2ForCausalLM, checkpoint_names: set[str]) -> None:
        super().__init__()
        config = target.config
        self.config = config
        self.stacked_params = target.stacked_params
        first = config.num_hidden_layers
        ids = [first + i for i in range(config.num_nextn_predict_layers)]
        # One cos/sin table: the target's (it can be tens of MiB at long context).
        rotary_emb = target.model.layers[0].self_attn.rotary_emb
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({
            str(layer_id): MTPLayer(config, layer_id, type(target), rotary_emb,
                                    own_head=f"model.layers.{layer_id}.shared_head.head.weight" in checkpoint_names)
            for layer_id in ids})
        indices = "|".join(map(str, ids))
        self.skipped_checkpoint_keys = (
            SkippedKeys("model.layers.{num_hidden_layers + i}.embed_tokens",
                        rf"model\.layers\.({indices})\.embed_tokens\.weight",
                        "the MTP layers' copy of the embedding: the target's is used"),
            SkippedKeys("the target's own weights", rf"(?!model\.layers\.({indices})\.).+", "loaded by the target"),
        )


def checkpoint_names(model_dir: Path) -> set[str]:
    """Every tensor name in the checkpoint, from the shards' headers: the filter records each name and refuses it
    (set.add returns None), so no tensor is read."""
    names: set[str] = set()
    for _ in iterate_tensors(model_dir, names.add):
        pass
    return names


class MTPProposer(DraftModelProposer):
    """The draft model's proposer with the target's MTP layers as the draft (`_tables`, `_batch`, `_draw`,
    `kv_layers` reused); the catch-up and each draft step read the states before them (see the module docstring)."""

    catch_up_from_tokens = False  # it reads the target's hidden states of the step's own tokens

    def __init__(self, config, target: TargetContext) -> None:
        # Not DraftModelProposer.__init__: there is no draft checkpoint, the draft is part of the target's.
        ModelProposer.__init__(self, config, target)
        model_config, hf_config = target.model_config, target.model_config.hf_config
        count = getattr(hf_config, "num_nextn_predict_layers", 0) or 0
        if count < 1:
            raise ValueError(f"--speculative-config: method {config.method!r} drafts with the target's own MTP "
                             f"layers, but {model_config.architecture}'s config has num_nextn_predict_layers="
                             f"{count} (>= 1 needed: a DeepSeek-V3-style checkpoint)")
        if not isinstance(target.model, DeepseekV2ForCausalLM):
            raise ValueError(f"--speculative-config: method {config.method!r} reads MTP layers stored as "
                             f"model.layers.{{num_hidden_layers + i}} (DeepSeek-V3); {model_config.architecture} "
                             "is not such a model")
        if config.model is not None and config.model != model_config.model:
            raise ValueError(f"--speculative-config: method {config.method!r} uses the target's own MTP layers; "
                             f"leave \"model\" out (got {config.model!r}, the target is {model_config.model!r})")
        model_dir = Path(model_config.model)
        with torch.device(target.device), default_dtype(model_config.dtype):
            self.model = MTPWeights(target.model, checkpoint_names(model_dir))
            if model_config.quantization is not None:
                quantize_model(self.model, model_config.quantization)
        load_weights(self.model, model_dir)
        for module in self.model.modules():
            if hasattr(module, "prepare_weights"):
                module.prepare_weights()
        self.model.eval()
        self.layers: list[MTPLayer] = list(self.model.model.layers.values())
        self.heads = [getattr(layer.shared_head, "head", target.model.lm_head) for layer in self.layers]
        self.embed_tokens = target.model.model.embed_tokens
        self.hidden_state_layers = (hf_config.num_hidden_layers - 1,)
        # The slots past a row's scheduler blocks it may write: drafts 2..k, at its new token's slot and after.
        self.scratch_blocks_per_slot = -(-(config.num_speculative_tokens - 1) // target.block_size)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    @torch.inference_mode()
    def propose(self, step: ProposerStep) -> Drafts:
        device = self.target.device
        # Slot t needs token t + 1: a drafting row's catch-up stops before its new token (num_tokens - 1).
        lengths = step.query_lens.copy()
        lengths[step.draft_rows] = step.num_tokens - 1 - step.starts[step.draft_rows]
        tables, device_table = self._tables(step)
        # The target's states at each chunk's first `lengths` positions, in the step's token order.
        shifts = np.repeat(np.cumsum(step.query_lens) - step.query_lens - np.cumsum(lengths) + lengths, lengths)
        states_index = to_device([torch.from_numpy(shifts + np.arange(int(lengths.sum())))], device)[0]
        previous = step.hidden_states[self.hidden_state_layers[0]][states_index]
        hidden = self._mtp_forward(step, np.arange(step.slots.size), lengths, step.starts + lengths, tables,
                                   device_table, previous, 0)
        num_rows, k = step.draft_rows.size, int(step.max_drafts.max(initial=0))
        tokens = torch.full((num_rows, k), -1, dtype=torch.int64, device=device)
        sampled = ~step.sampling.host_greedy[step.slots[step.draft_rows]]
        probs = (torch.zeros(num_rows, k, self.target.model_config.vocab_size, dtype=torch.float32, device=device)
                 if sampled.any() else None)
        hidden = hidden[to_device([torch.from_numpy(np.cumsum(lengths)[step.draft_rows] - 1)], device)[0]]
        active = np.arange(num_rows)
        for position in range(k):
            layer = position % len(self.layers)
            self._draw(step, self.heads[layer].compute_logits(self.layers[layer].shared_head.norm(hidden)), active,
                       position, tokens, probs)
            kept = step.max_drafts[active] > position + 1
            active = active[kept]
            if not active.size:
                break
            kept_on_device, active_on_device = to_device([torch.from_numpy(kept), torch.from_numpy(active)], device)
            # The draft just drawn goes in at slot num_tokens - 1 + position (the first at the new token's), with
            # the state it was drawn from, through the next layer in turn.
            hidden = self._mtp_forward(step, step.draft_rows[active], np.ones(active.size, dtype=np.int64),
                                   step.num_tokens[active] + position, tables, device_table, hidden[kept_on_device],
                                   (position + 1) % len(self.layers), input_ids=tokens[active_on_device, position])
        return Drafts(tokens, probs, sampled)

    def _mtp_forward(self, step: ProposerStep, rows: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                     tables: list[list[int]], device_table: torch.Tensor, previous: torch.Tensor, layer: int,
                     input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """MTP layer `layer`'s output states at chunk `rows`' next query_lens slots, from the states there
        (`previous`) and the tokens after them (each slot's next token in the token pool unless given)."""
        batch = self._batch(step, rows, query_lens, seq_lens, tables, device_table, input_ids, token_offset=1)
        return self.layers[layer].predict(self.embed_tokens(batch.input_ids), previous, batch)
