"""The feature combinations that are not built yet, refused at start with one line naming the flags and the reason.

Key design choice: the checks read the resolved configs (parallel layout, speculation, KV transfer) and the few
plain flags they need, so `ServerArgs.engine_config` calls them once those are resolved and config code never
imports the command line. Usage: `check_disaggregation(kv_transfer, parallel, speculative, prefix_caching)` before
the LoRA config is built, then `check_feature_combinations(parallel, speculative, kv_transfer, lora, flags)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapid_llm.config.flag_conflicts import refuse_combinations
from rapid_llm.config.kv_transfer_config import KVTransferConfig
from rapid_llm.config.parallel_config import ParallelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig


@dataclass(frozen=True)
class PlainFlags:
    """The flags the checks read as given."""

    kv_cache_dtype: str
    prefix_caching: bool
    kv_offload: bool
    torch_compile: bool


def check_disaggregation(kv_transfer: KVTransferConfig, parallel: ParallelConfig,
                         speculative: SpeculativeConfig | None, prefix_caching: bool) -> None:
    """What the built-in KV transfer cannot do yet."""
    if parallel.data_parallel_size > 1 or parallel.nnodes > 1:
        raise ValueError("--kv-transfer-config with data or multi-node parallelism: the transfer agents reach one "
                         "host's ranks of one replica; run one instance per replica")
    if kv_transfer.is_producer and parallel.tensor_parallel_size > 1:
        raise ValueError("--kv-transfer-config kv_role kv_producer or kv_both with --tensor-parallel-size > 1: a "
                         "prefill instance serves its KV from one rank (a decode instance may use several)")
    if kv_transfer.kv_connector == "MooncakeConnector" and parallel.tensor_parallel_size > 1:
        raise ValueError("--kv-transfer-config kv_connector MooncakeConnector with --tensor-parallel-size > 1: "
                         "Mooncake moves whole caches; a tensor-parallel decode instance needs ZmqConnector")
    if kv_transfer.is_consumer and not prefix_caching:
        raise ValueError("--kv-transfer-config kv_role kv_consumer needs prefix caching: loaded blocks are taken "
                         "as prefix hits; drop --disable-prefix-caching")
    if speculative is not None and speculative.method != "ngram":
        raise ValueError(f"--kv-transfer-config with --speculative-config method {speculative.method!r}: a "
                         "proposer model's own KV is not transferred; use method ngram or no speculation")


def check_feature_combinations(parallel: ParallelConfig, speculative: SpeculativeConfig | None,
                               kv_transfer: KVTransferConfig | None, lora: bool, flags: PlainFlags) -> None:
    """Pipeline stages, decode/prefill context parallelism, the KV offload tier and attention-FFN disaggregation
    against what they do not run with yet."""
    if parallel.pipeline_parallel_size > 1:
        _check_pipeline(parallel, speculative, kv_transfer, lora)
    dcp = parallel.decode_context_parallel_size
    if dcp > 1:
        refuse_combinations(f"--decode-context-parallel-size {dcp}", [
            (parallel.pipeline_parallel_size > 1, "--pipeline-parallel-size > 1", "not combined yet"),
            (speculative is not None, "--speculative-config", "drafts are verified by the single-rank backends"),
            (kv_transfer is not None, "--kv-transfer-config", "a transfer moves whole blocks, a rank holds shares"),
            (flags.kv_cache_dtype != "auto", "--kv-cache-dtype", "the DCP backend reads float caches only")])
    if parallel.prefill_context_parallel_size > 1:
        refuse_combinations(f"--prefill-context-parallel-size {parallel.prefill_context_parallel_size}", [
            (speculative is not None, "--speculative-config", "drafts are proposed over the whole step's hidden "
             "states on one rank"),
            (lora, "--enable-lora", "adapter rows follow the whole step's tokens, a rank computes its pieces"),
            (kv_transfer is not None, "--kv-transfer-config", "not combined yet"),
            (parallel.eplb is not None, "--enable-eplb", "expert rebalancing moves experts between world ranks"),
            (flags.kv_cache_dtype != "auto", "--kv-cache-dtype", "the gathered K/V are written as floats")])
    if flags.kv_offload:
        refuse_combinations("--kv-offload-size", [
            (parallel.world_size > 1 or parallel.data_parallel_size > 1, "--tp/--pp/--dp above 1",
             "not combined yet"),
            (not flags.prefix_caching, "--disable-prefix-caching", "the tier holds the prefix cache's blocks"),
            (kv_transfer is not None, "--kv-transfer-config", "a transfer writes blocks outside the steps")])
    if parallel.afd_ffn_ranks:
        refuse_combinations("--afd-config", [
            (speculative is not None, "--speculative-config", "not combined yet"),
            (lora, "--enable-lora", "not combined yet"),
            (kv_transfer is not None, "--kv-transfer-config", "not combined yet"),
            (flags.torch_compile, "--enable-torch-compile", "the exchange is not compiled")])


def _check_pipeline(parallel: ParallelConfig, speculative: SpeculativeConfig | None,
                    kv_transfer: KVTransferConfig | None, lora: bool) -> None:
    pp = f"--pipeline-parallel-size {parallel.pipeline_parallel_size}"
    if speculative is not None:
        raise ValueError(f"{pp} with --speculative-config: drafts are proposed and verified on one stage's hidden "
                         "states and a proposer's own layers are not staged; drop one of the flags")
    if kv_transfer is not None:
        raise ValueError(f"{pp} with --kv-transfer-config: each stage holds the KV of its own layers and the "
                         "transfer agents move one stage's cache; drop one of the flags")
    if lora:
        raise ValueError(f"{pp} with --enable-lora: adapters are checked against the first stage's modules only; "
                         "drop one of the flags")
