"""EngineConfig: every resolved setting of one engine launch, built once and handed to each process."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from rapid_llm.config.cache_config import CacheConfig
from rapid_llm.config.compilation_config import CompilationConfig
from rapid_llm.config.device_config import DeviceConfig
from rapid_llm.config.model_config import ModelConfig
from rapid_llm.config.parallel_config import ParallelConfig
from rapid_llm.config.scheduler_config import SchedulerConfig


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    device: DeviceConfig
    scheduler: SchedulerConfig
    tokenizer: str
    served_model_name: str
    # op -> backend pinned by --op-backend / --attention-backend / RAPID_LLM_OP_BACKEND (checked names).
    op_backends: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    # SamplingParams field -> value from --generation-config, for fields a request leaves unset.
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def summary(self) -> dict[str, Any]:
        """The settings a benchmark result should record (served at GET /server_info)."""
        return {
            "model": self.model.model,
            "served_model_name": self.served_model_name,
            "architecture": self.model.architecture,
            "dtype": self.model.dtype_name,
            "quantization": None if self.model.quantization is None else self.model.quantization.summary(),
            "max_model_len": self.model.max_model_len,
            "device": self.device.type,
            "tensor_parallel_size": self.parallel.tensor_parallel_size,
            "pipeline_parallel_size": self.parallel.pipeline_parallel_size,
            "pp_layer_partition": self.parallel.pp_layer_partition,
            "decode_context_parallel_size": self.parallel.decode_context_parallel_size,
            "prefill_context_parallel_size": self.parallel.prefill_context_parallel_size,
            "afd_ffn_ranks": self.parallel.afd_ffn_ranks,
            "op_backends": self.op_backends,
            "block_size": self.cache.block_size,
            "kv_cache_dtype": self.cache.cache_dtype,
            "max_num_seqs": self.scheduler.max_num_seqs,
            "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,
            "async_scheduling": self.scheduler.async_scheduling,
            "enable_prefix_caching": self.scheduler.enable_prefix_caching,
            # "auto": radix, or hash for models with sliding-window or state layers (SchedulerConfig.cache_policy).
            "prefix_cache_policy": self.scheduler.prefix_cache_policy or "auto",
            "eviction_policy": self.scheduler.eviction_policy,
            "kv_offload_bytes": self.cache.offload_bytes,
            "kv_offload_path": self.cache.offload_path,
            "sampling_defaults": self.sampling_defaults,
            "enforce_eager": self.compilation.enforce_eager,
            "cuda_graph_max_bs": self.compilation.cuda_graph_max_bs,
            "enable_torch_compile": self.compilation.enable_torch_compile,
            "two_batch_overlap": (None if self.compilation.two_batch_overlap is None
                                  else asdict(self.compilation.two_batch_overlap)),
            "speculative_config": (None if self.scheduler.speculative is None
                                   else msgspec.structs.asdict(self.scheduler.speculative)),
            "lora": None if self.scheduler.lora is None else msgspec.to_builtins(self.scheduler.lora),
        }
