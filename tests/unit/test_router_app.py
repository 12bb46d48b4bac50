"""The PD router's app (rapid_llm/router/) against fake instances (httpx.MockTransport): what the prefill and the
decode instance are sent, the fallbacks (prefill 5xx or unreachable: the decode instance prefills; 4xx: the client
is told), a batch of prompts decoded alone, and the pools' policies."""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.testclient import TestClient

from rapid_llm.router.app import build_app
from rapid_llm.router.instances import InstancePool

PARAMS = {"do_remote_prefill": True, "transfer_id": "t1"}


class FakeInstances:
    """Answers as prefill (port 1) and decode (port 2) instances would, recording each body."""

    def __init__(self, prefill_status: int = 200) -> None:
        self.prefill_status = prefill_status
        self.sent: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.sent.append((request.url.host + ":" + str(request.url.port), body))
        if request.url.port == 1:
            if self.prefill_status == 599:
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(self.prefill_status, json={"kv_transfer_params": PARAMS, "error": {}})
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "echo": body})


def client(fake: FakeInstances, policy: str = "least_load") -> TestClient:
    app = build_app(InstancePool("prefill", ["http://p:1"], policy), InstancePool("decode", ["http://d:2"], policy),
                    transport=httpx.MockTransport(fake))
    return TestClient(app)


def test_the_prefill_gets_one_token_and_the_decode_the_request_with_its_kv_transfer_params() -> None:
    fake = FakeInstances()
    answer = client(fake).post("/v1/completions", json={"prompt": "hi", "max_tokens": 9, "n": 2, "stream": False,
                                                          "min_tokens": 3, "temperature": 0})
    assert answer.status_code == 200
    (_, prefill), (_, decode) = fake.sent
    assert prefill == {"prompt": "hi", "temperature": 0, "max_tokens": 1,
                       "kv_transfer_params": {"do_remote_decode": True}}
    assert decode == {"prompt": "hi", "max_tokens": 9, "n": 2, "stream": False, "min_tokens": 3, "temperature": 0,
                      "kv_transfer_params": PARAMS}


@pytest.mark.parametrize("status", [500, 599])
def test_a_failed_or_unreachable_prefill_lets_the_decode_instance_prefill(status: int) -> None:
    fake = FakeInstances(prefill_status=status)
    router = client(fake)
    answer = router.post("/v1/chat/completions", json={"messages": [], "max_completion_tokens": 4})
    assert answer.status_code == 200
    assert "kv_transfer_params" not in fake.sent[-1][1] and fake.sent[-1][1]["max_completion_tokens"] == 4
    assert 'failures_total{instance="http://p:1",role="prefill"} 1' in router.get("/metrics").text


def test_a_prefill_refusal_goes_to_the_client_and_a_batch_skips_the_prefill() -> None:
    fake = FakeInstances(prefill_status=400)
    assert client(fake).post("/v1/completions", json={"prompt": "x"}).status_code == 400
    assert len(fake.sent) == 1
    fake = FakeInstances()
    assert client(fake).post("/v1/completions", json={"prompt": ["a", "b"]}).status_code == 200
    assert [target for target, _ in fake.sent] == ["d:2"]


def test_a_body_that_is_not_an_object_is_a_400_naming_it() -> None:
    answer = client(FakeInstances()).post("/v1/completions", content=b"[1]")
    assert answer.status_code == 400 and "JSON object" in answer.json()["error"]["message"]


def test_round_robin_alternates_and_least_load_takes_the_idlest() -> None:
    pool = InstancePool("decode", ["http://a", "http://b"], "round_robin")
    picks = []
    for _ in range(4):
        with pool.choose() as instance:
            picks.append(instance.url)
    assert picks == ["http://a", "http://b", "http://a", "http://b"]
    pool = InstancePool("decode", ["http://a", "http://b"], "least_load")
    with pool.choose() as busy:
        with pool.choose() as other:
            assert other is not busy
    assert [item.in_flight for item in pool.instances] == [0, 0]
    with pytest.raises(ValueError, match="at least one prefill"):
        InstancePool("prefill", [], "round_robin")
