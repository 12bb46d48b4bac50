"""ParallelConfig: how many ranks an engine runs and whether its model can be split over them.

Tensor parallelism only, so far: `--tensor-parallel-size N` (alias `--tp`, `-tp`, `--tp-size`: vLLM's and
SGLang's spellings) starts N worker ranks in one torch.distributed group. Which architectures shard is
decided here, in the launcher and without torch, so a layout that cannot run fails before any child starts
with a message naming the flag: only the dense Llama family (Llama, Mistral, Qwen2, Qwen3) is sharded;
MoE experts, MLA attention and quantized linears are not split yet. See docs/parallelism.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.config.model_config import ModelConfig

FLAG = "--tensor-parallel-size"
TENSOR_PARALLEL_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                           "Qwen3ForCausalLM"})


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"{FLAG} must be at least 1, got {self.tensor_parallel_size}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def check_model(self, model: ModelConfig) -> None:
        """Raise ValueError naming the flag unless every layer of `model` splits over the ranks."""
        from rapid_llm.config.model_config import attention_kv_heads

        tp = self.tensor_parallel_size
        if tp == 1:
            return
        if model.architecture not in TENSOR_PARALLEL_ARCHITECTURES:
            raise ValueError(f"{FLAG} {tp}: {model.architecture} is not tensor-parallel yet (only the dense "
                             f"{', '.join(sorted(TENSOR_PARALLEL_ARCHITECTURES))} shard; MoE experts and MLA "
                             f"attention do not); serve it with {FLAG} 1")
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
        if config.intermediate_size % tp:
            raise ValueError(f"{FLAG} {tp} must divide the model's intermediate_size {config.intermediate_size}")
