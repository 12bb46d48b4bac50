"""Tests for the tiny random checkpoints and the local tokenizer that the rest of the suite builds on."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from rapid_llm.utils.tiny_checkpoint import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    IM_END_TOKEN_ID,
    IM_START_TOKEN_ID,
    PAD_TOKEN_ID,
    SUPPORTED_ARCHITECTURES,
    VOCAB_SIZE,
    build_tiny_checkpoint,
    build_tokenizer,
    build_word_tokenizer,
    tiny_config,
)

UNICODE_TEXT = "Hello,  world!\n\tdef f(x): return x ** 2  # café, naïve 日本語のテキスト русский 🦙🚀 e\u0301 \u200b"
# One per-expert matrix each MoE checkpoint holds under the Hub's name (DeepSeek-V4: DeepSeek's own names).
EXPERT_MATRIX_NAMES = {"Qwen3MoeForCausalLM": "model.layers.0.mlp.experts.3.down_proj.weight",
                       "Qwen2MoeForCausalLM": "model.layers.0.mlp.experts.3.down_proj.weight",
                       "MixtralForCausalLM": "model.layers.0.block_sparse_moe.experts.3.w2.weight",
                       "DeepseekV4ForCausalLM": "model.layers.0.ffn.experts.3.w2.weight",
                       "Qwen3NextForCausalLM": "model.layers.0.mlp.experts.3.down_proj.weight",
                       "Qwen3_5MoeForCausalLM": "model.layers.0.mlp.experts.3.down_proj.weight"}
PROMPT_IDS = torch.tensor([[BOS_TOKEN_ID, 40, 41, 300, 301, 7, 8, 9, 450, 10]])


def _logits(model: transformers.PreTrainedModel) -> torch.Tensor:
    with torch.no_grad():
        return model(PROMPT_IDS).logits.float()


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_checkpoint_reloads_with_the_same_logits(tmp_path, architecture):
    out_dir = build_tiny_checkpoint(tmp_path, architecture, seed=3)

    config = json.loads((out_dir / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert config["dtype"] == "float32"
    assert config["vocab_size"] == VOCAB_SIZE
    generation_config = json.loads((out_dir / "generation_config.json").read_text())
    assert generation_config["bos_token_id"] == BOS_TOKEN_ID
    assert generation_config["eos_token_id"] == EOS_TOKEN_ID
    assert (out_dir / "model.safetensors").is_file()

    # A second build with the same seed must give the same weights: tests rely on that for references.
    rebuilt = build_tiny_checkpoint(tmp_path / "again", architecture, seed=3, with_tokenizer=False)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    saved = load_file(out_dir / "model.safetensors")
    if architecture == "NemotronHForCausalLM":
        # The file names the base model `backbone` (the Hub's name), which transformers loads as `model`.
        saved = {name.replace("backbone.", "model.", 1): tensor for name, tensor in saved.items()}
    state = loaded.state_dict()
    if architecture in EXPERT_MATRIX_NAMES:
        # The file keeps the Hub's per-expert matrices, which transformers stacks when it loads them.
        assert sum(t.numel() for t in saved.values()) == sum(t.numel() for t in state.values())
        assert EXPERT_MATRIX_NAMES[architecture] in saved
    else:
        assert saved.keys() == state.keys()
    for name in saved.keys() & state.keys():
        assert torch.equal(state[name], saved[name]), name
    reference = transformers.AutoModelForCausalLM.from_pretrained(rebuilt)
    torch.testing.assert_close(_logits(loaded), _logits(reference), rtol=0, atol=0)

    other_seed = build_tiny_checkpoint(tmp_path / "other", architecture, seed=4, with_tokenizer=False)
    assert not torch.equal(_logits(transformers.AutoModelForCausalLM.from_pretrained(other_seed)), _logits(loaded))


def test_weights_are_loud_enough_for_varied_greedy_output(tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint(tmp_path, with_tokenizer=False))
    output = model.generate(
        PROMPT_IDS, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=PAD_TOKEN_ID
    )
    assert len(set(output[0, PROMPT_IDS.shape[1] :].tolist())) >= 8

    # HF initialises norm weights to one and biases to zero; random values catch a loader that skips them.
    norm_weight = model.model.layers[0].input_layernorm.weight
    assert not torch.equal(norm_weight, torch.ones_like(norm_weight))


def test_qwen_specifics(tmp_path):
    qwen2 = transformers.AutoModelForCausalLM.from_pretrained(
        build_tiny_checkpoint(tmp_path / "qwen2", "Qwen2ForCausalLM", with_tokenizer=False)
    )
    q_bias = qwen2.model.layers[0].self_attn.q_proj.bias
    assert q_bias is not None and q_bias.abs().sum() > 0

    qwen3 = tiny_config("Qwen3ForCausalLM")
    assert qwen3.head_dim != qwen3.hidden_size // qwen3.num_attention_heads


def test_overrides_and_dtype(tmp_path):
    out_dir = build_tiny_checkpoint(
        tmp_path,
        "MistralForCausalLM",
        dtype=torch.bfloat16,
        with_tokenizer=False,
        num_hidden_layers=3,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    )
    config = json.loads((out_dir / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert config["num_hidden_layers"] == 3
    assert config["tie_word_embeddings"] is True
    assert config["rope_parameters"]["rope_type"] == "linear"
    assert not (out_dir / "tokenizer.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    assert model.dtype == torch.bfloat16


def test_unknown_architecture_is_rejected():
    with pytest.raises(ValueError, match="unsupported architecture"):
        tiny_config("GPT2LMHeadModel")


def test_sharded_save_writes_an_index(tmp_path):
    out_dir = build_tiny_checkpoint(tmp_path, "Qwen2ForCausalLM", max_shard_size="200KB", with_tokenizer=False)

    shards = sorted(out_dir.glob("*.safetensors"))
    assert len(shards) >= 3
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {shard.name for shard in shards}

    model = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    assert set(index["weight_map"]) == set(model.state_dict())


def test_tokenizer_round_trips_and_reloads(tmp_path):
    build_tokenizer(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)

    assert len(tokenizer) == VOCAB_SIZE
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        BOS_TOKEN_ID,
        EOS_TOKEN_ID,
        PAD_TOKEN_ID,
    )
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START_TOKEN_ID, IM_END_TOKEN_ID]

    ids = tokenizer.encode(UNICODE_TEXT)
    assert ids[0] != BOS_TOKEN_ID
    assert tokenizer.decode(ids) == UNICODE_TEXT
    # Merges learnt from the corpus must actually compress English text.
    assert len(tokenizer.encode("The server reads the request.")) < len("The server reads the request.") // 2


def test_word_tokenizer_covers_a_real_vocabulary_and_round_trips(tmp_path):
    build_word_tokenizer(tmp_path, 128256)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 128256
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID)
    ids = [5, 77, 128255, 1000]
    assert [tokenizer.decode([i]) for i in ids] == ["w5", "w77", "w128255", "w1000"]  # every id is text
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_chat_template(tmp_path):
    tokenizer = build_tokenizer(tmp_path)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi 👋"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 👋<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert without_prompt == text.removesuffix("<|im_start|>assistant\n")

    ids = tokenizer.encode(text)
    assert ids.count(IM_START_TOKEN_ID) == 5 and ids.count(IM_END_TOKEN_ID) == 4
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace(
        "<|im_end|>", ""
    )


def test_tokenizer_is_deterministic(tmp_path):
    first = build_tokenizer(tmp_path / "a")
    second = build_tokenizer(tmp_path / "b")
    assert first.get_vocab() == second.get_vocab()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
