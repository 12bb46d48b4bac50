"""Worker process entry point: load the model, size the KV cache, then execute plans as they come.

Each rank receives every plan on its own socket (the scheduler fans out); only one rank answers (rank 0, or
with pipeline stages the last stage's first rank, which samples), so N ranks cost the scheduler one result
per step. A request that fails while being added is
aborted alone (the Worker reports it in the step's result); any other failure inside a step is
reported to the scheduler as WorkerFailed before the process exits, so the server stops instead
of hanging. On CUDA the loop overlaps steps: when the next plan is already waiting (async scheduling
sends it while this step computes), it is launched before this step's tokens are read back, so the
device never idles while the host copies, encodes and sends a result. On the CPU there is no
asynchronous device to overlap with (the step has finished when `launch` returns), and holding a
result back would only delay the scheduler, so each result is sent at once.
With tensor parallelism each rank first joins the torch.distributed group (rank r on cuda:r, or the CPU with
the host's threads split between ranks); the ranks agree on the smallest KV-cache block count, which rank 0
reports to the scheduler with the number of recurrent-state layers (cache_groups.py).
`RAPID_LLM_TORCH_PROFILER_DIR` traces a window of steps (step_profiler.py). With `--kv-transfer-config`, each rank
also runs a KV transfer agent's thread (kv_agent.py).
"""

from __future__ import annotations

import logging
import signal
import sys
from multiprocessing.connection import Connection
from typing import NoReturn

import torch
import zmq

from rapid_llm.config import EngineConfig
from rapid_llm.distributed import world_min
from rapid_llm.distributed.expert_parallel import ExpertParallelLayout, building_expert_parallel
from rapid_llm.distributed.ffn_exchange import ATTENTION, STOP, announce_step, building_afd
from rapid_llm.distributed.collective_timer import collective_totals
from rapid_llm.distributed.pipeline import PipelineStage
from rapid_llm.distributed.process_group import init_worker_group, leave_worker_group
from rapid_llm.ipc.messages import SchedulerToWorker, Shutdown, StepPlan, WorkerFailed, WorkerReady
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.utils.process import configure_child, report_failure, report_ready
from rapid_llm.worker_proc.cpu_threads import CpuThreadPolicy, cpu_thread_policy
from rapid_llm.worker_proc.host_malloc import keep_freed_activation_pages
from rapid_llm.worker_proc.kv_agent import KVAgent
from rapid_llm.worker_proc.kv_tier import open_tier
from rapid_llm.worker_proc.model_runner import ModelRunner
from rapid_llm.worker_proc.step_profiler import step_profiler_from_env
from rapid_llm.worker_proc.worker import PendingResult, Worker

logger = logging.getLogger(__name__)


