"""Draft-model speculative decoding end to end, scheduler + worker in one process: greedy tokens with the draft
proposer equal those without it (the demo target + draft, and a tiny random pair) in async+overlap, lock-step,
chunked prefill, prefix caching off and preemption modes, with block accounting checked after every step and
every block free at the end; drafts are accepted on the demo pair; requests drafting different counts share
steps; seeded sampling is reproducible; rows that cannot speculate keep their tokens beside drafting rows."""

from __future__ import annotations

import pytest

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest, StepResult
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.test_spec_decode import CODE, MODES, check_mode_stats
from tests.unit.test_spec_scheduler import check_accounting
from tests.unit.worker_engine import Engine

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


class CheckedEngine(Engine):
    """Checks the scheduler's blocks after every result and records each plan's draft counts."""

    def __init__(self, runner: ModelRunner, **kwargs) -> None:
        super().__init__(runner, **kwargs)
        self.draft_counts: list[list[int]] = []
        launch = self.worker.launch

        def recording_launch(plan):
            self.draft_counts.append([len(chunk.draft_token_ids) for chunk in plan.scheduled])
            return launch(plan)

        self.worker.launch = recording_launch

    def _process(self, result: StepResult) -> None:
        super()._process(result)
        check_accounting(self.scheduler, None)


def _spec(draft_dir: str, k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", model=draft_dir, num_speculative_tokens=k)


def _runner(model_dir: str, speculative: SpeculativeConfig | None) -> ModelRunner:
    config = ModelConfig.from_pretrained(model_dir, dtype="float32", max_model_len=96)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=200), DeviceConfig("cpu"), max_num_seqs=8,
                       speculative=speculative)


