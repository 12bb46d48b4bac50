"""Tiny random Hugging Face checkpoints and a small local tokenizer.

Tests need real checkpoints on disk -- a ``config.json``, safetensors weights,
a tokenizer -- but must never download anything. This module makes them from nothing: the model is
built from a config with ``AutoModelForCausalLM.from_config`` and saved with ``save_pretrained``, and the
tokenizer is a byte-level BPE trained in a few milliseconds on a short built-in text.

Key design choice: the files are written by transformers itself, so they have exactly the layout,
names and metadata of a checkpoint from the Hub, and transformers can load the same directory as a
reference to compare against. Weights are random but deliberately loud (a larger init range, randomly
scaled norm weights, non-zero biases), so that greedy decoding gives varied tokens and a loader that
drops a norm weight or a bias produces visibly wrong logits.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                           "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM",
                           "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Lfm2ForCausalLM",
                           "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                           "NemotronHForCausalLM")

BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<|bos|>", "<|eos|>", "<|pad|>"
IM_START_TOKEN, IM_END_TOKEN = "<|im_start|>", "<|im_end|>"
# The trainer gives special tokens the first ids in this order, so the ids below are fixed.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, IM_START_TOKEN_ID, IM_END_TOKEN_ID = range(len(SPECIAL_TOKENS))

# The corpus below allows about 610 tokens at min_frequency=2; 512 leaves headroom for edits to it.
VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 512

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unsupported chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)

_CONFIG_CLASSES: dict[str, type[transformers.PretrainedConfig]] = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
    "MistralForCausalLM": transformers.MistralConfig,
    "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
    "MixtralForCausalLM": transformers.MixtralConfig,
    "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
    "DeepseekV2ForCausalLM": transformers.DeepseekV2Config,
    "DeepseekV3ForCausalLM": transformers.DeepseekV3Config,
    "DeepseekV4ForCausalLM": transformers.DeepseekV4Config,
    "Lfm2ForCausalLM": transformers.Lfm2Config,
    "Qwen3NextForCausalLM": transformers.Qwen3NextConfig,
    "Qwen3_5ForCausalLM": transformers.Qwen3_5TextConfig,
    "Qwen3_5MoeForCausalLM": transformers.Qwen3_5MoeTextConfig,
    "NemotronHForCausalLM": transformers.NemotronHConfig,
}

# Qwen3's head_dim differs from hidden_size / num_attention_heads (64 / 4 = 16) so that code which
# derives it from the hidden size instead of reading the config fails loudly.
# Qwen2/3-MoE: 4 experts, top-2, and a dense middle layer (mlp_only_layers) so both MLP kinds are checked;
# Qwen2-MoE keeps its default norm_topk_prob=False, so each renormalisation rule is covered. Mixtral's
# experts are `intermediate_size` wide; 4 of them, top-2.
# DeepSeek (MLA): every width differs (latent 32, nope 16, rope 8, value 24) so mixed-up dims fail loudly;
# V2 without a query LoRA (V2-Lite's plain q_proj), V3 with one. first_k_dense_replace covers every layer
# (dense MLPs), so MLA is checked alone; the expert fields size the MoE variants (tests/models/test_deepseek.py).
_QWEN_MOE = {"num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
             "mlp_only_layers": [1]}
_MLA_DEFAULTS: dict[str, object] = {"num_key_value_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                                    "qk_rope_head_dim": 8, "v_head_dim": 24, "first_k_dense_replace": 2,
                                    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# DeepSeek-V4: every layer type (sliding, CSA with rate 4, HCA with rate 8) and both MLP types in four layers,
# a window of 8 and an index_topk of 3 so windows slide and the indexer drops entries within short prompts,
# YaRN on the compressed layers' rope; swiglu_limit 1.5 so the clamps bite.
_DSV4_DEFAULTS: dict[str, object] = {
    "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 24, "partial_rotary_factor": 0.25,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                    "compressed_sparse_attention"],
    "mlp_layer_types": ["hash_moe", "moe", "hash_moe", "moe"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "swiglu_limit": 1.5,
    "hc_mult": 2, "hc_sinkhorn_iters": 5, "sliding_window": 8, "o_groups": 2, "o_lora_rank": 16,
    "index_n_heads": 8, "index_head_dim": 16, "index_topk": 3,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}
# LFM2: short-conv layers first and last with an attention layer between, a conv bias, and an MLP width the
# auto-adjust rule rounds (2/3 of 128 = 85 -> 96 with multiples of 16).
_LFM2_DEFAULTS: dict[str, object] = {
    "num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "conv"], "conv_bias": True,
    "conv_L_cache": 3, "block_multiple_of": 16,
}
# Qwen3-Next: Gated DeltaNet layers around a gated attention layer, twice as many value heads as key heads (grouped),
# a head_dim of 32 with a quarter rotated, and the Qwen MoE (4 experts, top-2, a shared expert) with a dense layer.
_QWEN3_NEXT_DEFAULTS: dict[str, object] = {
    "num_hidden_layers": 4, "layer_types": ["linear_attention", "full_attention", "linear_attention",
                                            "linear_attention"],
    "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "mlp_only_layers": [2],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}
# NemotronH: one mixer per layer ("M*-M-": Mamba2, attention, relu^2 MLP, Mamba2, MLP); 8 Mamba heads of 16 in
# 2 groups (4 heads per group's B and C), a conv bias, a chunk of 8 so prompts span several chunks, and an
# attention head_dim of 32 (not hidden / heads).
_NEMOTRON_H_DEFAULTS: dict[str, object] = {
    "layers_block_type": ["linear_attention", "full_attention", "mlp", "linear_attention", "mlp"],
    "head_dim": 32, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
    "conv_kernel": 4, "chunk_size": 8, "use_conv_bias": True,
}
# Qwen3.5: Qwen3-Next's layer mix and Gated DeltaNet widths with a dense MLP; its MoE variant has no dense layers.
_QWEN3_5_DEFAULTS: dict[str, object] = {
    key: value for key, value in _QWEN3_NEXT_DEFAULTS.items()
    if key not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                   "mlp_only_layers")}
_QWEN3_5_MOE_DEFAULTS: dict[str, object] = {
    **_QWEN3_5_DEFAULTS, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64}
_ARCHITECTURE_DEFAULTS: dict[str, dict[str, object]] = {
    "Qwen3ForCausalLM": {"head_dim": 32},
    "Qwen3MoeForCausalLM": {"head_dim": 32, "norm_topk_prob": True, **_QWEN_MOE},
    "Qwen2MoeForCausalLM": {"shared_expert_intermediate_size": 80, **_QWEN_MOE},
    "MixtralForCausalLM": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48},
    "DeepseekV2ForCausalLM": {**_MLA_DEFAULTS, "q_lora_rank": None},
    "DeepseekV3ForCausalLM": {**_MLA_DEFAULTS, "q_lora_rank": 48, "n_group": 2, "topk_group": 1},
    "DeepseekV4ForCausalLM": _DSV4_DEFAULTS,
    "Lfm2ForCausalLM": _LFM2_DEFAULTS,
    "Qwen3NextForCausalLM": _QWEN3_NEXT_DEFAULTS,
    "Qwen3_5ForCausalLM": _QWEN3_5_DEFAULTS,
    "Qwen3_5MoeForCausalLM": _QWEN3_5_MOE_DEFAULTS,
    "NemotronHForCausalLM": _NEMOTRON_H_DEFAULTS,
}

_CORPUS = r'''
The server reads a request, turns the prompt into tokens, and schedules it with the other requests that are
waiting. Each step of the engine runs the model once over a batch of sequences and samples one new token for
every sequence in the batch. When a sequence reaches its stop condition, the server sends the final text back to
the client and frees the memory that held its keys and values.

A language model predicts the next token from the tokens before it. The attention layers look back over the
whole context, so the cost of a step grows with the length of the sequence. A cache of keys and values keeps
that cost small: the model only computes the new position and reads the old ones from memory.

Good tests are small and fast. They should build what they need, check one thing at a time, and clean up after
themselves. A test that downloads weights from the network is slow and fails when the network is down, so the
tests here build tiny random models on the fly and save them to a temporary directory.

Questions and answers:
What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.
Write a short poem about the sea. The sea is wide and deep and blue, it sings a song that is always new.
Please explain what a function is. A function is a named block of code that takes inputs and returns an output.

def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


for index, item in enumerate(["alpha", "beta", "gamma"]):
    print(f"{index}: {item}")

if __name__ == "__main__":
    counter = Counter()
    for _ in range(10):
        counter.increment()
    print(counter.value, fibonacci(10))

import json
import os

def load_config(path: str) -> dict:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)

{"model": "tiny", "messages": [{"role": "system", "content": "You are a helpful assistant."},
 {"role": "user", "content": "Hello! How are you today?"}], "max_tokens": 16, "temperature": 0.0}

function add(a, b) {
  return a + b;
}
const result = add(1, 2);
console.log(`The result is ${result}`);

SELECT name, count(*) FROM users WHERE active = 1 GROUP BY name ORDER BY name;

Numbers and dates: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024-01-31 12:30:45 3.14159 -1 +1 50% $20.
The weather today is sunny with a light wind from the west. Tomorrow it will rain in the morning and clear up
in the afternoon. People like to walk in the park when the weather is good, and they stay at home when it rains.

The engineer opened the file, read the error message, and found the line that raised it. The fix was small: a
missing check for an empty list. She wrote a test that failed without the fix and passed with it, then asked a
colleague to review the change before it was merged into the main branch.

# Tokens, bytes and text
Text is stored as bytes. A byte-level tokenizer can encode any string, including accents like café and naïve,
and scripts like 日本語, 中文 and русский, because every byte has a token of its own.
'''


def tiny_config(architecture: str = "LlamaForCausalLM", **overrides: object) -> transformers.PretrainedConfig:
    """A small config for ``architecture`` whose vocabulary and special ids match :func:`build_tokenizer`."""
    if architecture not in _CONFIG_CLASSES:
        raise ValueError(f"unsupported architecture {architecture!r}; expected one of {SUPPORTED_ARCHITECTURES}")
    kwargs: dict[str, object] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "tie_word_embeddings": False,
        # HF's default of 0.02 leaves logits nearly uniform at this width (std ~0.15): greedy picks
        # then hinge on gaps that rounding can flip, and decoding falls into short loops. 0.2 spreads
        # logits (std ~1.6) and gives varied greedy text; much larger makes attention near one-hot.
        "initializer_range": 0.2,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        **_ARCHITECTURE_DEFAULTS.get(architecture, {}),
        **overrides,
    }
    return _CONFIG_CLASSES[architecture](architectures=[architecture], **kwargs)


def train_byte_level_bpe(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int, chat_template: str,
                         model_max_length: int) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts`` with the project's special tokens, saved to ``out_dir`` as a
    standard HF tokenizer folder (the chat template inside tokenizer_config.json) and returned."""
    tokenizer = Tokenizer(models.BPE())
    # ByteLevel's regex keeps runs of spaces together, so indentation becomes a few whole tokens.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, so that text unlike the corpus (emoji, any script) still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return _save_hf_tokenizer(tokenizer, out_dir, chat_template, model_max_length)


