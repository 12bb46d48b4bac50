"""ServerArgs: the command line (one flat namespace, like SGLang's), validated into an EngineConfig once.

The offline `LLM` class takes the same fields as keyword arguments, so both entry points
share one set of names, defaults and error messages.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field

from rapid_llm.config.scheduler_config import DEFAULT_WATCHDOG_TIMEOUT_S

DEFAULT_PORT = 30000
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """'4GiB', '512M', '1.5g' or a plain byte count -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not match:
        raise ValueError(f"--kv-cache-memory {text!r} is not a size; write e.g. 4GiB, 512MiB or a byte count")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


@dataclass
class ServerArgs:
    model: str | None = field(default=None, metadata={"help": "Hugging Face checkpoint directory. Without it, a "
                              "small random demo checkpoint is built locally and served."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer directory (default: the model's)."})
    served_model_name: str | None = field(default=None, metadata={"help": "Model id clients use (default: the "
                                          "model path)."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=DEFAULT_PORT, metadata={"help": "HTTP port."})
    dtype: str = field(default="auto", metadata={"help": "Model dtype: auto (the checkpoint's), float32, "
                       "bfloat16 or float16."})
    max_model_len: int | None = field(default=None, metadata={"help": "Longest prompt + output in tokens "
                                      "(default: what the model supports)."})
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests running in one step."})
    max_num_batched_tokens: int | None = field(default=None, metadata={"help": "Token budget per step; longer "
                                               "prompts are chunked (default: 8192 on GPU, 2048 on CPU)."})
    block_size: int = field(default=16, metadata={"help": "Tokens per KV-cache block."})
    kv_cache_memory: str | None = field(default=None, metadata={"help": "KV-cache size, e.g. 4GiB (default on "
                                        "CPU: 4GiB; on GPU: --gpu-memory-utilization)."})
    num_kv_blocks: int | None = field(default=None, metadata={"help": "Exact number of KV blocks (overrides "
                                      "--kv-cache-memory)."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Share of GPU memory for weights and "
                                          "KV cache."})
    kv_cache_dtype: str = field(default="auto", metadata={"help": "KV-cache dtype (auto = model dtype)."})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda."})
    attention_backend: str = field(default="auto", metadata={"help": "Attention backend (auto or torch)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom code in the checkpoint."})
    api_key: str | None = field(default=None, metadata={"help": "Require 'Authorization: Bearer KEY'."})
    disable_async_scheduling: bool = field(default=False, metadata={"help": "Plan each step only after the "
                                           "previous one finished (lock-step)."})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "Reuse the KV cache of full blocks that "
                                        "match earlier requests' tokens (automatic prefix caching).",
                                        "off_flag": "--disable-prefix-caching"})
    max_waiting_requests: int | None = field(default=None, metadata={"help": "Most requests waiting for a "
                                             "slot; one more is refused at once with 503 and Retry-After "
                                             "(default: unbounded, as vLLM and SGLang)."})
    watchdog_timeout: float = field(default=DEFAULT_WATCHDOG_TIMEOUT_S, metadata={"help": "Seconds one engine "
                                    "step may take before /health turns 503 and the log names the stuck "
                                    "process."})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error."})

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     exclude: frozenset[str] = frozenset()) -> None:
        """Add one flag per field (the benchmarks reuse this, leaving out HTTP-only fields)."""
        for item in dataclasses.fields(cls):
            if item.name in exclude:
                continue
            flag = "--" + item.name.replace("_", "-")
            if item.type in ("bool", bool):
                parser.add_argument(flag, action="store_true", default=item.default,
                                    help=f"{item.metadata['help']} (default: {'on' if item.default else 'off'})")
                if "off_flag" in item.metadata:
                    parser.add_argument(item.metadata["off_flag"], dest=item.name, action="store_false",
                                        help=f"Turn {flag} off.")
                continue
            kind = {"int": int, "int | None": int, "float": float}.get(str(item.type), str)
            parser.add_argument(flag, type=kind, default=item.default,
                                help=f"{item.metadata['help']} (default: {item.default})")

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> "ServerArgs":
        parser = argparse.ArgumentParser(prog="python -m rapid_llm.launch_server",
                                         description="Serve a model over the OpenAI API.")
        cls.add_cli_args(parser)
        return cls(**vars(parser.parse_args(argv)))

    def engine_config(self, model_dir: str):
        """Resolve and validate every setting; errors name the flag and the fix."""
        from rapid_llm.config import CacheConfig, DeviceConfig, EngineConfig, ModelConfig, SchedulerConfig

        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(f"--log-level {self.log_level!r} must be debug, info, warning or error")
        device = DeviceConfig(self.device)
        model = ModelConfig.from_pretrained(model_dir, self.dtype, self.max_model_len, self.trust_remote_code)
        cache = CacheConfig(
            block_size=self.block_size,
            cache_dtype=self.kv_cache_dtype,
            kv_cache_memory_bytes=parse_size(self.kv_cache_memory) if self.kv_cache_memory else None,
            num_blocks=self.num_kv_blocks,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        default_budget = 8192 if device.torch_device.type == "cuda" else 2048
        scheduler = SchedulerConfig(
            max_model_len=model.max_model_len,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or default_budget,
            eos_token_ids=model.eos_token_ids,
            vocab_size=model.vocab_size,
            async_scheduling=not self.disable_async_scheduling,
            enable_prefix_caching=self.enable_prefix_caching,
            max_waiting_requests=self.max_waiting_requests,
            watchdog_timeout=self.watchdog_timeout,
        ).validate()
        return EngineConfig(
            model=model,
            cache=cache,
            device=device,
            scheduler=scheduler,
            tokenizer=self.tokenizer or model_dir,
            served_model_name=self.served_model_name or self.model or model_dir,
            attention_backend=self.attention_backend,
            log_level=self.log_level.lower(),
        )
