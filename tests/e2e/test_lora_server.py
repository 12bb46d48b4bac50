"""Multi-LoRA through the real server: greedy tokens equal transformers + PEFT (fp32) for three random adapters
of different ranks and target modules (one also on the embedding and the LM head) and the base model, all in flight at once, with chunked prefill, prefix
caching and async scheduling on, on Llama and Qwen3; runtime load / unload / reload under traffic; eviction
beyond --max-loras and --max-cpu-loras; refusals naming their cause (docs/lora.md).

The server holds 2 device slots and 2 host copies for 3 adapters, so a batch naming all of them waits for slots
(the scheduler runs at most 2 distinct adapters) and reads adapters from disk again after host evictions.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from tests.e2e.server import ServerProcess
from tests.lora_adapters import ATTENTION, MLP, VOCAB, peft_greedy, peft_model, random_adapter

NEW_TOKENS = 10
BASE = "tiny"
# name -> (rank, target modules, rsLoRA)
ADAPTERS = {"a1": (8, ATTENTION + MLP + VOCAB, False), "a2": (4, ["q_proj", "v_proj"], False),
            "a3": (16, ["o_proj", "down_proj"], True)}


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    # 70 tokens: five chunks of 16 with --max-num-batched-tokens 16, and four full blocks the prefix cache keeps.
    shared = torch.randint(10, 500, (64,), generator=generator).tolist()
    return [shared + [11, 12, 13, 14, 15, 16], shared + [21, 22, 23], torch.randint(10, 500, (40,),
                                                                                     generator=generator).tolist()]


class LoRAServer:
    def __init__(self, tmp: Path, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.allowed = tmp / "allowed"
        self.adapters = {name: random_adapter(checkpoint, self.allowed / name, rank, modules, seed=index,
                                              use_rslora=rslora)
                         for index, (name, (rank, modules, rslora)) in enumerate(ADAPTERS.items())}
        self.server = ServerProcess(
            "--model", str(checkpoint), "--served-model-name", BASE, "--enable-lora", "--lora-modules",
            f"a1={self.adapters['a1']}", f"a2={self.adapters['a2']}", "--max-loras", "2", "--max-cpu-loras", "2",
            "--max-lora-rank", "16", "--lora-allowed-dirs", str(self.allowed), "--max-num-batched-tokens", "16",
            "--num-kv-blocks", "256", "--log-level", "info")
        self.url = self.server.base_url

    def complete(self, model: str, prompt: list[int]) -> list[int]:
        body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
                "temperature": 0.0, "return_token_ids": True}
        response = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120).raise_for_status()
        choice = response.json()["choices"][0]
        assert response.json()["model"] == model
        return choice["token_ids"]

    def post(self, route: str, body: dict) -> httpx.Response:
        return httpx.post(f"{self.url}{route}", json=body, timeout=60)


@pytest.fixture(scope="module", params=["LlamaForCausalLM", "Qwen3ForCausalLM"])
def lora_server(request, tiny_checkpoint, tmp_path_factory):
    served = LoRAServer(tmp_path_factory.mktemp("lora"), tiny_checkpoint(request.param))
    yield served
    served.server.stop()


def expected_tokens(served: LoRAServer, names: list[str]) -> dict[str, list[list[int]]]:
    return {name: peft_greedy(served.checkpoint, served.adapters.get(name), prompts(), NEW_TOKENS) for name in names}


def test_mixed_batch_equals_peft(lora_server) -> None:
    assert lora_server.post("/v1/load_lora_adapter", {"lora_name": "a3",
                                                      "lora_path": str(lora_server.adapters["a3"])}).status_code == 200
    names = [BASE, "a1", "a2", "a3"]
    expected = expected_tokens(lora_server, names)
    jobs = [(name, index, prompt) for index, prompt in enumerate(prompts()) for name in names]
    # Twice: the second round finds the first's blocks in the prefix cache, each under its own adapter only.
    for _ in range(2):
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: lora_server.complete(job[0], job[2]), jobs))
        for (name, index, _), tokens in zip(jobs, results):
            assert tokens == expected[name][index], (name, index)
    models = httpx.get(f"{lora_server.url}/v1/models", timeout=10).json()["data"]
    assert {(card["id"], card.get("parent")) for card in models} == {(BASE, None), ("a1", BASE), ("a2", BASE),
                                                                      ("a3", BASE)}
    assert "LoRA adapter 'a3' (id 3) read from" in lora_server.server.log()


def test_prompt_logprobs_follow_the_adapter(lora_server) -> None:
    """a1 adapts the LM head: prompt logprobs (logits of slices of each 16-token chunk) are PEFT's too."""
    prompt = prompts()[2]
    with torch.no_grad():
        reference = peft_model(lora_server.checkpoint, lora_server.adapters["a1"])(
            torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)
    body = {"model": "a1", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1, "temperature": 0.0}
    entries = lora_server.post("/v1/completions", body).raise_for_status().json()["choices"][0]["prompt_logprobs"]
    got = [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], prompt[1:])]
    assert got == pytest.approx(reference[range(len(prompt) - 1), prompt[1:]].tolist(), abs=1e-3)


