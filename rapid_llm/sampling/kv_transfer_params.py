"""KVTransferParams: a request's part in prefill/decode disaggregation, with vLLM's field names.

A request to a prefill instance says `do_remote_decode` (keep the prompt's KV for a decode instance); its response
carries `do_remote_prefill` with where that KV waits (`remote_host`, `remote_port`, `transfer_id`,
`remote_block_ids`), which the router passes on to a decode instance's request unchanged. `last_block_hash` (the
chained hash of the last leased block) lets the decode instance check that it tokenized the same prompt before it
takes the blocks as its own prefix. Usage: `SamplingParams(kv_transfer_params=KVTransferParams(...))`.
"""

from __future__ import annotations

import msgspec


class KVTransferParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_block_ids: list[int] | None = None
    transfer_id: str | None = None
    last_block_hash: str | None = None

    def check(self) -> None:
        """Raise ValueError naming the field when the fields contradict each other or miss a remote's address."""
        if self.do_remote_decode and self.do_remote_prefill:
            raise ValueError("kv_transfer_params: do_remote_decode and do_remote_prefill exclude each other")
        if self.do_remote_prefill:
            for name in ("remote_host", "remote_port", "transfer_id", "remote_block_ids", "last_block_hash"):
                if getattr(self, name) is None:
                    raise ValueError(f"kv_transfer_params.{name} is needed with do_remote_prefill (pass the prefill "
                                     "instance's kv_transfer_params on unchanged)")
            if not 1 <= self.remote_port <= 65535:
                raise ValueError(f"kv_transfer_params.remote_port {self.remote_port} is out of range 1-65535")

    @property
    def address(self) -> str:
        return f"tcp://{self.remote_host}:{self.remote_port}"
