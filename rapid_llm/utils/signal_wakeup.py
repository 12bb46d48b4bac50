"""Wake a child's blocking zmq wait when a signal arrives, whichever thread the kernel gave it to.

A signal sent to a process may be delivered to any of its threads that does not block it -- the
tokenizers' and torch's thread pools included. Python's C handler then only records it, and a main
thread blocked in zmq_recv or zmq_poll is never interrupted, so SIGTERM would go unanswered until a
message happened to arrive. Python writes a byte per signal to its wakeup fd from whatever thread
caught it; engine children poll that fd beside their sockets, wake, and run the handler.

Usage:
    install()  # once, in the child's main thread (`configure_child` does it)
    poller.register(wakeup_fd(), zmq.POLLIN)  # when it is not None; call drain() when it fires
"""

from __future__ import annotations

import signal
import socket

_pair: tuple[socket.socket, socket.socket] | None = None


def install() -> None:
    global _pair
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    # Bytes beyond the buffer are dropped silently: one pending byte is enough to wake the poll.
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _pair = (reader, writer)


def wakeup_fd() -> int | None:
    """The fd to poll for signals, or None in a process that did not `install()` (e.g. the launcher)."""
    return None if _pair is None else _pair[0].fileno()


def drain() -> None:
    if _pair is None:
        return
    try:
        while _pair[0].recv(4096):
            pass
    except BlockingIOError:
        pass
