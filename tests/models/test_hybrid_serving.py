"""Models with state layers served by the scheduler and the worker in one process, against transformers.

LFM2 (short conv + attention), Qwen3-Next (Gated DeltaNet + gated attention + MoE) and Qwen3.5 (the same with flat
projections and a dense MLP): greedy tokens equal
transformers' with chunked prefill (an 8-token budget), lock-step and async scheduling, preemption under a small KV
budget (a preempted request restarts its state at token 0) and prefix caching on: with state snapshots a hit starts
from the state saved at its last block, without them there are no hits. Speculative decoding gives the tokens of
decoding without it (on/off golden; drafts partly rejected, the state after the accepted ones restored), with an
attention-only draft model too; a draft model with state is refused. Prompts
longer than a 64-token chunk prefill through the chunked delta rule or SSD scan, snapshots kept inside the chunks.
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.ops import gated_delta, ssd
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_model
from tests.models.oracle_proposer import register_oracle
from tests.unit.worker_engine import Engine

STATE_LAYERS = {"Lfm2ForCausalLM": 3, "Qwen3NextForCausalLM": 3, "Qwen3_5ForCausalLM": 3, "NemotronHForCausalLM": 2}


@pytest.mark.parametrize("architecture", sorted(STATE_LAYERS))
@pytest.mark.parametrize("snapshots", [0, 16], ids=["no-snapshots", "snapshots"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_chunking_preemption_and_prefix_caching_match_transformers(tiny_checkpoint, architecture: str, depth: int,
                                                                   snapshots: int) -> None:
    checkpoint = tiny_checkpoint(architecture)
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32", max_model_len=64)
    runner = ModelRunner(model, CacheConfig(block_size=4, num_blocks=64, state_snapshots=snapshots),
                         DeviceConfig("cpu"), max_num_seqs=4)
    assert runner.cache_groups.num_state_layers == STATE_LAYERS[architecture]
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, model.vocab_size, (n,), generator=generator).tolist() for n in (23, 30, 9, 17)]
    prompts.append(prompts[1][:16] + prompts[3][:10])
    expected = hf_greedy(hf_model(checkpoint, torch.float32), prompts, 12)
    engine = Engine(runner, max_num_batched_tokens=8, num_kv_blocks=16)
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=12)
    outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=depth)
    assert [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))] == expected
    # Once more alone: its KV blocks and the snapshot at its last block boundary are the newest in the cache.
    again = engine.serve([GenerateRequest("again", prompts[1], params)], depth=depth)
    assert again["again"]["token_ids"] == expected[1]
    stats = engine.scheduler.stats()
    assert stats.num_preemptions > 0
    assert (stats.prefix_cache_hits > 0) == (snapshots > 0), "hits need the state after the hit's last block"


@pytest.mark.parametrize("architecture", sorted(STATE_LAYERS))
def test_speculative_decoding_keeps_the_tokens_of_plain_decoding(monkeypatch, tiny_checkpoint,
                                                                  architecture: str) -> None:
    """On/off golden with drafts two right then one wrong: the state after the accepted drafts is restored."""
    checkpoint = tiny_checkpoint(architecture)
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32", max_model_len=64)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, model.vocab_size, (n,), generator=generator).tolist() for n in (19, 26, 7)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def serve(speculative=None) -> list[list[int]]:
        runner = ModelRunner(model, CacheConfig(block_size=4, num_blocks=64), DeviceConfig("cpu"), max_num_seqs=4,
                             speculative=speculative)
        engine = Engine(runner, max_num_batched_tokens=8, speculative=speculative)
        outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=2)
        stats = engine.scheduler.stats()
        assert speculative is None or 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
        return [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))]

    plain = serve()
    assert serve(register_oracle(monkeypatch, prompts, plain)) == plain


@pytest.mark.parametrize(("architecture", "method"), [("Qwen3NextForCausalLM", "ngram"),
                                                     ("Qwen3_5ForCausalLM", "draft_model")])
def test_ngram_and_draft_model_speculation_keep_the_tokens_of_plain_decoding(tiny_checkpoint, architecture: str,
                                                                               method: str) -> None:
    """The engine's own proposers on a hybrid target: n-gram, and a tiny Llama as the draft model (their
    vocabularies match). The target's state after each verification is the one after its accepted drafts, so the
    tokens are those without speculation. The first prompt holds the token ids 10 to 479, so n-gram finds a match
    after whatever token the model writes (the tiny models rarely repeat themselves)."""
    model = ModelConfig.from_pretrained(str(tiny_checkpoint(architecture)), dtype="float32", max_model_len=512)
    if method == "ngram":
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                        prompt_lookup_max=3)
    else:
        draft = str(tiny_checkpoint("LlamaForCausalLM", num_hidden_layers=1, hidden_size=32))
        speculative = SpeculativeConfig(method="draft_model", model=draft, num_speculative_tokens=3)
    prompts = [list(range(10, 480)), [5, 9, 17, 33] * 4, [40, 41, 42, 40, 41, 42]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outcomes = {}
    for name, config in (("plain", None), ("drafted", speculative)):
        runner = ModelRunner(model, CacheConfig(block_size=16, num_blocks=128), DeviceConfig("cpu"), max_num_seqs=4,
                             speculative=config)
        engine = Engine(runner, max_num_batched_tokens=32, speculative=config)
        served = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=2)
        outcomes[name] = [served[f"r{i}"]["token_ids"] for i in range(len(prompts))]
    assert engine.scheduler.stats().spec_decode_num_draft_tokens > 0
    assert outcomes["drafted"] == outcomes["plain"]


def test_a_draft_model_with_recurrent_state_is_refused(tiny_checkpoint) -> None:
    target = ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")), dtype="float32", max_model_len=64)
    hybrid = str(tiny_checkpoint("Qwen3_5ForCausalLM"))
    speculative = SpeculativeConfig(method="draft_model", model=hybrid, num_speculative_tokens=3)
    with pytest.raises(ValueError, match=r"\(Qwen3_5ForCausalLM\) keeps recurrent state .* must be attention-only"):
        ModelRunner(target, CacheConfig(block_size=4, num_blocks=64), DeviceConfig("cpu"), max_num_seqs=4,
                    speculative=speculative)


@pytest.mark.parametrize(("architecture", "op_module"), [("Qwen3_5ForCausalLM", gated_delta),
                                                        ("NemotronHForCausalLM", ssd)])
def test_long_prompts_prefill_through_the_chunked_form(monkeypatch, tiny_checkpoint, architecture: str,
                                                       op_module) -> None:
    """Chunks of up to 128 tokens take the chunked form (ops/gated_delta.py, ops/ssd.py), which keeps the state
    snapshots at block boundaries inside its chunks; tokens equal transformers', and a repeated prompt hits one."""
    checkpoint = tiny_checkpoint(architecture)
    model = ModelConfig.from_pretrained(str(checkpoint), dtype="float32", max_model_len=256)
    runner = ModelRunner(model, CacheConfig(block_size=16, num_blocks=64, state_snapshots=8), DeviceConfig("cpu"),
                         max_num_seqs=4)
    chunked_calls = []
    chunked = op_module._chunked
    monkeypatch.setattr(op_module, "_chunked", lambda *args: chunked_calls.append(1) or chunked(*args))
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(10, model.vocab_size, (n,), generator=generator).tolist() for n in (150, 97, 20)]
    expected = hf_greedy(hf_model(checkpoint, torch.float32), prompts, 8)
    engine = Engine(runner, max_num_batched_tokens=128, num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8)
    outcomes = engine.serve([GenerateRequest(f"r{i}", p, params) for i, p in enumerate(prompts)], depth=2)
    assert [outcomes[f"r{i}"]["token_ids"] for i in range(len(prompts))] == expected
    assert chunked_calls, "no step took the chunked form"
    again = engine.serve([GenerateRequest("again", prompts[0], params)], depth=2)
    assert again["again"]["token_ids"] == expected[0]
    assert engine.scheduler.stats().prefix_cache_hits > 0
