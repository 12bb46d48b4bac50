"""A recurrent test double: a Llama whose listed layers replace attention by a mixer with per-request state.

`RecurrentDoubleForCausalLM` reads a Llama config (model_type llama, so transformers' AutoConfig loads it) with
`recurrent_layers` (layer ids), `recurrent_state_size` and `recurrent_decay`. In rapid_llm each recurrent layer is a
`StateLayer` in the worker's state cache group: state_t = decay * state_{t-1} + in_proj(x_t), output
o_proj(state_t), computed token by token from the request's state row, chunk after chunk. `reference_model` is
transformers' Llama with those layers' attention swapped for the same mixer in full-sequence form (a
decay-weighted causal sum, no state carried), the oracle tests compare against; `build_recurrent_double` writes
a checkpoint (a tiny random Llama rewritten). Register it with `ARCHITECTURE` -> `MODEL_CLASS` (in-process) or
`RAPID_LLM_PLUGINS=tests.models.recurrent_double_plugin` (servers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import safetensors.torch
import torch
import transformers
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.linear import ColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.ops.state_metadata import StateMetadata, token_offsets
from rapid_llm.models.llama import LlamaForCausalLM
from rapid_llm.ops.attention.kv_cache_spec import StateSpec
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint

ARCHITECTURE = "RecurrentDoubleForCausalLM"
MODEL_CLASS = "tests.models.recurrent_double:RecurrentDoubleForCausalLM"


class RecurrentMixer(StateLayer):
    """Called like an attention module, (hidden_states, batch); keeps one state vector per request."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.in_proj = ColumnParallelLinear(config.hidden_size, config.recurrent_state_size)
        self.o_proj = RowParallelLinear(config.recurrent_state_size, config.hidden_size)
        self.state_size = self.in_proj.weight.shape[0]  # this rank's share of the state channels
        self.decay = float(config.recurrent_decay)

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(dtype, ((self.state_size,),))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata: StateMetadata = batch.metadata_for(self)
        (state,) = self.bound()
        inputs = self.in_proj(hidden_states)
        outputs = torch.empty_like(inputs)
        # Offset t of every sequence at once: its state row folds in its t-th new token.
        for rows, slots, keep in token_offsets(metadata):
            state[slots] = self.decay * state[slots] + inputs[rows]
            outputs[rows] = state[slots]
            if keep is not None:  # speculative decoding: the states after these tokens are kept
                index, targets = keep
                state[targets] = state[slots[index]]
        return self.o_proj(outputs)


class RecurrentDoubleForCausalLM(LlamaForCausalLM):
    @classmethod
    def make_attention(cls, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        if layer_id in config.recurrent_layers:
            return RecurrentMixer(config)
        return super().make_attention(config, layer_id, rotary_emb)


class ReferenceMixer(nn.Module):
    """The mixer over a whole sequence at once: state_t = sum over s <= t of decay^(t - s) * in_proj(x_s)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.in_proj = nn.Linear(config.hidden_size, config.recurrent_state_size, bias=False)
        self.o_proj = nn.Linear(config.recurrent_state_size, config.hidden_size, bias=False)
        self.decay = float(config.recurrent_decay)

    def forward(self, hidden_states: torch.Tensor, **_: Any) -> tuple[torch.Tensor, None]:
        inputs = self.in_proj(hidden_states)  # [batch, T, state]
        position = torch.arange(inputs.shape[1], device=inputs.device)
        distance = position[:, None] - position[None, :]
        weights = torch.where(distance >= 0, self.decay ** distance.clamp(min=0).to(inputs.dtype), 0.0)
        return self.o_proj(torch.einsum("ts,bsd->btd", weights, inputs)), None


def build_recurrent_double(out_dir: Path, recurrent_layers: Sequence[int] = (1,), state_size: int = 48,
                           decay: float = 0.95, seed: int = 0, **overrides: object) -> Path:
    """A tiny random Llama checkpoint whose `recurrent_layers` hold mixer weights instead of attention."""
    build_tiny_checkpoint(out_dir, "LlamaForCausalLM", torch.float32, seed=seed, **overrides)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(architectures=[ARCHITECTURE], recurrent_layers=list(recurrent_layers),
                  recurrent_state_size=state_size, recurrent_decay=decay)
    config_path.write_text(json.dumps(config, indent=2))
    weights_path = out_dir / "model.safetensors"
    tensors = safetensors.torch.load_file(weights_path)
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = config["hidden_size"]
    for layer in recurrent_layers:
        prefix = f"model.layers.{layer}.self_attn."
        for name in [name for name in tensors if name.startswith(prefix)]:
            del tensors[name]
        tensors[prefix + "in_proj.weight"] = torch.randn(state_size, hidden, generator=generator) * 0.2
        tensors[prefix + "o_proj.weight"] = torch.randn(hidden, state_size, generator=generator) * 0.05
    safetensors.torch.save_file(tensors, weights_path, metadata={"format": "pt"})
    return out_dir


def reference_model(checkpoint: Path) -> transformers.LlamaForCausalLM:
    """transformers' Llama from the checkpoint, recurrent layers as `ReferenceMixer`, every tensor loaded strictly."""
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    model = transformers.LlamaForCausalLM(config)
    for layer in config.recurrent_layers:
        model.model.layers[layer].self_attn = ReferenceMixer(config)
    model.load_state_dict(safetensors.torch.load_file(checkpoint / "model.safetensors"), strict=True)
    return model.eval()


def reference_greedy(model: transformers.LlamaForCausalLM, prompts: Sequence[Sequence[int]], new_tokens: int,
                     banned: Sequence[int] = ()) -> list[list[int]]:
    """`new_tokens` greedy tokens per prompt, each from a forward over the whole sequence (no cache); `banned` ids
    (EOS, as min_tokens bans it) never picked."""
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            tokens = list(prompt)
            for _ in range(new_tokens):
                logits = model(torch.tensor([tokens]), use_cache=False).logits[0, -1]
                logits[list(banned)] = float("-inf")
                tokens.append(int(logits.argmax()))
            outputs.append(tokens[len(prompt):])
    return outputs
