"""Scheduler + Worker in one process for worker tests: plans and results round-trip through msgpack as between
processes, `depth` plans in flight (2 = async scheduling). With `overlap`, the next plan is launched before the
previous step's result is read, as the worker process does on CUDA (worker_proc/process.py)."""

from __future__ import annotations

from collections import deque

import msgspec

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest, StepPlan, StepResult
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.worker_proc.model_runner import ModelRunner
from rapid_llm.worker_proc.worker import PendingResult, Worker


def roundtrip(message: StepPlan | StepResult) -> StepPlan | StepResult:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=type(message))


class Engine:
    """Collects every request's outcome (token ids, finish reason, error, a beam search's beams)."""

    def __init__(self, runner: ModelRunner, max_num_batched_tokens: int = 64, max_num_seqs: int = 8,
                 speculative: SpeculativeConfig | None = None, enable_prefix_caching: bool = True,
                 num_kv_blocks: int | None = None, prefix_cache_policy: str | None = None) -> None:
        model = runner.model_config
        self.scheduler = Scheduler(SchedulerConfig(
            max_model_len=model.max_model_len, block_size=runner.cache_config.block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, num_kv_blocks=num_kv_blocks or runner.num_blocks,
            kv_windows=runner.kv_cache.windows, recurrent_state=runner.cache_groups.num_state_layers > 0,
            state_snapshots=runner.cache_groups.num_snapshots,
            eos_token_ids=model.eos_token_ids, vocab_size=model.vocab_size, speculative=speculative,
            enable_prefix_caching=enable_prefix_caching, prefix_cache_policy=prefix_cache_policy))
        self.worker = Worker(runner)
        self.outcomes: dict[str, dict[str, object]] = {}

    def serve(self, requests: list[GenerateRequest], depth: int = 2, overlap: bool = False,
              max_steps: int = 20_000) -> dict[str, dict[str, object]]:
        """Run until every request ends; a scheduler that stops making progress fails after `max_steps` loops."""
        for request in requests:
            self.scheduler.add_request(request)
        inflight: deque[StepPlan] = deque()
        pending: PendingResult | None = None
        loops = 0
        while self.scheduler.has_unfinished_requests() or inflight or pending:
            loops += 1
            if loops > max_steps:
                raise RuntimeError(f"requests still unfinished after {max_steps} loops")
            while len(inflight) + (pending is not None) < depth and (plan := self.scheduler.schedule()) is not None:
                inflight.append(roundtrip(plan))
            launched = self.worker.launch(inflight.popleft()) if inflight else None
            if pending is not None:
                self._process(self.worker.finish(pending))
            pending = launched
            if not (overlap and self.worker.can_overlap) and pending is not None:
                self._process(self.worker.finish(pending))
                pending = None
        return {request.request_id: self.outcomes[request.request_id] for request in requests}

    def _process(self, result: StepResult) -> None:
        self.scheduler.process_result(roundtrip(result))
        batch = self.scheduler.take_outputs()
        for update in batch.updates if batch else []:
            outcome = self.outcomes.setdefault(update.request_id, {"token_ids": []})
            outcome["token_ids"] += update.token_ids
            if update.finish_reason is not None:
                outcome.update(finish_reason=update.finish_reason, error=update.error, kind=update.error_kind,
                               beams=update.beams)