def run_worker(config: EngineConfig, rank: int, paths: IpcPaths, dist_init_method: str, ready: Connection) -> None:
    configure_child(config.log_level)
    world_size = config.parallel.world_size
    try:
        parallel = config.parallel
        replica = parallel.data_parallel_rank if parallel.data_parallel_size > 1 else None
        profiler = step_profiler_from_env(rank, replica)  # first: a bad variable fails before the model loads
        per_stage = parallel.ranks_per_stage
        stage = PipelineStage(rank // per_stage, parallel.pipeline_parallel_size, parallel.pp_layer_partition,
                              per_stage)
        init_worker_group(rank, world_size, dist_init_method, config.device.type, parallel.device_index(rank), stage,
                          parallel.decode_context_parallel_size, parallel.prefill_context_parallel_size,
                          parallel.afd_ffn_ranks)
        # EP partitions the experts over this group; with attention-FFN disaggregation the FFN ranks hold them.
        layout = ExpertParallelLayout(parallel.eplb) if parallel.enable_expert_parallel else None
        with building_expert_parallel(None if parallel.afd_ffn_ranks else layout), \
                building_afd(ATTENTION if parallel.afd_ffn_ranks else None):
            runner = ModelRunner(config.model, config.cache, config.device, config.op_backends,
                                 max_num_seqs=config.scheduler.max_num_seqs, compilation=config.compilation,
                                 speculative=config.scheduler.speculative, lora=config.scheduler.lora)
        thread_policy: CpuThreadPolicy | None = None
        if runner.device.type == "cpu":
            keep_freed_activation_pages()
            # Ranks on one host share its cores: each gets its share.
            share = max(1, torch.get_num_threads() // (len(parallel.local_ranks) * parallel.data_parallel_size))
            thread_policy, reason = cpu_thread_policy(runner.model, share)
            thread_policy.apply(0)
            logger.info("CPU threads: %d, %d for long steps (%s)", thread_policy.short_step_threads,
                        thread_policy.long_step_threads, reason)
        context = zmq.Context()
        plans: Receiver = Receiver(context, paths.scheduler_to_workers[rank], SchedulerToWorker)
        results = (Sender(context, paths.worker_to_scheduler, to_node0=True) if rank == parallel.result_rank
                   else None)
        # A rank never sees block ids beyond the fewest any rank holds (its extra blocks stay unused).
        num_blocks = world_min(runner.num_blocks)
        kv_transfer = config.scheduler.kv_transfer
        agent = None if kv_transfer is None else KVAgent(runner.kv_cache, kv_transfer, paths, rank, world_size)
        tier = open_tier(runner.kv_cache, config.cache.offload_bytes, config.cache.offload_path)
        if results is not None:
            results.send(WorkerReady(num_kv_blocks=num_blocks, kv_windows=runner.kv_cache.windows,
                                     num_state_layers=runner.cache_groups.num_state_layers,
                                     num_state_snapshots=runner.cache_groups.num_snapshots,
                                     num_offload_slots=tier.num_slots if tier is not None else 0))
        if agent is not None:
            agent.start()
        report_ready(ready, {"num_kv_blocks": num_blocks, "kv_cache_tokens": runner.num_tokens,
                             "kv_cache_bytes": runner.kv_cache.num_bytes, "weight_bytes": runner.weight_bytes,
                             "state_cache_bytes": runner.cache_groups.state_bytes,
                             "state_snapshots": runner.cache_groups.num_snapshots,
                             "kv_offload_blocks": tier.num_slots if tier is not None else 0,
                             "ops": runner.op_choices,
                             "lora_targets": None if runner.lora is None else runner.lora.targets,
                             "cpu_threads": thread_policy.short_step_threads if thread_policy else None,
                             "cpu_threads_long_steps": thread_policy.long_step_threads if thread_policy else None})
    except Exception as error:
        report_failure(ready, error)
        sys.exit(1)

    worker = Worker(runner, config.tokenizer, thread_policy, tier)
    overlap = runner.device.type == "cuda"
    pending: PendingResult | None = None
    while True:
        message = plans.recv_nowait() if pending is not None else plans.recv()
        if message is None:
            # Nothing to launch behind the pending step: finish it, so the scheduler can plan on.
            _send(results, worker, pending, rank)
            pending = None
            continue
        if isinstance(message, Shutdown):
            # The launcher's SIGTERM follows the scheduler's Shutdown; it must not interrupt the exit.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            context.destroy(linger=0)
            if runner.ffn_elsewhere:
                announce_step([STOP], runner.device)  # the FFN ranks leave their loop
            leave_worker_group()
            return
        if profiler is None:
            pending = _execute(results, worker, message, pending, overlap, rank)
        else:
            with profiler.step():
                pending = _execute(results, worker, message, pending, overlap, rank)


def _execute(results: Sender | None, worker: Worker, plan: StepPlan, pending: PendingResult | None, overlap: bool,
             rank: int) -> PendingResult | None:
    """Launch the plan, then send the pending step's result, and this one's unless it may stay pending
    (returned) while the next plan is launched; a failure to launch ends the worker."""
    try:
        launched = worker.launch(plan)
    except Exception as error:
        _fail(results, rank, plan.step_id, error)
    if pending is not None:
        _send(results, worker, pending, rank)
    if overlap and worker.can_overlap:
        return launched
    _send(results, worker, launched, rank)
    return None


def _send(results: Sender | None, worker: Worker, pending: PendingResult, rank: int) -> None:
    """Wait for the step's tokens and send its result (rank 0); a failure there ends the worker like a step's."""
    try:
        result = worker.finish(pending)
    except Exception as error:
        _fail(results, rank, pending.step_id, error)
    if results is not None:
        result.collective_seconds, result.collective_calls = collective_totals()
        result.micro_batch_steps = worker.runner.micro_batch_steps
        results.send(result)


def _fail(results: Sender | None, rank: int, step_id: int, error: Exception) -> NoReturn:
    """Log the step's exception (called inside its handler), tell the scheduler (rank 0) and end the worker."""
    logger.exception("worker rank %d failed in step %d", rank, step_id)
    if results is not None:
        results.send(WorkerFailed(error=f"{type(error).__name__}: {error}"))
    sys.exit(1)
