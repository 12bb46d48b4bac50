"""The demo-model tools: corpus split, tokenizer, upcycling, and resumable training of a tiny preset."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch
import transformers

from tools.demo_model import data
from tools.demo_model.presets import PRESETS
from tools.demo_model.tokenizer import ARTIFACT_DIR, train_tokenizer
from tools.demo_model.train import _loss, tokenize, train
from tools.demo_model.upcycle import upcycle

TINY = PRESETS["tiny"]
TINY_MOE = dataclasses.replace(TINY, architecture="Qwen3MoeForCausalLM", num_experts=4, upcycle_from="tiny")
MANIFEST = json.loads((data.DATA_DIR / data.MANIFEST_NAME).read_text())
# Regeneration is only meaningful on the Python whose standard library the shipped split came from.
SAME_STDLIB = data.DEFAULT_STDLIB.is_dir() and MANIFEST["source"] == data.SOURCE


@pytest.fixture(scope="module")
def held_out() -> dict[str, str]:
    return data.load_held_out()


@pytest.fixture(scope="module")
def held_out_tokens(held_out: dict[str, str]) -> torch.Tensor:
    return tokenize(list(held_out.values())[:3])


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory: pytest.TempPathFactory, held_out_tokens: torch.Tensor) -> pathlib.Path:
    """The exported folder of the tiny preset after its four steps."""
    root = tmp_path_factory.mktemp("tiny")
    train(TINY, held_out_tokens, held_out_tokens[:200], root / "work", root / "out")
    return root / "out"


def test_split_is_deterministic_disjoint_and_capped() -> None:
    sizes = {f"pkg/module_{i}.py": 1000 + 37 * i for i in range(200)}
    train_files, held_out_files = data.split(sizes, max_held_out_bytes=20_000)
    assert data.split(dict(reversed(sizes.items())), max_held_out_bytes=20_000) == (train_files, held_out_files)
    assert not set(train_files) & set(held_out_files)
    assert set(train_files) | set(held_out_files) == set(sizes)
    assert 0 < sum(sizes[p] for p in held_out_files) <= 20_000


def test_shipped_split_is_disjoint_and_within_the_cap(held_out: dict[str, str]) -> None:
    assert sorted(held_out) == MANIFEST["held_out"]
    assert not {entry["path"] for entry in MANIFEST["train"]} & set(held_out)
    assert 0 < sum(len(text.encode()) for text in held_out.values()) <= data.HELD_OUT_MAX_BYTES
    assert (data.DATA_DIR / data.LICENSE_NAME).read_text().startswith("A. HISTORY OF THE SOFTWARE")


def test_join_files_round_trips_and_rejects_texts_it_could_not_split_back() -> None:
    texts = {"b.py": "x = 1\n", "a/c.py": "# comment\n", "empty.py": ""}
    assert data.split_files(data.join_files(texts)) == texts
    with pytest.raises(data.CorpusError, match="separator"):
        data.join_files({"bad.py": data.SEPARATOR.format(path="other.py")})
    with pytest.raises(data.CorpusError, match="newline"):
        data.join_files({"a.py": "x = 1"})


@pytest.mark.skipif(not SAME_STDLIB, reason="needs the standard library the shipped split was made from")
def test_regenerating_the_split_reproduces_the_shipped_files(tmp_path: pathlib.Path) -> None:
    data.write_split(data.DEFAULT_STDLIB, tmp_path)
    for name in (data.MANIFEST_NAME, data.HELD_OUT_NAME, data.LICENSE_NAME):
        assert (tmp_path / name).read_bytes() == (data.DATA_DIR / name).read_bytes(), name
    data.verify(data.DEFAULT_STDLIB, data.DATA_DIR)


def test_shipped_tokenizer_round_trips_python_source(held_out: dict[str, str]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(ARTIFACT_DIR)
    assert len(tokenizer) == 8192
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    for text in list(held_out.values())[:5] + ["\tx = 'café ☃'  \n\n    return  x\r\n"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("def main() -> None:\n    return\n")) < 12


def test_chat_template_renders_turns_and_tools() -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(ARTIFACT_DIR)
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    rendered = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|bos|><|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n" + json.dumps(tool) + "\n</tools><|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert plain == "<|bos|><|im_start|>user\n1+1?<|im_end|>\n"
    with pytest.raises(Exception, match="Unsupported chat role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_train_tokenizer_saves_a_folder_autotokenizer_loads(tmp_path: pathlib.Path) -> None:
    texts = ["def f(x):\n    return x + 1\n" * 20, "class A:\n    pass\n" * 20]
    train_tokenizer(texts, tmp_path, vocab_size=270)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == 270 and loaded.decode(loaded.encode(texts[0])) == texts[0]


def test_training_resumes_to_identical_weights(tmp_path: pathlib.Path, held_out_tokens: torch.Tensor) -> None:
    whole = train(TINY, held_out_tokens, held_out_tokens[:200], tmp_path / "w1", tmp_path / "o1")
    first = train(TINY, held_out_tokens, held_out_tokens[:200], tmp_path / "w2", tmp_path / "o2", stop_at=2)
    assert (first.step, first.finished) == (2, False)
    resumed = train(TINY, held_out_tokens, held_out_tokens[:200], tmp_path / "w2", tmp_path / "o2")
    assert (whole.step, resumed.step, resumed.finished) == (4, 4, True)
    a = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "o1", dtype=torch.float32).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "o2", dtype=torch.float32).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    train(dataclasses.replace(TINY, lr=1e-2), held_out_tokens, held_out_tokens[:200], tmp_path / "w3",
          tmp_path / "o3")
    c = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "o3", dtype=torch.float32).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_exported_folder_loads_in_transformers_as_bfloat16(tiny_dense: pathlib.Path) -> None:
    assert json.loads((tiny_dense / "config.json").read_text())["dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dense)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dense)
    assert model.dtype == torch.bfloat16
    prompt = tokenizer("import os\n", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, prompt["input_ids"].shape[1] + 4)


def test_moe_preset_trains_from_the_upcycled_dense_export(tmp_path: pathlib.Path, tiny_dense: pathlib.Path,
                                                         held_out_tokens: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="--init-from"):
        train(TINY_MOE, held_out_tokens, held_out_tokens[:200], tmp_path / "w0", tmp_path / "o0")
    result = train(TINY_MOE, held_out_tokens, held_out_tokens[:200], tmp_path / "w", tmp_path / "out",
                   init_from=tiny_dense)
    assert result.finished
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.num_experts == 4


def test_upcycled_moe_copies_the_dense_model() -> None:
    dense = transformers.AutoModelForCausalLM.from_config(TINY.config())
    moe = upcycle(dense, TINY_MOE.config(), torch.Generator().manual_seed(0))
    dense_state, moe_state = dense.state_dict(), moe.state_dict()
    assert torch.equal(moe_state["model.layers.1.self_attn.o_proj.weight"],
                       dense_state["model.layers.1.self_attn.o_proj.weight"])
    down = dense_state["model.layers.1.mlp.down_proj.weight"]
    experts = moe_state["model.layers.1.mlp.experts.down_proj"]
    assert experts.shape == (4, *down.shape)
    assert torch.allclose(experts, down.expand_as(experts), atol=0.01 * down.abs().max().item())
    assert not torch.equal(experts[0], experts[1])
    logits = moe(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, TINY.config().vocab_size)


def test_distillation_fits_the_teacher_and_starts_from_the_copied_student(tmp_path: pathlib.Path,
                                                                          tiny_dense: pathlib.Path,
                                                                          held_out_tokens: torch.Tensor) -> None:
    """A dense preset with upcycle_from starts as a copy of --init-from; with a teacher the loss is the KL from
    the teacher's next-token distribution: zero when the student is the teacher, and training lowers it."""
    teacher = transformers.AutoModelForCausalLM.from_config(TINY.config(), dtype=torch.float32).eval()
    student = transformers.AutoModelForCausalLM.from_pretrained(tiny_dense, dtype=torch.float32)
    chunk = held_out_tokens[: 2 * 17].view(2, 17)
    assert _loss(teacher, chunk, teacher).item() == pytest.approx(0.0, abs=1e-6)
    before = _loss(student, chunk, teacher).item()
    distilled = dataclasses.replace(TINY, steps=8, lr=1e-2, upcycle_from="tiny", distill_from="tiny")
    train(distilled, held_out_tokens, held_out_tokens[:200], tmp_path / "w", tmp_path / "out", init_from=tiny_dense,
          teacher=teacher)
    after = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert 0 < _loss(after, chunk, teacher).item() < before
