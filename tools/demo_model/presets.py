"""Model presets of the demo family: configs only, all sharing the demo tokenizer's vocabulary and ids.

``target`` and ``draft`` are ``LlamaForCausalLM`` (the draft a fifth of the target's size or less, for
speculative decoding); ``moe`` is ``Qwen3MoeForCausalLM`` with the draft's shapes and four experts of
the draft's FFN width, so that :mod:`tools.demo_model.upcycle` can copy the target into it. ``tiny``
exists for tests. Each preset also fixes its training schedule (steps, batch, sequence length, LR).

Usage:
    preset = PRESETS["target"]; model = transformers.AutoModelForCausalLM.from_config(preset.config())
"""

from __future__ import annotations

import dataclasses

import transformers

from rapid_llm.utils.tiny_checkpoint import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID
from tools.demo_model.tokenizer import MODEL_MAX_LENGTH, VOCAB_SIZE


@dataclasses.dataclass(frozen=True)
class Preset:
    """One model shape and how long to train it; ``upcycle_from`` names the preset it starts from (upcycled
    for an MoE preset, copied for a dense one); with ``distill_from`` the loss is the KL divergence from that
    preset's trained model's next-token distribution instead of the data's next token."""

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    num_experts: int = 0
    upcycle_from: str | None = None
    distill_from: str | None = None

    def config(self) -> transformers.PretrainedConfig:
        common: dict[str, object] = {
            "vocab_size": VOCAB_SIZE,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "max_position_embeddings": MODEL_MAX_LENGTH,
            "tie_word_embeddings": False,
            "bos_token_id": BOS_TOKEN_ID,
            "eos_token_id": EOS_TOKEN_ID,
            "pad_token_id": PAD_TOKEN_ID,
            "architectures": [self.architecture],
        }
        if self.architecture == "LlamaForCausalLM":
            return transformers.LlamaConfig(intermediate_size=self.intermediate_size, **common)
        if self.architecture == "Qwen3MoeForCausalLM":
            return transformers.Qwen3MoeConfig(
                num_experts=self.num_experts,
                num_experts_per_tok=2,
                moe_intermediate_size=self.intermediate_size,
                intermediate_size=self.intermediate_size,
                # With the top-2 weights summing to one, identical experts compute the target's FFN.
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                **common,
            )
        raise ValueError(f"unsupported architecture {self.architecture!r}")


PRESETS: dict[str, Preset] = {
    "target": Preset("LlamaForCausalLM", hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
                     intermediate_size=1024, steps=600, batch_size=16, seq_len=256, lr=1e-3, warmup_steps=30),
    "draft": Preset("LlamaForCausalLM", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                    intermediate_size=384, steps=600, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=30),
    # One decoder layer: on a CPU a forward's cost is mostly fixed per-layer work, so depth, not width, sets
    # what a draft costs against the target (docs/spec_decode/README.md, "Draft-model cost on CPU").
    "draft-1l": Preset("LlamaForCausalLM", hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=2,
                       intermediate_size=768, steps=600, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=30),
    # draft-1l distilled from the target: what a draft is for is agreeing with the target, not with the data.
    "draft-1l-kd": Preset("LlamaForCausalLM", hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=2,
                          intermediate_size=768, steps=200, batch_size=16, seq_len=256, lr=5e-4, warmup_steps=10,
                          upcycle_from="draft-1l", distill_from="target"),
    # Upcycled from the draft: four copies of the target's FFN would make it 72 MB, past the size budget.
    "moe": Preset("Qwen3MoeForCausalLM", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                  intermediate_size=384, num_experts=4, steps=150, batch_size=16, seq_len=256, lr=6e-4,
                  warmup_steps=10, upcycle_from="draft"),
    # The target trained on from its packaged weights (it had seen under one epoch of the corpus), same shape, with
    # another data seed so the batches are new; resumable across sessions like every preset.
    "target-long": Preset("LlamaForCausalLM", hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
                          intermediate_size=1024, steps=1500, batch_size=16, seq_len=256, lr=6e-4, warmup_steps=30,
                          upcycle_from="target"),
    "tiny": Preset("LlamaForCausalLM", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   intermediate_size=64, steps=4, batch_size=2, seq_len=16, lr=1e-3, warmup_steps=1),
}
