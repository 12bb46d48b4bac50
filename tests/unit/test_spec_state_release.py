"""No per-request speculation state outlives its request (the soak's RSS question, benchmark-results/
soak-mem-20261202): after waves of n-gram-speculating requests of varied lengths finish, the scheduler keeps no
received drafts or adaptive tracks, no worker row outlives the next wave, and the live object count does not grow
from one wave to the next."""

from __future__ import annotations

import gc
import random

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.unit.worker_engine import Engine


def _wave(rng: random.Random, wave: int) -> list[GenerateRequest]:
    requests = []
    for index in range(8):
        motif = [rng.randrange(10, 400) for _ in range(rng.randrange(2, 6))]
        prompt = (motif * 12)[: rng.randrange(6, 40)]
        requests.append(GenerateRequest(f"w{wave}-{index}", prompt, SamplingParams(
            temperature=0.0, max_tokens=rng.randrange(4, 16), ignore_eos=True)))
    return requests


def test_speculation_state_is_released_with_its_requests(tiny_checkpoint) -> None:
    model = ModelConfig.from_pretrained(str(tiny_checkpoint("LlamaForCausalLM")), max_model_len=96)
    runner = ModelRunner(model, CacheConfig(block_size=4, num_blocks=256), DeviceConfig("cpu"), max_num_seqs=4)
    # The hash index: the radix tree keeps a node per cached block (bounded by the cache, not per request), which
    # would read as growth while the waves fill the cache.
    engine = Engine(runner, max_num_seqs=4, prefix_cache_policy="hash", speculative=SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3))
    speculation = engine.scheduler._speculation
    rng = random.Random(0)
    counts = []
    for wave in range(4):
        engine.serve(_wave(rng, wave))
        engine.outcomes.clear()
        gc.collect()
        counts.append(len(gc.get_objects()))
        assert speculation._received == {}
        assert len(speculation.adaptive._tracks) == 0
        # The worker releases a slot with the next plan, so only this wave's last requests may still hold rows.
        held = [request_id for request_id in runner.input_batch.request_ids if request_id is not None]
        assert all(request_id.startswith(f"w{wave}-") for request_id in held), held
    assert speculation.counters.num_accepted_tokens > 0  # the waves did speculate
    # Waves 2 and 3 run the same code paths as wave 1: any growth is state kept per finished request.
    assert counts[3] - counts[1] < 50, counts