def build_word_tokenizer(out_dir: str | os.PathLike, vocab_size: int,
                         model_max_length: int = MAX_POSITION_EMBEDDINGS) -> transformers.PreTrainedTokenizerFast:
    """A tokenizer as large as a real model's vocabulary: the special tokens, then one word per id ("w5" ..),
    split on whitespace. For random checkpoints of a real model's shape (benchmarks/gpu_check.sh): every
    sampled id decodes to text, and decoded text encodes back to the same ids."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update((f"w{i}", i) for i in range(len(SPECIAL_TOKENS), vocab_size))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=PAD_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _save_hf_tokenizer(tokenizer, out_dir, CHAT_TEMPLATE, model_max_length)


def _save_hf_tokenizer(tokenizer: Tokenizer, out_dir: str | os.PathLike, chat_template: str,
                       model_max_length: int) -> transformers.PreTrainedTokenizerFast:
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        chat_template=chat_template,
        model_max_length=model_max_length,
        # The cleanup rewrites " ." as "." and the like, which breaks decode(encode(text)) == text.
        clean_up_tokenization_spaces=False,
    )
    # In tokenizer_config.json (not chat_template.jinja), where every transformers version and other
    # runtimes look for it.
    hf_tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    return hf_tokenizer


def build_tokenizer(out_dir: str | os.PathLike,
                    model_max_length: int = MAX_POSITION_EMBEDDINGS) -> transformers.PreTrainedTokenizerFast:
    """Train the tiny byte-level BPE tokenizer, save it to ``out_dir`` and return it.

    Training is deterministic (fixed corpus and settings), so every call yields the same vocabulary.
    """
    return train_byte_level_bpe([_CORPUS], out_dir, VOCAB_SIZE, CHAT_TEMPLATE, model_max_length)


def build_tiny_checkpoint(
    out_dir: str | os.PathLike,
    architecture: str = "LlamaForCausalLM",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    with_tokenizer: bool = True,
    max_shard_size: str | None = None,
    **config_overrides: object,
) -> pathlib.Path:
    """Save a randomly initialised ``architecture`` model (and by default the tokenizer) to ``out_dir``.

    The same ``seed`` and config give the same weights; other dtypes are the float32 weights cast down.
    """
    out_dir = pathlib.Path(out_dir)
    config = tiny_config(architecture, **config_overrides)
    # Seeding the global generator is the only way to make HF's init reproducible; fork_rng keeps
    # that from changing the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _perturb_defaults(model, config.initializer_range)
    model.to(dtype)

    save_kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    # save_pretrained records dtype and architectures in config.json and writes generation_config.json.
    model.save_pretrained(out_dir, **save_kwargs)
    if with_tokenizer:
        build_tokenizer(out_dir, model_max_length=config.max_position_embeddings)
    return out_dir


@torch.no_grad()
def _perturb_defaults(model: torch.nn.Module, std: float) -> None:
    """Replace HF's constant inits (norm weights of one, zero biases) with random values.

    With the constants, a loader that forgets to load these tensors would still match the reference.
    """
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "weight"):
            module.weight.normal_(mean=1.0, std=0.2)
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            param.normal_(mean=0.0, std=std)
    if type(model).__name__.startswith("DeepseekV4"):
        _perturb_deepseek_v4(model, std)
    if type(model).__name__.startswith("NemotronH"):
        # Mamba2's skip weight D and its gated norm (a "...RMSNormGated") start at one.
        for name, param in model.named_parameters():
            if name.endswith(("mixer.D", "mixer.norm.weight")):
                param.normal_(mean=1.0, std=0.2)


@torch.no_grad()
def _perturb_deepseek_v4(model: torch.nn.Module, std: float) -> None:
    """DeepSeek-V4 initialises sinks, compressor position biases and hyper-connection biases to zero, the
    routers' correction bias to zero and the hash table to expert 0 for every token: random values instead
    (a hash table row holds distinct experts, as a real one does)."""
    for name, param in model.named_parameters():
        if name.endswith(("sinks", "position_bias", "_hc.base", "hc_base")):
            param.normal_(mean=0.0, std=std)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.normal_(mean=0.0, std=0.5)
        elif name.endswith("tid2eid"):
            num_experts = model.config.n_routed_experts
            buffer.copy_(torch.rand(buffer.shape[0], num_experts).argsort(dim=-1)[:, : buffer.shape[1]])
