"""ParallelConfig: how many ranks an engine runs and whether its model can be split over them.

`--tensor-parallel-size N` (alias `--tp`, `-tp`, `--tp-size`: vLLM's and SGLang's spellings) starts N worker
ranks in one torch.distributed group; `--enable-expert-parallel` partitions MoE experts over that group instead
of splitting each expert (EP size = TP size, vLLM's TP x DP with DP 1), and `--enable-eplb` adds load-balanced
redundant experts (EPLBConfig). Which architectures shard is decided here, in the launcher and without torch,
so a layout that cannot run fails before any child starts with a message naming the flag: the dense Llama
family, the MoE models (Mixtral, Qwen2/3-MoE) and DeepSeek-V2/V3 (MLA) shard; DeepSeek-V4 and quantized
linears do not. See docs/parallelism.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rapid_llm.config.eplb_config import EPLBConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from rapid_llm.config.model_config import ModelConfig

FLAG = "--tensor-parallel-size"
EP_FLAG = "--enable-expert-parallel"
MOE_ARCHITECTURES = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                               "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
TENSOR_PARALLEL_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                           "Qwen3ForCausalLM"}) | MOE_ARCHITECTURES


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    eplb: EPLBConfig | None = None  # set: --enable-eplb

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"{FLAG} must be at least 1, got {self.tensor_parallel_size}")
        if self.eplb is not None and self.expert_parallel_size < 2:
            raise ValueError(f"--enable-eplb balances experts over expert-parallel ranks: it needs {EP_FLAG} "
                             f"and {FLAG} of at least 2")

    @property
    def expert_parallel_size(self) -> int:
        """Ranks the experts are partitioned over: the tensor-parallel group when EP is on, else 1."""
        return self.tensor_parallel_size if self.enable_expert_parallel else 1

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def check_model(self, model: ModelConfig) -> None:
        """Raise ValueError naming the flag unless every layer of `model` splits over the ranks."""
        from rapid_llm.config.model_config import attention_kv_heads

        tp = self.tensor_parallel_size
        if self.enable_expert_parallel and model.architecture not in MOE_ARCHITECTURES:
            raise ValueError(f"{EP_FLAG}: {model.architecture} has no experts to partition (expert parallelism "
                             f"serves {', '.join(sorted(MOE_ARCHITECTURES))})")
        if tp == 1:
            return
        if model.architecture not in TENSOR_PARALLEL_ARCHITECTURES:
            raise ValueError(f"{FLAG} {tp}: {model.architecture} is not tensor-parallel yet (only "
                             f"{', '.join(sorted(TENSOR_PARALLEL_ARCHITECTURES))} shard); serve it with {FLAG} 1")
        if model.quantization is not None:
            raise ValueError(f"{FLAG} {tp}: quantized linear layers ({model.quantization.name}) are not sharded "
                             f"over ranks yet; serve the model with {FLAG} 1 or unquantized")
        config = model.hf_config
        heads, kv_heads = config.num_attention_heads, attention_kv_heads(config)
        if heads % tp:
            raise ValueError(f"{FLAG} {tp} must divide the model's {heads} attention heads")
        if kv_heads % tp and tp % kv_heads:
            raise ValueError(f"{FLAG} {tp} must divide the model's {kv_heads} key/value heads, or be a multiple "
                             "of them (each KV head is then replicated on several ranks)")
        for name in ("intermediate_size", "shared_expert_intermediate_size"):
            width = getattr(config, name, None) or 0
            if width % tp:
                raise ValueError(f"{FLAG} {tp} must divide the model's {name} {width}")
        if model.architecture in MOE_ARCHITECTURES:
            self._check_experts(config)

    def _check_experts(self, config: PretrainedConfig) -> None:
        """Experts split by intermediate size (TP), or whole over the ranks (EP, plus EPLB's redundant slots)."""
        tp, ep = self.tensor_parallel_size, self.expert_parallel_size
        width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        shared = width * (getattr(config, "n_shared_experts", None) or 0)
        if shared % tp:
            raise ValueError(f"{FLAG} {tp} must divide the shared experts' width {shared}")
        if ep == 1:
            if width % tp:
                raise ValueError(f"{FLAG} {tp} must divide the experts' intermediate size {width} (or use {EP_FLAG})")
            return
        experts = next(getattr(config, name) for name in ("num_local_experts", "num_experts", "n_routed_experts")
                       if getattr(config, name, None))
        slots = experts + (self.eplb.num_redundant_experts if self.eplb is not None else 0)
        if slots % ep:
            raise ValueError(f"{EP_FLAG}: the {experts} experts (plus num_redundant_experts) must divide over the "
                             f"{ep} expert-parallel ranks, got {slots} slots")
