"""Entry point of the detokenizer process: TokenBatch from the scheduler in, TextBatch to the frontend out.

A stop string is only seen here, so when one ends a request this process also tells the
scheduler to abort it (freeing its KV blocks at once) instead of leaving that to each client.

The process sleeps in a blocking `recv` between batches. There is no shutdown message on its input
channel: the launcher stops it with SIGTERM, which `configure_child` turns into a clean exit (code 0,
no traceback) that unwinds through `recv`, since pyzmq runs signal handlers when a call is interrupted.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

import zmq

from rapid_llm.detokenizer_proc.detokenizer import Detokenizer, load_tokenizer
from rapid_llm.ipc.messages import AbortRequest, TextBatch, TokenBatch
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.utils.process import configure_child, report_failure, report_ready

def run_detokenizer(tokenizer_dir: str, paths: IpcPaths, log_level: str, ready: Connection) -> None:
    """Load the tokenizer, report ready (or the start-up error) on `ready`, then serve until SIGTERM."""
    configure_child(log_level)
    context = zmq.Context()
    try:
        try:
            detokenizer = Detokenizer(load_tokenizer(tokenizer_dir))
            receiver: Receiver[TokenBatch] = Receiver(context, paths.scheduler_to_detokenizer, TokenBatch)
            sender = Sender(context, paths.detokenizer_to_frontend)
            scheduler = Sender(context, paths.frontend_to_scheduler)
        except Exception as error:
            report_failure(ready, error)
            sys.exit(1)
        report_ready(ready)
        while True:
            text_batch = detokenizer.process(receiver.recv())
            if text_batch is not None:
                sender.send(text_batch)
                _abort_stopped(text_batch, scheduler)
    finally:
        context.destroy(linger=0)


def _abort_stopped(batch: TextBatch, scheduler: Sender) -> None:
    """Requests ended by a stop string (stop_reason is the string) are still running in the scheduler."""
    for delta in batch.deltas:
        if delta.finish_reason == "stop" and isinstance(delta.stop_reason, str):
            scheduler.send(AbortRequest(delta.request_id))
