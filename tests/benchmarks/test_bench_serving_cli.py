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
