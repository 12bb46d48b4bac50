"""ParallelConfig: how many ranks an engine runs and whether its model can be split over them.

`--tensor-parallel-size N` (alias `--tp`, `-tp`, `--tp-size`: vLLM's and SGLang's spellings) starts N worker
ranks in one torch.distributed group; `--data-parallel-size D` runs D such replicas (each a scheduler, a
detokenizer and its N ranks) behind one frontend that routes requests by `--load-balance-method`;
`--nnodes/--node-rank/--dist-init-addr` spread one replica's ranks over hosts. Which architectures shard is
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
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "minimum_tokens", "cache_aware")
TENSOR_PARALLEL_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                           "Qwen3ForCausalLM"})


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    load_balance_method: str = "round_robin"
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port" of node 0 (multi-node only)
    data_parallel_rank: int = 0  # the replica a worker belongs to (set per replica by the launcher)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"{FLAG} must be at least 1, got {self.tensor_parallel_size}")
        if self.data_parallel_size < 1:
            raise ValueError(f"--data-parallel-size must be at least 1, got {self.data_parallel_size}")
        if self.load_balance_method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"--load-balance-method {self.load_balance_method!r} must be one of "
                             f"{', '.join(LOAD_BALANCE_METHODS)}")
        if self.nnodes > 1:
            from rapid_llm.config.node_layout import check_node_layout

            check_node_layout(self)
        elif self.nnodes < 1 or self.node_rank != 0:
            raise ValueError(f"--nnodes {self.nnodes} --node-rank {self.node_rank}: need nnodes >= 1 and "
                             "0 <= node-rank < nnodes")

    @property
    def world_size(self) -> int:
        """Ranks of one replica's torch.distributed group (over every node)."""
        return self.tensor_parallel_size

    @property
    def local_ranks(self) -> range:
        """The ranks of each replica that run on this node."""
        per_node = self.world_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def device_index(self, rank: int) -> int:
        """`rank`'s CUDA device on its node: each replica takes the next block of the node's devices."""
        local = self.local_ranks
        return self.data_parallel_rank * len(local) + rank - local.start

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
