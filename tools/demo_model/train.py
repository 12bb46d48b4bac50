"""Train one demo-model preset with a plain torch loop; resumes from its own work directory.

Reproducible by construction: the initial weights come from ``--seed``, and the batch of step ``s``
is drawn from a generator seeded with ``(seed, s)``, so a resumed run sees exactly the batches an
uninterrupted one would; the LR (linear warmup, cosine to 10 %) is a function of the step alone.
Training is float32 (this machine's CPUs have no bf16 instructions -- no AVX512-BF16 or AMX -- so
bf16 autocast was not tried); exports are bfloat16. The ``moe`` preset starts from an upcycled copy of ``--init-from`` (the trained draft).

Usage:
    python -m tools.demo_model.train --preset target --work-dir W --out OUT [--max-minutes M]
    python -m tools.demo_model.train --preset moe --init-from OUT_TARGET --work-dir W2 --out OUT2
    python -m tools.demo_model.train --preset draft-1l-kd --init-from OUT_1L --teacher OUT_TARGET --work-dir W3 --out OUT3
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import time
from collections.abc import Iterable

import torch
import transformers
from tqdm import tqdm

from tools.demo_model import data
from tools.demo_model.checkpoint import export, load_state, save_state
from tools.demo_model.presets import PRESETS, Preset
from tools.demo_model.tokenizer import ARTIFACT_DIR
from tools.demo_model.upcycle import upcycle

ADAMW = {"betas": (0.9, 0.95), "weight_decay": 0.1}
GRAD_CLIP = 1.0
EVAL_MAX_TOKENS = 32_768


@dataclasses.dataclass
class TrainResult:
    step: int
    finished: bool
    tokens_per_s: float
    held_out_loss: float


def tokenize(texts: Iterable[str], tokenizer_dir: pathlib.Path = ARTIFACT_DIR) -> torch.Tensor:
    """All ``texts`` as one token stream, each text wrapped in BOS ... EOS."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    encodings = tokenizer.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False)
    ids = [token for e in encodings for token in (tokenizer.bos_token_id, *e.ids, tokenizer.eos_token_id)]
    return torch.tensor(ids, dtype=torch.long)


def batch(tokens: torch.Tensor, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """``batch_size`` random windows of ``seq_len + 1`` tokens, the same for the same (seed, step)."""
    if len(tokens) <= seq_len + 1:
        raise ValueError(f"corpus of {len(tokens)} tokens is too short for seq_len {seq_len}")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([tokens[start:start + seq_len + 1] for start in starts.tolist()])


def learning_rate(preset: Preset, step: int) -> float:
    if step < preset.warmup_steps:
        return preset.lr * (step + 1) / preset.warmup_steps
    progress = (step - preset.warmup_steps) / max(1, preset.steps - preset.warmup_steps)
    return preset.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def held_out_loss(model: transformers.PreTrainedModel, tokens: torch.Tensor, seq_len: int,
                  max_tokens: int = EVAL_MAX_TOKENS) -> float:
    """Mean next-token loss over consecutive ``seq_len`` windows of the first ``max_tokens`` tokens."""
    windows = tokens[: max_tokens + 1].unfold(0, seq_len + 1, seq_len)
    if len(windows) == 0:
        raise ValueError(f"{len(tokens)} held-out tokens are too few for seq_len {seq_len}")
    model.eval()
    total = sum(_loss(model, chunk).item() * len(chunk) for chunk in windows.split(8))
    model.train()
    return total / len(windows)


def _loss(model: transformers.PreTrainedModel, chunk: torch.Tensor,
          teacher: transformers.PreTrainedModel | None = None) -> torch.Tensor:
    """Next-token cross-entropy, or with a teacher KL(teacher || model) per position."""
    logits = model(input_ids=chunk[:, :-1]).logits
    if teacher is None:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())
    with torch.no_grad():
        target = teacher(input_ids=chunk[:, :-1]).logits.log_softmax(dim=-1)
    return torch.nn.functional.kl_div(logits.log_softmax(dim=-1).flatten(0, 1), target.flatten(0, 1),
                                      reduction="batchmean", log_target=True)


