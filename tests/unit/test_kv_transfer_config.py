"""--kv-transfer-config and --disaggregation-mode: vLLM's and SGLang's spellings, and the start-up refusals that name
the field or the flag (an unknown connector, a missing optional library, what the built-in transfer cannot do)."""

from __future__ import annotations

import importlib.util

import pytest

from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.server_args import ServerArgs


def test_vllm_and_sglang_spellings_give_the_same_roles() -> None:
    config = KVTransferConfig.parse('{"kv_connector": "ZmqConnector", "kv_role": "kv_producer", "kv_port": 5601}')
    assert (config.is_producer, config.is_consumer, config.address) == (True, False, "tcp://127.0.0.1:5601")
    assert KVTransferConfig.parse(None, "decode").kv_role == "kv_consumer"
    assert KVTransferConfig.parse(None, "prefill").kv_role == "kv_producer"
    assert KVTransferConfig.parse(None) is None
    both = KVTransferConfig.parse({"kv_role": "kv_both", "kv_connector_extra_config": {"load_timeout_s": 2}})
    assert both.is_producer and both.is_consumer and both.load_timeout_s == 2.0 and both.lease_ttl_s == 120.0


@pytest.mark.parametrize(("value", "mode", "message"), [
    ('{"kv_role": "kv_producer", "kv_connector": "Nope"}', None, "kv_connector 'Nope' is unknown"),
    ('{"kv_role": "prefill"}', None, "kv_role"),
    ('{"kv_role": "kv_consumer", "kv_port": 0}', None, "kv_port 0 is out of range"),
    ('{"kv_role": "kv_consumer", "kv_connector_extra_config": {"ttl": 1}}', None, "unknown keys"),
    ('{"kv_role": "kv_consumer", "kv_connector_extra_config": {"load_timeout_s": 0}}', None, "positive"),
    ('{"kv_role": "kv_consumer"', None, "not valid JSON"),
    ('{"kv_role": "kv_consumer"}', "decode", "give one"),
    (None, "both", "must be prefill or decode"),
])
def test_a_bad_setting_is_refused_naming_it(value: str | None, mode: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVTransferConfig.parse(value, mode)


def test_a_connector_whose_library_is_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "mooncake" else
                        find_spec(name, *args))
    with pytest.raises(ValueError, match=r"pip install 'rapid_llm\[mooncake\]'"):
        KVTransferConfig.parse('{"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}')
    with pytest.raises(ValueError, match="NixlConnector.*(needs the nixl module|not wired in yet)"):
        KVTransferConfig.parse('{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}')


@pytest.mark.parametrize(("args", "message"), [
    ({"data_parallel_size": 2}, "run one instance per replica"),
    ({"enable_prefix_caching": False}, "needs prefix caching"),
    ({"speculative_config": '{"method": "draft_model", "num_speculative_tokens": 2, "model": "demo-draft"}'},
     "proposer model's own KV is not transferred"),
])
def test_what_the_built_in_transfer_cannot_do_is_refused_at_start(tiny_checkpoint, args: dict, message: str) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    server = ServerArgs(model=str(checkpoint), disaggregation_mode="decode", **args)
    with pytest.raises(ValueError, match=message):
        server.engine_config(str(checkpoint))


def test_a_tensor_parallel_decode_instance_is_allowed_a_prefill_instance_is_not(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    config = ServerArgs(model=str(checkpoint), disaggregation_mode="decode", tensor_parallel_size=2)
    assert config.engine_config(str(checkpoint)).scheduler.kv_transfer.is_consumer
    with pytest.raises(ValueError, match="serves its KV from one rank"):
        ServerArgs(model=str(checkpoint), disaggregation_mode="prefill",
                   tensor_parallel_size=2).engine_config(str(checkpoint))
