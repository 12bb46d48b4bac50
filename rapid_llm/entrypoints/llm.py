"""Offline API: `LLM(model=...).generate(prompts, SamplingParams(...))` over the same engine processes.

No HTTP: this process tokenizes, sends requests straight to the scheduler and collects text from
the detokenizer. As in vLLM, `generate` without sampling params uses `get_default_sampling_params()`
(the checkpoint's generation_config.json sampling defaults, per --generation-config); explicit
SamplingParams are used as given. `shutdown()` (or leaving a `with` block, or interpreter exit) stops every child.
A choice the engine ends with an error (refused, or failed in the worker) does not raise: it ends
with finish_reason "abort" and `CompletionOutput.error` saying why, and the other choices keep
their results. Beam search: `SamplingParams(use_beam_search=True, ...)` or `beam_search(...)`; its n best
beams are the prompt's outputs. Speculative decoding: `LLM(..., speculative_config={"method": "ngram",
"num_speculative_tokens": 3})`, the dict form of `--speculative-config`. Data parallelism:
`LLM(..., data_parallel_size=2)` spreads the requests over the replicas with the frontend's Router
(`load_balance_method`), each request's abort going to the replica that owns it. `embed(prompts)` pools each
prompt's final hidden states (vLLM's `LLM.embed`).
"""

from __future__ import annotations

import atexit
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import zmq

from rapid_llm.entrypoints.engine_processes import EngineProcesses
from rapid_llm.frontend.router import Router
from rapid_llm.ipc.choice_output import ChoiceOutput
from rapid_llm.ipc.messages import AbortRequest, GenerateBatch, GenerateRequest, TextBatch
from rapid_llm.ipc.sockets import Receiver, Sender
from rapid_llm.sampling import SamplingParams, fit_max_tokens
from rapid_llm.sampling.pooling import checkpoint_pooling, normalized
from rapid_llm.server_args import ServerArgs

Prompt = str | Sequence[int]
_instance_ids = itertools.count()


@dataclass
class CompletionOutput(ChoiceOutput):
    index: int = 0  # the choice's place among its prompt's n
    cumulative_logprob: float | None = None  # set for beam search's beams


