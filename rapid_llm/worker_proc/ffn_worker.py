"""An FFN rank of attention-FFN disaggregation: it holds the MoE layers and computes them for the attention ranks.

It joins the world after the attention ranks (its own TP group: the experts split over the FFN ranks, or
partitioned with `--enable-expert-parallel`), builds the model as a rank of that group would and keeps only the
MoE blocks (router, experts, shared experts). It has no scheduler socket, KV cache or sampler: it takes part in the
attention ranks' start-up agreement on the KV block count, reports ready, then serves every forward they announce
(distributed/ffn_exchange.py) until they announce the stop at shutdown.
Key design choice: the whole model is built and loaded, attention weights included (split over the FFN ranks),
so the loader's checks stay those of a TP rank; only the MoE blocks are ever called.
Usage: the launcher's `ffn<i>` child, `run_ffn_worker(config, rank, dist_init_method, ready)`; a benchmark that
joined the group itself: `serve(config, load_ffn_blocks(config))`.
"""

from __future__ import annotations

import logging
import sys
from multiprocessing.connection import Connection

import torch

from rapid_llm.config import EngineConfig
from rapid_llm.distributed import world_min
from rapid_llm.distributed.expert_parallel import ExpertParallelLayout, building_expert_parallel
from rapid_llm.distributed.ffn_exchange import FFN, building_afd, serve_steps
from rapid_llm.distributed.process_group import init_worker_group, leave_worker_group
from rapid_llm.layers.moe import SparseMoeBlock
from rapid_llm.model_loader import load_model
from rapid_llm.utils.process import configure_child, report_failure, report_ready

logger = logging.getLogger(__name__)
NO_LIMIT = 2**62  # this rank's side of the ranks' KV block agreement: it holds no cache


def load_ffn_blocks(config: EngineConfig) -> list[SparseMoeBlock]:
    """The model's MoE blocks, built as a rank of the FFN ranks' group (this process has joined it)."""
    layout = ExpertParallelLayout() if config.parallel.enable_expert_parallel else None
    with building_expert_parallel(layout), building_afd(FFN):
        model = load_model(config.model, config.device.torch_device)
    return [module for module in model.modules() if isinstance(module, SparseMoeBlock)]


def serve(config: EngineConfig, blocks: list[SparseMoeBlock]) -> int:
    """Serve the attention ranks' forwards until they announce the stop; returns how many were served."""
    with torch.inference_mode():
        return serve_steps(blocks, config.model.hf_config.hidden_size, config.model.dtype,
                           config.device.torch_device)


def run_ffn_worker(config: EngineConfig, rank: int, dist_init_method: str, ready: Connection) -> None:
    configure_child(config.log_level)
    parallel = config.parallel
    try:
        init_worker_group(rank, parallel.world_size, dist_init_method, config.device.type, rank,
                          ffn_ranks=parallel.afd_ffn_ranks)
        blocks = load_ffn_blocks(config)
        if config.device.type == "cpu":
            # The host's cores are shared by every rank.
            torch.set_num_threads(max(1, torch.get_num_threads() // (parallel.world_size + parallel.afd_ffn_ranks)))
        world_min(NO_LIMIT)
        logger.info("FFN rank %d: %d MoE layers, %d threads", rank - parallel.world_size, len(blocks),
                    torch.get_num_threads())
        report_ready(ready, {"ffn_moe_layers": len(blocks)})
    except Exception as error:
        report_failure(ready, error)
        sys.exit(1)
    served = serve(config, blocks)
    logger.info("FFN rank %d stops after %d forwards", rank - parallel.world_size, served)
    leave_worker_group()