@pytest.fixture(scope="module")
def pairs(tiny_checkpoint):
    from transformers import AutoTokenizer

    target = model_dir_or_demo("demo-target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    demo_prompts = [tokenizer.encode(text) for text in CODE] + [tokenizer.encode(CODE[0])]
    tiny_target = str(tiny_checkpoint("LlamaForCausalLM"))
    tiny_draft = str(tiny_checkpoint("LlamaForCausalLM", num_hidden_layers=1, hidden_size=32))
    tiny_prompts = [[5, 9, 17, 33] * 4, [40, 41, 42], [5, 9, 17, 33] * 4, list(range(60, 80))]
    result = {}
    for name, (target_dir, draft_dir, prompts) in {"demo": (target, "demo-draft", demo_prompts),
                                                   "tiny": (tiny_target, tiny_draft, tiny_prompts)}.items():
        speculative = _spec(draft_dir)
        off = _runner(target_dir, None)
        reference = _serve(off, prompts, GREEDY, None, "lockstep")[0]
        result[name] = (_runner(target_dir, speculative), speculative, prompts, reference, off)
    return result


def _serve(runner: ModelRunner, prompts: list[list[int]], params, speculative, mode: str):
    kwargs, depth, overlap = MODES[mode]
    engine = CheckedEngine(runner, speculative=speculative, **kwargs)
    many = params if isinstance(params, list) else [params] * len(prompts)
    requests = [GenerateRequest(f"r{i}", prompt, p) for i, (prompt, p) in enumerate(zip(prompts, many))]
    outcomes = engine.serve(requests, depth=depth, overlap=overlap)
    stats = engine.scheduler.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    return [outcome["token_ids"] for outcome in outcomes.values()], stats, engine


# The demo pair takes ~10 s per mode on a busy 2-core machine: beyond async+overlap its modes are marked slow.
CASES = [("tiny", mode) for mode in MODES] + [
    pytest.param("demo", mode, marks=() if mode == "async-overlap" else pytest.mark.slow) for mode in MODES]


@pytest.mark.parametrize(("model", "mode"), CASES)
def test_greedy_tokens_with_the_draft_model_equal_those_without(model: str, mode: str, pairs) -> None:
    runner, speculative, prompts, reference, _ = pairs[model]
    tokens, stats, _ = _serve(runner, prompts, GREEDY, speculative, mode)
    assert tokens == reference
    check_mode_stats(stats, mode, accepted=model == "demo")


def test_a_draft_equal_to_the_target_is_almost_always_accepted(tiny_checkpoint) -> None:
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    speculative = _spec(target, k=4)
    prompts = [[5, 9, 17, 33] * 4, list(range(60, 80))]
    reference = _serve(_runner(target, None), prompts, GREEDY, None, "lockstep")[0]
    tokens, stats, _ = _serve(_runner(target, speculative), prompts, GREEDY, speculative, "async-overlap")
    assert tokens == reference
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0


def test_requests_drafting_different_counts_share_steps(pairs) -> None:
    runner, speculative, prompts, reference, _ = pairs["demo"]
    limits = [3, 6, MAX_TOKENS, MAX_TOKENS]
    params = [SamplingParams(temperature=0.0, max_tokens=limit, ignore_eos=True) for limit in limits]
    tokens, _, engine = _serve(runner, prompts, params, speculative, "lockstep")
    assert tokens == [expected[:limit] for expected, limit in zip(reference, limits)]
    assert any(len({count for count in counts if count}) > 1 for counts in engine.draft_counts)


def test_seeded_sampling_with_the_draft_model_is_reproducible(pairs) -> None:
    runner, speculative, prompts, _, _ = pairs["demo"]
    params = [SamplingParams(temperature=0.8, top_k=40, seed=11 + i, max_tokens=MAX_TOKENS, ignore_eos=True)
              for i in range(len(prompts))]
    first, stats, _ = _serve(runner, prompts, params, speculative, "async-overlap")
    second, _, _ = _serve(runner, prompts, params, speculative, "chunked-prefill")
    assert first == second
    assert stats.spec_decode_num_accepted_tokens > 0


def test_rows_that_cannot_speculate_keep_their_tokens_beside_drafting_rows(pairs) -> None:
    runner, speculative, prompts, _, off = pairs["demo"]
    greedy = dict(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    params = [SamplingParams(**greedy), SamplingParams(**greedy, logprobs=2),
              SamplingParams(**greedy, repetition_penalty=1.3), SamplingParams(**greedy, min_tokens=5),
              SamplingParams(temperature=0.9, seed=3, max_tokens=MAX_TOKENS, ignore_eos=True, presence_penalty=0.5)]
    batch = [prompts[i % len(prompts)] for i in range(len(params))]
    on, stats, _ = _serve(runner, batch, params, speculative, "async-overlap")
    without, _, _ = _serve(off, batch, params, None, "async-overlap")
    assert on == without
    assert stats.spec_decode_num_accepted_tokens > 0


def test_requests_paused_by_adaptive_off_are_not_drafted_for(tiny_checkpoint) -> None:
    """A paused request's chunks say `draft_after=False`, so the worker runs no draft forward for it: each request
    is drafted for after its prefill and after the verification that pauses it, never again (no probe within
    MAX_TOKENS), and with every request paused the proposer is not called at all (not even to catch up), while
    the greedy tokens stay those without speculation."""
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    draft = str(tiny_checkpoint("LlamaForCausalLM", num_hidden_layers=1, hidden_size=32))
    speculative = SpeculativeConfig(method="draft_model", model=draft, num_speculative_tokens=3,
                                    acceptance_threshold=1.0, acceptance_window=1, probe_after_tokens=4 * MAX_TOKENS)
    prompts = [[5, 9, 17, 33] * 4, list(range(60, 80)), [40, 41, 42]]
    reference = _serve(_runner(target, None), prompts, GREEDY, None, "lockstep")[0]
    runner = _runner(target, speculative)
    drafted_rows: list[int] = []
    propose = runner.drafting.proposer.propose

    def counting_propose(step):
        drafted_rows.append(len(step.draft_rows))
        return propose(step)

    runner.drafting.proposer.propose = counting_propose
    tokens, stats, _ = _serve(runner, prompts, GREEDY, speculative, "lockstep")
    assert tokens == reference
    assert stats.spec_decode_num_disables == len(prompts)
    assert sum(drafted_rows) == 2 * len(prompts) and all(drafted_rows)


def test_draft_model_configuration_errors(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match='needs "model"'):
        SpeculativeConfig.parse('{"method": "draft_model", "num_speculative_tokens": 2}')
    target = str(tiny_checkpoint("LlamaForCausalLM"))
    other_vocab = str(tiny_checkpoint("LlamaForCausalLM", vocab_size=600))
    with pytest.raises(ValueError, match="600 tokens, the target 512: they must share the tokenizer"):
        _runner(target, _spec(other_vocab))
    assert SpeculativeConfig.parse({"method": "draft", "model": target, "num_speculative_tokens": 2}).model == target