def build_model(preset: Preset, seed: int, init_from: pathlib.Path | None) -> transformers.PreTrainedModel:
    """The step-0 float32 model: seeded random init, or ``init_from`` (upcycled for an MoE preset)."""
    # grouped_mm runs the experts as one kernel; the default per-expert loop is several times slower.
    kwargs = {"experts_implementation": "grouped_mm"} if preset.num_experts else {}
    generator = torch.Generator().manual_seed(seed)
    if preset.upcycle_from is not None:
        if init_from is None:
            raise ValueError(f"this preset is upcycled from the {preset.upcycle_from!r} preset: pass --init-from")
        dense = transformers.AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
        return upcycle(dense, preset.config(), generator, **kwargs) if preset.num_experts else dense
    # HF's init draws from the global generator; fork_rng keeps the seeding local to this call.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(preset.config(), dtype=torch.float32, **kwargs)


def train(preset: Preset, train_tokens: torch.Tensor, held_out_tokens: torch.Tensor, work_dir: pathlib.Path,
          out_dir: pathlib.Path, *, seed: int = 0, init_from: pathlib.Path | None = None,
          checkpoint_every: int = 50, max_minutes: float | None = None, stop_at: int | None = None,
          teacher: transformers.PreTrainedModel | None = None) -> TrainResult:
    """Train ``preset`` from the state in ``work_dir`` (if any) and export the weights to ``out_dir``.

    Stops at the end of the schedule, at step ``stop_at``, or after ``max_minutes``, whichever comes
    first; the state is saved then, so the next call carries on from there.
    """
    model = build_model(preset, seed, init_from)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, **ADAMW)
    step = 0
    state = load_state(work_dir, model.config)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step = state["step"]
    last = preset.steps if stop_at is None else min(stop_at, preset.steps)
    deadline = math.inf if max_minutes is None else time.monotonic() + 60 * max_minutes
    tokens_per_step = preset.batch_size * preset.seq_len
    started, start_step = time.monotonic(), step
    model.train()
    # miniters=1: tqdm's adaptive default goes quiet for minutes when the step time varies (shared CPUs).
    with tqdm(total=preset.steps, initial=step, desc="train", mininterval=5, miniters=1,
              dynamic_ncols=True) as progress:
        while step < last and time.monotonic() < deadline:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(preset, step)
            loss = _loss(model, batch(train_tokens, seed, step, preset.batch_size, preset.seq_len), teacher)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            rate = (step - start_step) * tokens_per_step / (time.monotonic() - started)
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{rate:.0f}")
            if step % checkpoint_every == 0:
                save_state(work_dir, model, optimizer, step)
    save_state(work_dir, model, optimizer, step)
    export(model, out_dir)
    elapsed = time.monotonic() - started
    rate = (step - start_step) * tokens_per_step / elapsed if step > start_step else 0.0
    return TrainResult(step, step >= preset.steps, rate, held_out_loss(model, held_out_tokens, preset.seq_len))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--work-dir", type=pathlib.Path, required=True, help="resumable state lives here")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="HF folder to export to")
    parser.add_argument("--init-from", type=pathlib.Path, help="trained HF folder of the preset's upcycle_from")
    parser.add_argument("--teacher", type=pathlib.Path, help="trained HF folder of the preset's distill_from")
    parser.add_argument("--stdlib", type=pathlib.Path, default=data.DEFAULT_STDLIB)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--max-minutes", type=float)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if (preset.distill_from is None) != (args.teacher is None):
        parser.error(f"--teacher is the trained {preset.distill_from!r} folder for this preset, and only for it")
    teacher = None if args.teacher is None else transformers.AutoModelForCausalLM.from_pretrained(
        args.teacher, dtype=torch.float32).eval()
    train_tokens = tokenize(data.load_train(args.stdlib).values())
    held_out_tokens = tokenize(data.load_held_out().values())
    print(f"{args.preset}: {train_tokens.numel()} train tokens, {held_out_tokens.numel()} held-out tokens", flush=True)
    result = train(preset, train_tokens, held_out_tokens, args.work_dir, args.out, seed=args.seed,
                   init_from=args.init_from, checkpoint_every=args.checkpoint_every, max_minutes=args.max_minutes,
                   teacher=teacher)
    status = "finished" if result.finished else f"stopped early (rerun to resume to step {preset.steps})"
    print(f"{args.preset}: step {result.step}/{preset.steps} {status}; {result.tokens_per_s:.0f} tokens/s; "
          f"held-out loss {result.held_out_loss:.3f}; exported to {args.out}", flush=True)


if __name__ == "__main__":
    main()
