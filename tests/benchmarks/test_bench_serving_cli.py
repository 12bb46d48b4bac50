"""bench_serving's command line and model lookup, without a server: the default port and a refused key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from benchmarks import bench_serving
from rapid_llm.server_args import ServerArgs


def test_the_default_port_is_the_servers() -> None:
    assert bench_serving.parse_args([]).port == ServerArgs().port == 30000


def test_a_refused_key_while_listing_models_names_openai_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.Response(401, json={"error": "bad key"}, request=httpx.Request("GET", url))

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(bench_serving.httpx, "get", refuse)
    with pytest.raises(RuntimeError, match="HTTP 401 .*OPENAI_API_KEY is not set"):
        bench_serving.first_model("http://127.0.0.1:30000")


@pytest.mark.parametrize(("ratio", "constrained"), [(1.0, 8), (0.5, 4), (0.25, 2), (0.0, 0)])
def test_the_structured_output_share_is_exact_and_spread(ratio: float, constrained: int) -> None:
    args = bench_serving.parse_args(["--json-schema-path", "benchmarks/schemas/records.json",
                                     "--structured-output-ratio", str(ratio)])
    bodies = bench_serving.structured_bodies(args, 8, {"temperature": 0.0})
    flags = ["response_format" in body for body in bodies]
    assert sum(flags) == constrained and all(body["temperature"] == 0.0 for body in bodies)
    if constrained == 4:
        assert flags == [False, True] * 4
    schema = next((body["response_format"] for body in bodies if "response_format" in body), None)
    assert schema is None or schema["json_schema"]["schema"]["required"] == ["records"]
    assert bench_serving.structured_bodies(bench_serving.parse_args([]), 3, {"a": 1}) == [{"a": 1}] * 3


def test_lora_names_spread_requests_evenly_over_the_adapters() -> None:
    assert bench_serving.parse_args(["--lora-names", "a", "b"]).lora_names == ["a", "b"]
    assert bench_serving.request_models("base", ["a", "b", "c"], 7) == ["a", "b", "c", "a", "b", "c", "a"]
    assert bench_serving.request_models("base", None, 2) == ["base", "base"]
