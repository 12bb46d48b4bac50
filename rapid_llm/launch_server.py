"""`python -m rapid_llm.launch_server`: resolve the config, start the engine processes, serve HTTP.

Everything that can be checked without weights (flags, paths, tokenizer files, architecture, the
listening port) is checked first, failing with one line. Then the engine children start, so their
imports and weight loading overlap with the tokenizer load here; meanwhile the listening socket answers
503 "starting" (`entrypoints/starting_responder.py`). The frontend runs in this process
on uvicorn (uvloop where available), talking to one engine or, with --data-parallel-size, routing over
its replicas (`entrypoints/frontend_client.py`). A child that dies later stops the server with a log line
and a non-zero exit; SIGINT/SIGTERM stop every child and remove the socket files. With --node-rank > 0 this
process serves no HTTP and only supervises that node's worker ranks (`entrypoints/headless.py`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rapid_llm.server_args import ServerArgs

logger = logging.getLogger("rapid_llm.launch_server")


def _check_package_not_shadowed() -> None:
    """Raise ImportError when `import rapid_llm` found something other than the package this file is in.

    A folder named rapid_llm in the current or the script's directory (the head of sys.path) wins over an
    editable install, whose finder Python asks last. This module still loads (that finder resolves the
    package's submodules), but the package's `__init__` never ran: without this check the launcher would fail
    later on a bare AttributeError (`rapid_llm.__version__`).
    """
    import rapid_llm

    package_dir = Path(__file__).resolve().parent
    found = getattr(rapid_llm, "__file__", None)
    if found is not None and Path(found).resolve().parent == package_dir:
        return
    shadow = found or ", ".join(getattr(rapid_llm, "__path__", []))
    raise ImportError(f"`import rapid_llm` found {shadow}, not the rapid_llm package ({package_dir}): a folder "
                      "named rapid_llm in the current directory or the script's directory shadows it; run from "
                      "another directory, or rename that folder")


_check_package_not_shadowed()


class ShutdownRequested(BaseException):
    """SIGTERM, turned into an exception so `finally` blocks stop the children."""


def _request_shutdown(signum: int, frame: Any) -> NoReturn:
    raise ShutdownRequested


def _run_event_loop(main: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    from rapid_llm.server_args import ServerArgs

    return run(ServerArgs.from_cli(argv))


def run(args: ServerArgs) -> int:
    """Serve until stopped; the exit code (0: stopped on request, 1: an engine process failed, 2: bad setting)."""
    from rapid_llm.utils.process import configure_logging, set_process_title

    configure_logging(args.log_level)
    set_process_title("frontend")
    started = time.perf_counter()
    # uvicorn re-raises the signal it caught once it has stopped; with a Python handler installed
    # that becomes an exception here, so the `finally` below still stops the children.
    signal.signal(signal.SIGTERM, _request_shutdown)
    try:
        return _serve(args, started)
    except (KeyboardInterrupt, ShutdownRequested):
        logger.info("stopped on request")
        return 0


def _serve(args: ServerArgs, started: float) -> int:
    from rapid_llm.entrypoints.http_server import HttpServer, bind_listening_socket, uvicorn_config
    from rapid_llm.utils.demo_checkpoint import model_dir_or_demo

    # Cheapest checks first, so a typo is reported before the heavier imports below.
    try:
        args.check_http()
        # A node other than 0 serves no HTTP.
        listening_socket = bind_listening_socket(args.host, args.port) if args.node_rank == 0 else None
        model_dir = model_dir_or_demo(args.model)
        config = args.engine_config(model_dir)
        frontend_options = args.frontend_options(config.sampling_defaults)
    except (ValueError, OSError) as error:
        logger.error("invalid configuration: %s", error)
        return 2
    from rapid_llm.entrypoints.engine_processes import EngineProcesses, EngineStartupError
    from rapid_llm.entrypoints.frontend_client import frontend_client
    from rapid_llm.entrypoints.headless import serve_headless
    from rapid_llm.entrypoints.starting_responder import StartingResponder
    from rapid_llm.frontend.app import build_app
    from rapid_llm.frontend.lora_adapters import LoRAAdapters
    from rapid_llm.utils.tokenizer_loading import load_tokenizer

    logger.info("config resolved in %.2f s: %s (%s, %s), max_model_len %d, device %s", time.perf_counter() - started,
                config.model.architecture, model_dir, config.model.dtype_name, config.model.max_model_len,
                config.device.type)
    scheduler = config.scheduler
    logger.info("scheduler: max_num_seqs %d, max_num_batched_tokens %d, prefix caching %s, async scheduling %s; "
                "API key %s", scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
                _on_off(scheduler.enable_prefix_caching), _on_off(scheduler.async_scheduling),
                _on_off(args.api_key is not None))

    try:
        engine = EngineProcesses(config)
    except ValueError as error:
        logger.error("invalid configuration: %s", error)
        return 2
    if config.parallel.node_rank > 0:
        return serve_headless(engine)
    try:
        # Until the engine is ready, /health answers 503 "starting" (a first start may compile the C++ ops).
        with StartingResponder(listening_socket):
            tokenizer = engine.start_while(
                lambda: load_tokenizer(config.tokenizer, args.trust_remote_code))
    except (EngineStartupError, OSError, ValueError, RuntimeError) as error:
        logger.error("start-up failed: %s", error)
        return 1

    try:
        # Adapters named at start are checked against the linears the workers wrapped.
        adapters = LoRAAdapters(config.served_model_name, config.scheduler.lora,
                                engine.replica_info(0)[1]["lora_targets"])
    except ValueError as error:
        logger.error("start-up failed: %s", error)
        engine.shutdown()
        return 1
    manager, collectors = frontend_client(engine, tokenizer, model_dir)
    app = build_app(manager, frontend_options, collectors, adapters)
    # A bounded graceful shutdown: requests still open after the grace period end with an error, not a hang.
    server = HttpServer(uvicorn_config(app, args.host, args.port, args.log_level, args.shutdown_timeout),
                        end_streams=lambda: manager.fail_all("the server is shutting down"),
                        grace_s=args.shutdown_timeout)
    died: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def on_child_exit(name: str, exit_code: int | None) -> None:
        if server.should_exit:
            return  # the launcher is stopping too (e.g. SIGTERM sent to the whole process group)
        # configure_child turns SIGTERM into exit code 0: someone stopped that child, it did not crash.
        how = "was stopped" if exit_code == 0 else "died"
        log = logger.info if exit_code == 0 else logger.error
        log("the %s process %s (exit code %s); shutting the server down", name, how, exit_code)
        if exit_code != 0:
            died.append(name)
        for loop in loops:
            loop.call_soon_threadsafe(manager.fail_all, f"the engine stopped: the {name} process {how}")
        server.should_exit = True

    engine.watch(on_child_exit)

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await manager.start()
        logger.info("engine ready after %.2f s; starting HTTP for %r on http://%s:%d",
                    time.perf_counter() - started, config.served_model_name, args.host, args.port)
        try:
            await server.serve(sockets=[listening_socket])
        finally:
            await manager.stop()

    try:
        _run_event_loop(serve())
    finally:
        engine.shutdown()
    return 1 if died or not server.started else 0


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


if __name__ == "__main__":
    sys.exit(main())
