"""KVTransferConfig: `--kv-transfer-config '{"kv_connector": "ZmqConnector", "kv_role": "kv_producer"}'` (vLLM's
spelling), or SGLang's `--disaggregation-mode prefill|decode`, parsed and checked once.

A frozen msgspec Struct riding in `SchedulerConfig` to the scheduler (leases on a producer, staged loads on a
consumer) and to the worker (its transfer agent). The producer serves its KV on `tcp://kv_ip:kv_port`, the address
its responses' `kv_transfer_params` name; a consumer binds nothing. Key design choice: the connector is a name
looked up in a table here (torch-free), so a missing optional library (mooncake) fails at start with how to
install it, not at the first request.
Usage: `config = KVTransferConfig.parse(flag_value, disaggregation_mode)`.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

import msgspec

from rapid_llm.config.json_flag import convert_json_flag

FLAG = "--kv-transfer-config"
BUILT_IN = "ZmqConnector"
# name -> (the module it needs, how to get it); None: built in.
CONNECTORS: dict[str, tuple[str, str] | None] = {
    BUILT_IN: None,
    "MooncakeConnector": ("mooncake.engine", "pip install 'rapid_llm[mooncake]' (mooncake-transfer-engine-non-cuda; "
                                             "mooncake-transfer-engine on CUDA; both need libibverbs1)"),
    "NixlConnector": ("nixl", "pip install nixl (CUDA only)"),
}
WIRED = (BUILT_IN, "MooncakeConnector")
ROLES_OF_MODE = {"prefill": "kv_producer", "decode": "kv_consumer"}
DEFAULT_KV_PORT = 14579  # vLLM's default


class KVTransferConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which connector moves KV, this instance's role, and where a producer serves."""

    kv_connector: str = BUILT_IN
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"]
    kv_ip: str = "127.0.0.1"
    kv_port: int = DEFAULT_KV_PORT
    engine_id: str | None = None
    # lease_ttl_s: how long a producer keeps a finished prompt's blocks for a consumer that has not read them;
    # load_timeout_s: how long a consumer's load may take before it falls back to prefilling locally.
    kv_connector_extra_config: dict[str, Any] = {}

    def __post_init__(self) -> None:
        if self.kv_connector not in CONNECTORS:
            raise ValueError(f"kv_connector {self.kv_connector!r} is unknown; choose one of {sorted(CONNECTORS)}")
        needed = CONNECTORS[self.kv_connector]
        if needed is not None and importlib.util.find_spec(needed[0].split(".")[0]) is None:
            raise ValueError(f"kv_connector {self.kv_connector!r} needs the {needed[0]} module; {needed[1]}, or use "
                             f"the built-in {BUILT_IN!r}")
        if self.kv_connector not in WIRED:
            raise ValueError(f"kv_connector {self.kv_connector!r} is not wired in yet; use {BUILT_IN!r}")
        if not 1 <= self.kv_port <= 65535:
            raise ValueError(f"kv_port {self.kv_port} is out of range 1-65535")
        unknown = set(self.kv_connector_extra_config) - {"lease_ttl_s", "load_timeout_s"}
        if unknown:
            raise ValueError(f"kv_connector_extra_config has unknown keys {sorted(unknown)}; known: lease_ttl_s, "
                             "load_timeout_s")
        for key in ("lease_ttl_s", "load_timeout_s"):
            value = self.kv_connector_extra_config.get(key, 1.0)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"kv_connector_extra_config.{key} must be a positive number of seconds")

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def address(self) -> str:
        """Where a producer's KV is served."""
        return f"tcp://{self.kv_ip}:{self.kv_port}"

    @property
    def lease_ttl_s(self) -> float:
        return float(self.kv_connector_extra_config.get("lease_ttl_s", 120.0))

    @property
    def load_timeout_s(self) -> float:
        return float(self.kv_connector_extra_config.get("load_timeout_s", 30.0))

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None, disaggregation_mode: str | None = None
              ) -> KVTransferConfig | None:
        """The flag's JSON object (or a dict, from the offline `LLM`), else SGLang's mode; None: no transfer."""
        if disaggregation_mode not in (None, "null"):
            if disaggregation_mode not in ROLES_OF_MODE:
                raise ValueError(f"--disaggregation-mode {disaggregation_mode!r} must be prefill or decode")
            if value is not None:
                raise ValueError(f"--disaggregation-mode and {FLAG} both set the role; give one")
            value = {"kv_role": ROLES_OF_MODE[disaggregation_mode]}
        if value is None:
            return None
        return convert_json_flag(value, cls, FLAG)
