"""What every engine child process does at start: its name, signals, logging, parent-death, readiness report.

`run_child` is the spawn target of every child: it names the process for `ps`/`top`
(`rapid_llm::scheduler`), imports the `RAPID_LLM_PLUGINS` modules (utils/plugins.py), then the real entry point
from a "module:function" string, so the launcher never imports the engine's modules just to name a target.
Children ignore SIGINT (Ctrl-C reaches the whole process group; the launcher alone decides how
to stop) and exit cleanly on SIGTERM, whichever thread it reaches (`signal_wakeup`). On Linux a child also asks the kernel for SIGTERM when the
launcher dies, so a killed launcher never leaves orphans holding memory or a GPU.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import setproctitle

from rapid_llm.utils import signal_wakeup
from rapid_llm.utils.lazy_import import import_target
from rapid_llm.utils.plugins import load_plugins

LOG_FORMAT = "%(asctime)s %(levelname)s [%(processName)s] %(message)s"
_PR_SET_PDEATHSIG = 1


def set_process_title(role: str) -> None:
    setproctitle.setproctitle(f"rapid_llm::{role}")


def run_child(role: str, target: str, *args: Any) -> None:
    """Name this process, import the `RAPID_LLM_PLUGINS` modules, then import `target` ("module:function") and call
    it with `args`.

    The last argument is the readiness pipe, so an import failure is reported like any start-up error.
    """
    set_process_title(role)
    try:
        load_plugins()
        entry_point = import_target(target)
    except Exception as error:
        report_failure(args[-1], error)
        sys.exit(1)
    entry_point(*args)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, datefmt="%H:%M:%S", force=True)


def _exit_on_sigterm(signum: int, frame: Any) -> NoReturn:
    # A second SIGTERM (e.g. the parent-death signal) must not interrupt the clean-up under way.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def configure_child(log_level: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal_wakeup.install()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        parent = multiprocessing.parent_process()
        # A launcher that died before the prctl call above would never send the signal.
        if parent is not None and os.getppid() != parent.pid:
            raise SystemExit(0)
    configure_logging(log_level)


def report_ready(conn: Connection, info: dict[str, Any] | None = None) -> None:
    conn.send(("ready", info or {}))
    conn.close()


def report_failure(conn: Connection, error: BaseException) -> None:
    """Send the root cause on one line, then the traceback, to the launcher."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    conn.send(("error", f"{type(cause).__name__}: {cause}\n{traceback.format_exc()}"))
    conn.close()
