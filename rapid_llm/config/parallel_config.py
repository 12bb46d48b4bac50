"""ParallelConfig: how many ranks an engine runs and whether its model can be split over them.

`--tensor-parallel-size N` (alias `--tp`, `-tp`, `--tp-size`: vLLM's and SGLang's spellings) starts N worker
ranks in one torch.distributed group; `--enable-expert-parallel` partitions MoE experts over that group instead
of splitting each expert (EP size = TP size, vLLM's TP x DP with DP 1), and `--enable-eplb` adds load-balanced
redundant experts (EPLBConfig). `--data-parallel-size D` runs D such replicas (each a scheduler, a detokenizer
and its N ranks) behind one frontend that routes requests by `--load-balance-method`;
`--nnodes/--node-rank/--dist-init-addr` spread one replica's ranks over hosts. `--pipeline-parallel-size P`
(`-pp`) splits the decoder layers into P stages of N ranks each (distributed/pipeline.py; `--pp-layer-partition`
gives each stage's layer count). `afd_ffn_ranks` (`--afd-config`) adds FFN ranks after the world's ranks, which
compute the MoE layers (attention-FFN disaggregation; they are not counted in `world_size`). Which architectures
shard is decided here, in the launcher and without torch, so a layout that cannot run fails before any child starts
with a message naming the flag: the dense Llama family, LFM2, NemotronH (Mamba2 heads and groups), the MoE
models (Mixtral, Qwen2/3-MoE) and DeepSeek-V2/V3 (MLA) shard; DeepSeek-V4 and quantized linears do not.
See docs/parallelism.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rapid_llm.config.eplb_config import EPLBConfig
from rapid_llm.config.flag_conflicts import refuse_combinations

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from rapid_llm.config.model_config import ModelConfig

FLAG = "--tensor-parallel-size"
EP_FLAG = "--enable-expert-parallel"
MOE_ARCHITECTURES = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                               "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Qwen3NextForCausalLM",
                               "Qwen3_5MoeForCausalLM"})
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "minimum_tokens", "cache_aware")
# The Llama family's decoder stack (models/llama.py), which builds only its stage's layers.
PIPELINE_PARALLEL_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                             "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                                             "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
# Attention-FFN disaggregation: the MoE models of the Llama-family decoder stack (layers/moe/sparse_block.py).
DISAGGREGATED_ARCHITECTURES = MOE_ARCHITECTURES & PIPELINE_PARALLEL_ARCHITECTURES
PP_FLAG = "--pipeline-parallel-size"
DCP_FLAG = "--decode-context-parallel-size"
PCP_FLAG = "--prefill-context-parallel-size"
# Full attention (K and V per head, no sliding window) or MLA's latent: the architectures pipelines split.
CONTEXT_PARALLEL_ARCHITECTURES = PIPELINE_PARALLEL_ARCHITECTURES
TENSOR_PARALLEL_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                           "Qwen3ForCausalLM", "Lfm2ForCausalLM", "NemotronHForCausalLM",
                                           "Qwen3_5ForCausalLM"}
                                          ) | MOE_ARCHITECTURES


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    eplb: EPLBConfig | None = None  # set: --enable-eplb
    data_parallel_size: int = 1
    load_balance_method: str = "round_robin"
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port" of node 0 (multi-node only)
    data_parallel_rank: int = 0  # the replica a worker belongs to (set per replica by the launcher)
    pipeline_parallel_size: int = 1
    pp_layer_partition: tuple[int, ...] | None = None  # decoder layers per stage (None: an even split)
    decode_context_parallel_size: int = 1  # blocks of TP ranks sharing KV heads split each sequence's tokens
    prefill_context_parallel_size: int = 1  # replicas of the TP group that split every step's tokens
    afd_ffn_ranks: int = 0  # attention-FFN disaggregation: ranks after the world's that compute the MoE layers

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"{FLAG} must be at least 1, got {self.tensor_parallel_size}")
        self._check_pipeline()
        dcp = self.decode_context_parallel_size
        if dcp < 1 or self.tensor_parallel_size % dcp:
            raise ValueError(f"{DCP_FLAG} {dcp} must be at least 1 and divide {FLAG} {self.tensor_parallel_size} "
                             "(its ranks are tensor-parallel ranks that hold the same KV heads)")
        pcp = self.prefill_context_parallel_size
        if pcp < 1:
            raise ValueError(f"{PCP_FLAG} must be at least 1, got {pcp}")
        if pcp > 1 and (self.pipeline_parallel_size > 1 or dcp > 1):
            raise ValueError(f"{PCP_FLAG} {pcp} with {PP_FLAG} or {DCP_FLAG} > 1: not combined yet (each PCP rank "
                             "holds every token's KV of the whole model); drop one of the flags")
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
        if self.afd_ffn_ranks:
            self._check_disaggregation()
        if self.enable_expert_parallel and self.data_parallel_size > 1:
            raise ValueError(f"{EP_FLAG} with --data-parallel-size {self.data_parallel_size}: experts are "
                             "partitioned inside one replica's tensor-parallel group only (EP across DP "
                             "replicas is not built); use one of the two")
        if self.eplb is not None and self.expert_parallel_size < 2:
            raise ValueError(f"--enable-eplb balances experts over expert-parallel ranks: it needs {EP_FLAG} "
                             f"and {FLAG} of at least 2")

    def _check_pipeline(self) -> None:
        pp = self.pipeline_parallel_size
        if pp < 1:
            raise ValueError(f"{PP_FLAG} must be at least 1, got {pp}")
        if self.pp_layer_partition is not None and pp == 1:
            raise ValueError(f"--pp-layer-partition takes effect with {PP_FLAG} > 1 only")
        if pp == 1:
            return
        if self.eplb is not None:
            raise ValueError(f"--enable-eplb with {PP_FLAG} {pp}: expert rebalancing sends experts between "
                             "world ranks, not within a stage; drop one of the flags")

    def _check_disaggregation(self) -> None:
        refuse_combinations("--afd-config", [(conflict, flag, "not combined yet") for conflict, flag in (
            (self.pipeline_parallel_size > 1, f"{PP_FLAG} > 1"),
            (self.decode_context_parallel_size > 1, f"{DCP_FLAG} > 1"),
            (self.prefill_context_parallel_size > 1, f"{PCP_FLAG} > 1"),
            (self.data_parallel_size > 1, "--data-parallel-size > 1"), (self.nnodes > 1, "--nnodes > 1"),
            (self.eplb is not None, "--enable-eplb"))])

    @property
    def result_rank(self) -> int:
        """The rank that samples and answers the scheduler: the last pipeline stage's first rank (PCP: the first
        replica's)."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size

    @property
    def expert_parallel_size(self) -> int:
        """Ranks the experts are partitioned over: the tensor-parallel group when EP is on, else 1."""
        return self.tensor_parallel_size if self.enable_expert_parallel else 1

    @property
    def world_size(self) -> int:
        """Ranks of one replica's torch.distributed group (over every node, pipeline stage and PCP rank)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.prefill_context_parallel_size

    @property
    def ranks_per_stage(self) -> int:
        """Ranks of one pipeline stage: its tensor-parallel group, times the PCP ranks (which run without stages)."""
        return self.tensor_parallel_size * self.prefill_context_parallel_size

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
        if self.afd_ffn_ranks:
            if model.architecture not in DISAGGREGATED_ARCHITECTURES:
                raise ValueError(f"--afd-config: {model.architecture} is not disaggregated (the MoE models of the "
                                 f"Llama-family stack are: {', '.join(sorted(DISAGGREGATED_ARCHITECTURES))})")
            if model.quantization is not None:
                raise ValueError("--afd-config with quantization: not combined yet; serve the model unquantized")
            # The FFN ranks build the model as a tensor-parallel group of their own.
            replace(self, tensor_parallel_size=self.afd_ffn_ranks, afd_ffn_ranks=0).check_model(model)
        if self.pipeline_parallel_size > 1:
            self._check_pipeline_model(model)
        if self.decode_context_parallel_size > 1:
            self._check_context_model(model, DCP_FLAG, self.decode_context_parallel_size)
            self._check_dcp_heads(model)
        if self.prefill_context_parallel_size > 1:
            self._check_context_model(model, PCP_FLAG, self.prefill_context_parallel_size)
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
        # Mamba2 (NemotronH) splits its heads and the B/C groups they share (n_groups divides the heads); Gated
        # DeltaNet (Qwen3-Next, Qwen3.5) its key heads and their value heads.
        for name in ("intermediate_size", "shared_expert_intermediate_size", "n_groups", "linear_num_key_heads"):
            width = getattr(config, name, None) or 0
            if width % tp:
                raise ValueError(f"{FLAG} {tp} must divide the model's {name} {width}")
        if model.architecture in MOE_ARCHITECTURES:
            self._check_experts(config)

    def _check_pipeline_model(self, model: ModelConfig) -> None:
        pp = self.pipeline_parallel_size
        if model.architecture not in PIPELINE_PARALLEL_ARCHITECTURES:
            raise ValueError(f"{PP_FLAG} {pp}: {model.architecture} is not split into pipeline stages yet (only "
                             f"{', '.join(sorted(PIPELINE_PARALLEL_ARCHITECTURES))}); serve it with {PP_FLAG} 1")
        layer_partition(model.hf_config.num_hidden_layers, pp, self.pp_layer_partition)

    @staticmethod
    def _check_context_model(model: ModelConfig, flag: str, size: int) -> None:
        """Context parallelism serves full attention and MLA without sliding windows."""
        if model.architecture not in CONTEXT_PARALLEL_ARCHITECTURES:
            served = ", ".join(sorted(CONTEXT_PARALLEL_ARCHITECTURES))
            raise ValueError(f"{flag} {size}: {model.architecture} is not served with context parallelism yet "
                             f"(only {served})")
        config = model.hf_config
        layer_types = getattr(config, "layer_types", None)
        # As models/llama.py reads windows: per layer from layer_types, else the model-wide sliding_window.
        windowed = ("sliding_attention" in layer_types if layer_types is not None
                    else getattr(config, "sliding_window", None) is not None)
        if windowed:
            raise ValueError(f"{flag} {size}: sliding-window attention is not split over context-parallel ranks yet")

    def _check_dcp_heads(self, model: ModelConfig) -> None:
        from rapid_llm.config.model_config import attention_kv_heads

        dcp, tp, config = self.decode_context_parallel_size, self.tensor_parallel_size, model.hf_config
        if getattr(config, "kv_lora_rank", None):
            return  # MLA's latent is one KV head replicated on every tensor-parallel rank
        kv_heads = attention_kv_heads(config)
        if tp % (kv_heads * dcp):
            raise ValueError(f"{DCP_FLAG} {dcp}: each DCP group must hold one KV head replicated on all its ranks, "
                             f"so {FLAG} {tp} must be a multiple of the model's {kv_heads} KV heads x {dcp}")

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


def layer_partition(num_layers: int, pp_size: int, explicit: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Decoder layers per pipeline stage: `explicit` checked, else an even split with the remainder on the last
    stages (the first one also embeds the tokens)."""
    if explicit is not None:
        if len(explicit) != pp_size or any(count < 1 for count in explicit) or sum(explicit) != num_layers:
            raise ValueError(f"--pp-layer-partition {','.join(map(str, explicit))}: needs {pp_size} positive "
                             f"counts summing to the model's {num_layers} decoder layers")
        return explicit
    if num_layers < pp_size:
        raise ValueError(f"{PP_FLAG} {pp_size}: the model has {num_layers} decoder layers, fewer than the stages")
    base, extra = divmod(num_layers, pp_size)
    return tuple(base + (stage >= pp_size - extra) for stage in range(pp_size))