def test_load_unload_reload_under_traffic(lora_server) -> None:
    if "x" in {card["id"] for card in httpx.get(f"{lora_server.url}/v1/models", timeout=10).json()["data"]}:
        lora_server.post("/v1/unload_lora_adapter", {"lora_name": "x"})
    expected = expected_tokens(lora_server, [BASE, "a1", "a2"])
    failures: list[str] = []
    stop = threading.Event()

    def traffic(name: str) -> None:
        for _ in range(40):  # bounded, also if the main thread fails
            if stop.is_set():
                return
            for index, prompt in enumerate(prompts()):
                try:
                    if lora_server.complete(name, prompt) != expected[name][index]:
                        failures.append(f"{name} prompt {index}: other tokens")
                except httpx.HTTPError as error:
                    failures.append(f"{name} prompt {index}: {error}")

    threads = [threading.Thread(target=traffic, args=(name,)) for name in (BASE, "a1")]
    for thread in threads:
        thread.start()
    try:
        path = str(lora_server.adapters["a2"])
        for _ in range(2):  # load -> use -> unload, then the same again (a fresh id each time)
            assert lora_server.post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path}).status_code == 200
            assert [lora_server.complete("x", prompt) for prompt in prompts()] == expected["a2"]
            assert lora_server.post("/v1/unload_lora_adapter", {"lora_name": "x"}).status_code == 200
            gone = lora_server.post("/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 2})
            assert gone.status_code == 404 and "`x`" in gone.json()["error"]["message"]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=300)
    assert failures == []


def test_refusals_name_their_cause(lora_server, tmp_path_factory, tiny_checkpoint) -> None:
    tmp = lora_server.allowed / "bad"
    unknown = lora_server.post("/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 2})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert "`nope`" in unknown.json()["error"]["message"]
    too_big = random_adapter(lora_server.checkpoint, tmp / "rank32", 32, ["q_proj"], seed=5)
    other_base = random_adapter(tiny_checkpoint("LlamaForCausalLM", hidden_size=96, intermediate_size=160),
                                tmp / "other_base", 4, ["q_proj"], seed=6)
    missing = tmp / "missing"
    shutil.copytree(lora_server.adapters["a2"], missing)
    (missing / "adapter_model.safetensors").unlink()
    outside = tmp_path_factory.mktemp("outside")
    cases = {str(too_big): "above --max-lora-rank 16", str(other_base): "trained for another base model",
             str(missing): "has no adapter_model.safetensors", str(outside): "outside --lora-allowed-dirs"}
    for path, cause in cases.items():
        response = lora_server.post("/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": path})
        assert response.status_code == 400 and cause in response.json()["error"]["message"], response.text
    duplicate = lora_server.post("/v1/load_lora_adapter",
                                 {"lora_name": "a1", "lora_path": str(lora_server.adapters["a1"])})
    assert duplicate.status_code == 400 and duplicate.json()["error"]["param"] == "lora_name"
    assert lora_server.post("/v1/unload_lora_adapter", {"lora_name": "nope"}).status_code == 404
    assert lora_server.complete("a1", prompts()[2]) == expected_tokens(lora_server, ["a1"])["a1"][2]
