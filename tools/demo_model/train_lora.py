"""Train a demo LoRA adapter for the demo target on one package of the corpus, so its style shows in greedy output.

The adapter (peft ``LoraConfig``: rank 8, alpha 16, no dropout, on every attention and MLP projection) is
fine-tuned on the corpus' train files below ``--subset`` (default ``tkinter/``: Tk widget classes whose methods
wrap Tcl commands, ``self.tk.call(self._w, ...)``). The subset's held-out text is the last tenth of each of those
files plus the subset's files in the shipped held-out text; the adapter never trains on it (the base did on the
former). Batches, loss and LR schedule are those of :mod:`tools.demo_model.train` with this run's steps, so the run
is reproducible from ``--seed``, which also seeds the LoRA init. Training is float32 on the CPU; the A/B matrices
are exported as bfloat16 with PEFT's ``save_pretrained``, then reloaded with ``PeftModel.from_pretrained`` to
report held-out losses and greedy samples with the adapter and without it.

Usage:
    python -m tools.demo_model.train_lora --out rapid_llm/demo_models/lora-tkinter [--subset tkinter/]
        [--base rapid_llm/demo_models/target] [--steps 300] [--max-minutes 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import time

import torch
import transformers

from tools.demo_model import data
from tools.demo_model.presets import PRESETS, Preset
from tools.demo_model.train import ADAMW, GRAD_CLIP, _loss, batch, held_out_loss, learning_rate, tokenize

try:  # not a rapid_llm dependency: only this tool needs it (pip install peft)
    import peft
except ImportError:
    peft = None

DEFAULT_BASE = pathlib.Path(__file__).resolve().parents[2] / "rapid_llm" / "demo_models" / "target"
BASE_MODEL_NAME = "demo-target"  # adapter_config.json's base_model_name_or_path: the server's name for the target
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DOMAIN_HELD_OUT_FRACTION = 0.1  # of each subset file's lines, the last ones, held out from the adapter
EVAL_EVERY = 50
SAMPLE_PROMPTS = ["def", "class Foo", "    def __init__(self", "import"]
SAMPLE_NEW_TOKENS = 40


def subset_split(train_texts: dict[str, str], held_out_texts: dict[str, str], prefix: str,
                 held_out_fraction: float = DOMAIN_HELD_OUT_FRACTION) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, held_out)`` texts of the files below ``prefix``: the last ``held_out_fraction`` of each train
    file's lines is held out (a package's style may live in a few big files, so a split by file would not keep
    it on both sides), and so are the prefix's files of the shipped held-out text."""
    train: dict[str, str] = {}
    held_out = {path: text for path, text in held_out_texts.items() if path.startswith(prefix)}
    for path, text in train_texts.items():
        if path.startswith(prefix):
            lines = text.splitlines(keepends=True)
            cut = len(lines) - int(held_out_fraction * len(lines))
            train[path], held_out[f"{path} (last lines)"] = "".join(lines[:cut]), "".join(lines[cut:])
    if not train:
        raise ValueError(f"no train file of the corpus lies below --subset {prefix!r}")
    return train, {path: text for path, text in held_out.items() if text}


def build_adapter(base: pathlib.Path, seed: int, rank: int, alpha: int) -> torch.nn.Module:
    """The float32 base with a freshly initialised LoRA adapter (A seeded by ``seed``, B zero)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGET_MODULES,
                             task_type="CAUSAL_LM")
    # peft initialises A from the global generator; fork_rng keeps the seeding local to this call.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.get_peft_model(model, config)
    model.peft_config["default"].base_model_name_or_path = BASE_MODEL_NAME
    return model


def train_adapter(model: torch.nn.Module, tokens: torch.Tensor, schedule: Preset, seed: int,
                  max_minutes: float | None, held_out: torch.Tensor) -> int:
    """Run ``schedule`` (steps, batch, LR) over ``tokens``, or until ``max_minutes``; the number of steps done.
    Every ``EVAL_EVERY`` steps the loss on ``held_out`` is printed."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=schedule.lr, **{**ADAMW, "weight_decay": 0.0})
    deadline = math.inf if max_minutes is None else time.monotonic() + 60 * max_minutes
    started = time.monotonic()
    model.train()
    step = 0
    while step < schedule.steps and time.monotonic() < deadline:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        loss = _loss(model, batch(tokens, seed, step, schedule.batch_size, schedule.seq_len))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 10 == 0 or step == schedule.steps:
            print(f"step {step}/{schedule.steps} loss {loss.item():.3f} "
                  f"{(time.monotonic() - started) / step:.2f} s/step", flush=True)
        if step % EVAL_EVERY == 0:
            print(f"step {step}: held-out loss {held_out_loss(model, held_out, schedule.seq_len):.3f}", flush=True)
    return step