@dataclass
class RequestOutput:
    """One prompt's result; `.text`, `.token_ids`, `.finish_reason`, `.num_cached_tokens` are those of
    the first choice."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def num_cached_tokens(self) -> int:
        return self.outputs[0].num_cached_tokens


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """One prompt's embedding, as vLLM's `LLM.embed` returns it (`.outputs.embedding`)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        from rapid_llm.utils.demo_checkpoint import model_dir_or_demo
        from rapid_llm.utils.tokenizer_loading import load_tokenizer

        args = ServerArgs(model=model, **engine_args)
        self.config = args.engine_config(model_dir_or_demo(model))
        self._engine = EngineProcesses(self.config)
        self._context = zmq.Context()
        self.tokenizer = self._engine.start_while(
            lambda: load_tokenizer(self.config.tokenizer, args.trust_remote_code))
        replica_paths = self._engine.replica_paths
        self._requests = [Sender(self._context, paths.frontend_to_scheduler) for paths in replica_paths]
        self._texts: list[Receiver[TextBatch]] = [Receiver(self._context, paths.detokenizer_to_frontend, TextBatch)
                                                  for paths in replica_paths]
        self._poller = zmq.Poller()
        for receiver in self._texts:
            self._poller.register(receiver.socket, zmq.POLLIN)
        self._router = Router(len(replica_paths), self.config.parallel.load_balance_method,
                              self.config.cache.block_size, self._engine.replica_info(0)[0]["num_kv_blocks"])
        self._request_ids = (f"offline-{next(_instance_ids)}-{i}" for i in itertools.count())
        atexit.register(self.shutdown)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the --generation-config defaults applied (what `generate` uses without params)."""
        return SamplingParams(**self.config.sampling_defaults)

    def _prompt_token_ids(self, prompt: Prompt) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); one RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = (
            list(sampling_params) if isinstance(sampling_params, Sequence)
            else [sampling_params or self.get_default_sampling_params()] * len(prompts)
        )
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
        # Everything is checked before anything is sent, so a bad prompt leaves nothing running.
        token_id_lists = [self._prompt_token_ids(prompt) for prompt in prompts]
        for token_ids, params in zip(token_id_lists, params_list):
            fit_max_tokens(len(token_ids), params.validate().max_tokens, self.config.model.max_model_len)
        results: list[RequestOutput] = []
        requests: list[GenerateRequest] = []
        choices: dict[str, CompletionOutput] = {}
        for token_ids, params in zip(token_id_lists, params_list):
            result = RequestOutput(next(self._request_ids), token_ids, [])
            for index, choice_params in enumerate(params.per_choice()):
                request_id = f"{result.request_id}-{index}"
                result.outputs.append(choices.setdefault(request_id, CompletionOutput(index=index)))
                requests.append(GenerateRequest(request_id, token_ids, choice_params))
            results.append(result)
        unfinished = set(choices)
        try:
            # One message per replica, so each scheduler admits its share together (deterministic first steps).
            batches: dict[int, list[GenerateRequest]] = {}
            for request in requests:
                replica = self._router.route(request.request_id, request.prompt_token_ids,
                                             request.params.max_tokens or 0)
                batches.setdefault(replica, []).append(request)
            for replica, batch in batches.items():
                self._requests[replica].send(GenerateBatch(batch))
            self._collect(choices, unfinished)
            for result in results:
                _expand_beams(result)
        except BaseException:
            # Interrupted (Ctrl-C) or failed: stop what is still running so the next call starts clean.
            for request_id in unfinished:
                replica = self._router.replica_of(request_id)
                if replica is not None:
                    self._requests[replica].send(AbortRequest(request_id))
            raise
        finally:
            for request in requests:
                self._router.finish(request.request_id)
        return results

    def beam_search(self, prompts: Prompt | Sequence[Prompt], beam_width: int, max_tokens: int, n: int = 1,
                    length_penalty: float = 1.0, early_stopping: bool | str = False,
                    ignore_eos: bool = False) -> list[RequestOutput]:
        """vLLM's `LLM.beam_search` in brief: `generate` with use_beam_search; the n best beams per prompt, best
        first, each with its cumulative_logprob."""
        params = SamplingParams(n=n, beam_width=beam_width, use_beam_search=True, temperature=0.0,
                                max_tokens=max_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
                                ignore_eos=ignore_eos)
        return self.generate(prompts, params)

    def embed(self, prompts: Prompt | Sequence[Prompt], normalize: bool = True) -> list[EmbeddingRequestOutput]:
        """vLLM's `LLM.embed`: each prompt's pooled final hidden states (the checkpoint's pooling, see
        sampling/pooling.py), unit-normalised unless `normalize` is False; one output per prompt, in order."""
        pooling = checkpoint_pooling(self.config.model.model)
        results = self.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, pooling=pooling))
        outputs = []
        for result in results:
            choice = result.outputs[0]
            if choice.error is not None:
                raise RuntimeError(f"embedding request {result.request_id} failed: {choice.error}")
            vector = normalized(choice.embedding) if normalize else choice.embedding
            outputs.append(EmbeddingRequestOutput(result.request_id, result.prompt_token_ids, EmbeddingOutput(vector)))
        return outputs

    def _collect(self, choices: dict[str, CompletionOutput], unfinished: set[str]) -> None:
        """Gather deltas until every request in `unfinished` (emptied as they finish) is done."""
        while unfinished:
            if not self._engine.is_alive():
                raise RuntimeError("an engine process died; see the log above")
            ready = dict(self._poller.poll(1000))
            for receiver in self._texts:
                if receiver.socket not in ready:
                    continue
                for delta in receiver.recv().deltas:
                    choice = choices.get(delta.request_id)
                    if choice is None or delta.request_id not in unfinished:
                        continue
                    choice.add(delta)
                    self._router.progress(delta.request_id, len(delta.token_ids))
                    if delta.finish_reason is not None:
                        unfinished.discard(delta.request_id)

    def shutdown(self) -> None:
        """Stop the engine processes and remove their sockets (safe to call twice)."""
        atexit.unregister(self.shutdown)
        self._engine.shutdown()
        if hasattr(self, "_context"):
            self._context.destroy(linger=0)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _expand_beams(result: RequestOutput) -> None:
    """A finished beam search's one output becomes its beams, one CompletionOutput each."""
    if len(result.outputs) != 1 or not result.outputs[0].beams:
        return
    search = result.outputs[0]
    result.outputs = []
    for index, beam in enumerate(search.beams):
        output = CompletionOutput.from_beam(beam, search.num_cached_tokens)
        output.index, output.cumulative_logprob = index, beam.cumulative_logprob
        result.outputs.append(output)
