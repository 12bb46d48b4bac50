"""NodeLink: one TCP connection between node 0's launcher and each other node's, so each side sees the other go.

Key design choice: the connection carries a one-line hello (the node rank) and, when a launcher shuts down in
order, a goodbye; otherwise its job is that the kernel closes it when a launcher exits, however it exits
(SIGKILL included). The engine watcher waits on it next to the children's sentinels, so node 0 losing node k
(or node k losing node 0) shuts that launcher down like a child that was stopped (goodbye) or died (none). Node 0 listens at --dist-init-addr's port + 1 from the start; the
others connect once their ranks are ready (the group could only form with node 0 up).
Usage: `link = NodeLink(parallel); ...; link.establish(); wait([*link.peers.values()])`.
"""

from __future__ import annotations

import socket
import time

from rapid_llm.config.node_layout import node_link_address
from rapid_llm.config.parallel_config import ParallelConfig

ESTABLISH_TIMEOUT_S = 60.0
_GOODBYE = b"stop\n"


class NodeLink:
    def __init__(self, parallel: ParallelConfig) -> None:
        self.parallel = parallel
        self.address = node_link_address(parallel.dist_init_addr or "")
        self.peers: dict[str, socket.socket] = {}  # "node<k>-launcher" -> its connection
        self._server: socket.socket | None = None
        if parallel.node_rank == 0:
            try:
                self._server = socket.create_server(self.address)
            except OSError as error:
                raise ValueError(f"--dist-init-addr: cannot listen on {self.address[0]}:{self.address[1]} for "
                                 f"the node link ({error.strerror or error}); choose another port") from None

    def establish(self, timeout: float = ESTABLISH_TIMEOUT_S) -> None:
        """Node 0: accept every other node's connection; other nodes: connect to node 0."""
        deadline = time.monotonic() + timeout
        if self._server is not None:
            self._server.settimeout(timeout)
            while len(self.peers) < self.parallel.nnodes - 1:
                try:
                    connection, _ = self._server.accept()
                except socket.timeout:
                    raise RuntimeError(f"only {len(self.peers)} of {self.parallel.nnodes - 1} other nodes connected "
                                       f"to the node link within {timeout:.0f} s") from None
                connection.settimeout(max(1.0, deadline - time.monotonic()))
                try:
                    hello = connection.recv(64).decode(errors="replace").strip()
                except OSError:
                    hello = ""
                name = f"node{hello}-launcher"
                if not hello.isdigit() or not 0 < int(hello) < self.parallel.nnodes or name in self.peers:
                    connection.close()  # not one of our nodes (or a node rank given twice)
                    continue
                connection.settimeout(None)
                self.peers[name] = connection
            return
        while True:
            try:
                connection = socket.create_connection(self.address, timeout=5.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node 0's link at {self.address[0]}:{self.address[1]} did not answer "
                                       f"within {timeout:.0f} s") from None
                time.sleep(0.2)
        connection.sendall(f"{self.parallel.node_rank}\n".encode())
        connection.settimeout(None)
        self.peers["node0-launcher"] = connection

    @staticmethod
    def said_goodbye(connection: socket.socket) -> bool:
        """After `connection` became readable: True if the peer shut down in order, False if it vanished."""
        try:
            return connection.recv(len(_GOODBYE)) == _GOODBYE
        except OSError:
            return False

    def close(self) -> None:
        """Tell every peer this launcher is shutting down in order, then close the connections."""
        for connection in self.peers.values():
            try:
                connection.sendall(_GOODBYE)
            except OSError:
                pass  # that peer is gone already
            connection.close()
        if self._server is not None:
            self._server.close()