def export_adapter(model: torch.nn.Module, out: pathlib.Path) -> None:
    """PEFT's ``adapter_config.json`` and ``adapter_model.safetensors`` (bf16 A/B) in ``out``, and nothing else."""
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.to(torch.bfloat16)
    model.save_pretrained(out, save_embedding_layers=False)  # no embedding is adapted: skip the hub lookup
    # save_pretrained also writes a template model card; the folder's documentation is demo_models/README.md.
    (out / "README.md").unlink(missing_ok=True)


@torch.no_grad()
def greedy(model: torch.nn.Module, tokenizer: transformers.PreTrainedTokenizerBase, prompt: str) -> str:
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False).input_ids]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=SAMPLE_NEW_TOKENS,
                         do_sample=False)
    return tokenizer.decode(out[0, 1:], skip_special_tokens=True)


def report(base: pathlib.Path, adapter: pathlib.Path, held_out: dict[str, torch.Tensor], seq_len: int) -> None:
    """Reload the exported adapter onto the base; print held-out losses and greedy samples without and with it."""
    model = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    for name, tokens in held_out.items():
        with model.disable_adapter():
            base_loss = held_out_loss(model, tokens, seq_len)
        print(f"held-out loss, {name}: base {base_loss:.3f}, base+adapter {held_out_loss(model, tokens, seq_len):.3f}",
              flush=True)
    model.eval()
    for prompt in SAMPLE_PROMPTS:
        with model.disable_adapter():
            print(f"base    {prompt!r}: {greedy(model, tokenizer, prompt)!r}", flush=True)
        print(f"adapter {prompt!r}: {greedy(model, tokenizer, prompt)!r}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="adapter folder to write")
    parser.add_argument("--base", type=pathlib.Path, default=DEFAULT_BASE, help="HF folder of the demo target")
    parser.add_argument("--subset", default="tkinter/", help="train on the corpus files whose path starts so")
    parser.add_argument("--stdlib", type=pathlib.Path, default=data.DEFAULT_STDLIB)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--max-minutes", type=float, help="stop training early (the adapter is exported anyway)")
    args = parser.parse_args(argv)
    if peft is None:
        parser.error("this tool needs peft: pip install peft")
    torch.set_num_threads(args.threads)
    schedule = dataclasses.replace(PRESETS["target"], steps=args.steps, batch_size=args.batch_size,
                                   seq_len=args.seq_len, lr=args.lr, warmup_steps=max(1, args.steps // 20))
    general = data.load_held_out()
    train_texts, domain_texts = subset_split(data.load_train(args.stdlib), general, args.subset)
    train_tokens = tokenize(train_texts.values(), args.base)
    domain_tokens = tokenize(domain_texts.values(), args.base)
    held_out = {f"{args.subset} held out ({len(domain_texts)} texts, {domain_tokens.numel()} tokens)": domain_tokens,
                "general held-out text": tokenize(general.values(), args.base)}
    print(f"{args.subset}: {len(train_texts)} train files, {train_tokens.numel()} tokens; held out: "
          f"{', '.join(sorted(domain_texts))}", flush=True)
    model = build_adapter(args.base, args.seed, args.rank, args.alpha)
    started = time.monotonic()
    steps = train_adapter(model, train_tokens, schedule, args.seed, args.max_minutes, domain_tokens)
    minutes = (time.monotonic() - started) / 60
    print(f"trained {steps}/{schedule.steps} steps in {minutes:.1f} min "
          f"({steps * schedule.batch_size * schedule.seq_len} tokens)", flush=True)
    export_adapter(model, args.out)
    print(f"exported to {args.out}: {', '.join(sorted(p.name for p in args.out.iterdir()))}", flush=True)
    report(args.base, args.out, held_out, schedule.seq_len)


if __name__ == "__main__":
    main()
