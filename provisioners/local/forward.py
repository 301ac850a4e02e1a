"""A TCP port of a namespace VM made reachable from this machine: ``PortForward`` listens on
127.0.0.1 of this machine's own network and relays each connection to a host and port as the VM
sees them (the controller VM's Ray dashboard, a node's Prometheus endpoint). Nothing is routed
between the networks: bytes are copied by this process, and only this machine's loopback
listens."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0


class PortForward:
    """``listener``: a listening socket in this machine's network (made by the caller in that
    network); ``target``: (host, port) as the thread that made this object sees them (threads
    started here connect from that thread's network)."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self.listener, self.target = listener, target
        self.port = listener.getsockname()[1]
        self._closed = threading.Event()
        # started from the caller's thread: its connections are made in the caller's network
        self._thread = threading.Thread(target=self._accept, name="port-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self.listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until either side ends, then end both."""
    try:
        while data := source.recv(CHUNK_BYTES):
            sink.sendall(data)
    except OSError:
        pass  # the other side went: the connection is over
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()


def loopback_listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def forward_from(
    make_listener: Callable[[], socket.socket], target: tuple[str, int]
) -> PortForward:
    """A forward whose listener ``make_listener()`` makes (e.g. in this machine's network while
    this thread is in a VM's)."""
    return PortForward(make_listener(), target)
