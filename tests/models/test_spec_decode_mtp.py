"""The MTP proposer end to end (scheduler + worker in one process) on a tiny random DeepSeek-V3 whose checkpoint
holds one MTP layer: every draft's logits, step after step (catch-up after prefill and after verification, the
recurrence for drafts 2..k, scratch blocks), equal a reference built from transformers' decoder layer and plain
torch; greedy tokens with MTP equal those without it (and transformers') in the draft model's five modes, with
block accounting checked after every result; seeded sampling is reproducible; targets without MTP layers are
refused naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.sampling import SamplingParams
from tests.models.test_spec_decode import MODES, check_mode_stats
from tests.models.test_spec_decode_draft import GREEDY, MAX_TOKENS, _runner, _serve

V3 = "DeepseekV3ForCausalLM"
LAYERS = 2  # the target's decoder layers; the checkpoint's layer 2 is its MTP layer
PROMPTS = [[5, 9, 17, 33] * 4, [40, 41, 42], [5, 9, 17, 33] * 4, list(range(60, 80))]
SAMPLED = [SamplingParams(temperature=1.5, seed=21 + i, max_tokens=MAX_TOKENS, ignore_eos=True) for i in range(4)]


def _spec(k: int = 3, method: str = "mtp") -> SpeculativeConfig:
    return SpeculativeConfig(method=method, num_speculative_tokens=k)


def _with_mtp_layers(tiny_checkpoint, directory: Path, count: int) -> tuple[Path, Path]:
    """(source, target): a random V3 of LAYERS + count layers and a copy declaring LAYERS layers plus `count` MTP
    layers, each the source's layer LAYERS + i with random enorm/hnorm/eh_proj/shared_head added (and the
    embedding copy real checkpoints carry)."""
    source = tiny_checkpoint(V3, num_hidden_layers=LAYERS + count)
    target = directory / "ckpt"
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    vocab, hidden = tensors["model.embed_tokens.weight"].shape
    generator = torch.Generator().manual_seed(7)

    def normal(*shape: int, mean: float = 0.0, std: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std + mean

    for index in range(LAYERS, LAYERS + count):
        prefix = f"model.layers.{index}."
        tensors |= {prefix + "enorm.weight": normal(hidden, mean=1.0),
                    prefix + "hnorm.weight": normal(hidden, mean=1.0),
                    prefix + "eh_proj.weight": normal(hidden, 2 * hidden, std=0.1),
                    prefix + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
                    prefix + "shared_head.norm.weight": normal(hidden, mean=1.0),
                    prefix + "shared_head.head.weight": normal(vocab, hidden)}
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config |= {"num_hidden_layers": LAYERS, "num_nextn_predict_layers": count}
    (target / "config.json").write_text(json.dumps(config))
    return source, target


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    return _with_mtp_layers(tiny_checkpoint, tmp_path_factory.mktemp("mtp"), 1)


@pytest.fixture(scope="module")
def runners(checkpoints):
    _, target = checkpoints
    off = _runner(str(target), None)
    return _runner(str(target), _spec()), off, _serve(off, PROMPTS, GREEDY, None, "lockstep")[0]


class Reference:
    """The MTP head computed from transformers: the 3-layer source model's layers 0-1 give the target's states
    h_t (the residual stream after layer 1) and its layer 2 is the MTP decoder layer; enorm, hnorm, eh_proj and
    shared_head in plain torch."""

    def __init__(self, source: Path, target: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="sdpa")
        self.tensors = load_file(target / "model.safetensors")
        self.eps = self.model.config.rms_norm_eps
        self.states: list[torch.Tensor] = []
        self.model.model.layers[LAYERS - 1].register_forward_hook(lambda module, args, out: self.states.append(out))

    def _mtp(self, name: str) -> torch.Tensor:
        return self.tensors[f"model.layers.{LAYERS}.{name}.weight"]

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self._mtp(name) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    @torch.no_grad()
    def draft_logits(self, known: list[int], drafts: list[int]) -> list[torch.Tensor]:
        """Logits of draft 1..len(drafts) + 1 after `known` tokens, draft j + 1 fed draft j."""
        self.states.clear()
        self.model(torch.tensor([known[:-1]]))
        previous = self.states[-1][0]  # h_0 .. h_{n-2}
        tokens = known[1:]
        logits = []
        for draft in [*drafts, None]:
            embeds = self.model.model.embed_tokens(torch.tensor(tokens))
            fused = torch.cat((self._norm(embeds, "enorm"), self._norm(previous, "hnorm")), dim=-1) @ self._mtp(
                "eh_proj").T
            positions = torch.arange(len(tokens))[None]
            rope = self.model.model.rotary_emb(fused[None], positions)
            out = self.model.model.layers[LAYERS](fused[None], position_ids=positions, position_embeddings=rope)[0]
            logits.append(self._norm(out[-1], "shared_head.norm") @ self._mtp("shared_head.head").T)
            if draft is not None:
                previous, tokens = torch.cat((previous, out[-1:])), [*tokens, draft]
        return logits


def _record_drafts(runner):
    """Wrap the proposer: a list of (num_tokens, logits per draft position, drafted ids) per drafting row."""
    proposer = runner.drafting.proposer
    records: list[tuple[int, list[torch.Tensor], list[int]]] = []
    calls: list[torch.Tensor] = []
    propose, draw = proposer.propose, proposer._draw

    def recording_draw(step, logits, active, position, tokens, probs):
        calls.append(logits.float().clone())
        return draw(step, logits, active, position, tokens, probs)

    def recording_propose(step):
        calls.clear()
        drafts = propose(step)
        assert step.draft_rows.size <= 1  # one request at a time
        if step.draft_rows.size:
            ids = drafts.token_ids[0].tolist()
            records.append((int(step.num_tokens[0]), [logits[0] for logits in calls], ids))
        return drafts

    proposer._draw, proposer.propose = recording_draw, recording_propose
    return records


@pytest.mark.parametrize("params", [GREEDY, SAMPLED[0]], ids=["greedy", "sampled"])
def test_every_draft_matches_the_transformers_reference(checkpoints, params) -> None:
    source, target = checkpoints
    runner = _runner(str(target), _spec())
    records = _record_drafts(runner)
    prompt = PROMPTS[3]
    tokens, stats, _ = _serve(runner, [prompt], params, _spec(), "lockstep")
    known = prompt + tokens[0]
    reference = Reference(source, target)
    assert len(records) > 3 and any(len(logits) == 3 for _, logits, _ in records)
    for num_tokens, logits, drafted in records:
        expected = reference.draft_logits(known[:num_tokens], drafted[: len(logits) - 1])
        for ours, theirs in zip(logits, expected, strict=True):
            torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
    if params is not GREEDY:  # temperature 1.5 accepts some drafts: catch-ups after a partial acceptance
        assert stats.spec_decode_num_accepted_tokens > 0


def test_the_target_without_mtp_equals_transformers(checkpoints, runners) -> None:
    from transformers import AutoModelForCausalLM

    _, target = checkpoints
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    for prompt, ours in zip(PROMPTS, runners[2]):
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                   min_new_tokens=MAX_TOKENS)
        assert generated[0, len(prompt):].tolist() == ours


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_tokens_with_mtp_equal_those_without(runners, mode: str) -> None:
    on, _, reference = runners
    tokens, stats, _ = _serve(on, PROMPTS, GREEDY, _spec(), mode)
    assert tokens == reference
    check_mode_stats(stats, mode, accepted=False)


def test_one_draft_needs_no_scratch_blocks_and_keeps_the_tokens(checkpoints, runners) -> None:
    runner = _runner(str(checkpoints[1]), _spec(k=1, method="deepseek_mtp"))
    assert runner.drafting.proposer.scratch_blocks_per_slot == 0
    tokens, stats, _ = _serve(runner, PROMPTS, GREEDY, _spec(k=1, method="deepseek_mtp"), "async-overlap")
    assert tokens == runners[2]
    assert stats.spec_decode_num_drafts > 0


def test_seeded_sampling_with_mtp_is_reproducible(runners) -> None:
    on = runners[0]
    first, stats, _ = _serve(on, PROMPTS, SAMPLED, _spec(), "async-overlap")
    second, _, _ = _serve(on, PROMPTS, SAMPLED, _spec(), "chunked-prefill")
    assert first == second
    assert stats.spec_decode_num_accepted_tokens > 0


def test_two_mtp_layers_take_turns_and_keep_the_tokens(tiny_checkpoint, tmp_path: Path) -> None:
    target = str(_with_mtp_layers(tiny_checkpoint, tmp_path, 2)[1])
    runner = _runner(target, _spec())
    layers: list[int] = []
    forward = runner.drafting.proposer._mtp_forward

    def recording_forward(*args, **kwargs):
        layers.append(args[7])
        return forward(*args, **kwargs)

    runner.drafting.proposer._mtp_forward = recording_forward
    assert len(runner.drafting.proposer.kv_layers()) == 2
    tokens, _, _ = _serve(runner, PROMPTS, GREEDY, _spec(), "async-overlap")
    assert tokens == _serve(_runner(target, None), PROMPTS, GREEDY, None, "lockstep")[0]
    assert layers[:3] == [0, 1, 0]  # catch-up and draft 1, draft 2, draft 3


def test_mtp_configuration_errors(tiny_checkpoint, checkpoints) -> None:
    llama = str(tiny_checkpoint("LlamaForCausalLM"))
    with pytest.raises(ValueError, match="LlamaForCausalLM's config has num_nextn_predict_layers=0"):
        _runner(llama, _spec())
    with pytest.raises(ValueError, match='leave "model" out'):
        _runner(str(checkpoints[1]), SpeculativeConfig(method="mtp", model=llama, num_speculative_tokens=2))
