"""A small threaded TCP forwarder that a test can cut (close every connection, refuse new ones)
and restore, to simulate a broker outage without losing the broker's in-memory topics; or turn
into a black hole (connections stay open and new ones are accepted, but nothing is forwarded: a
broker that hangs, or a network that drops every packet)."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.broker import free_port


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port``."""

    def __init__(self, target_port: int, port: int | None = None):
        self.target_port = target_port
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._holed = threading.Event()
        self.connections = 0

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), name="proxy-accept", daemon=True)
        self._thread.start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self._holed.is_set():  # accepted, read, never answered
                with self._lock:
                    self._sockets.add(client)
                threading.Thread(target=self._pipe, args=(client, client), name="proxy-hole", daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), name="proxy-pipe", daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._holed.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with self._lock:
                    self._sockets.discard(s)
                s.close()

    def cut(self) -> None:
        """Close the listening socket (new connections are refused) and every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        """Listen again on the same port."""
        self.start()

    def black_hole(self) -> None:
        """From now on forward nothing, either way, on open connections and new ones alike."""
        self._holed.set()

    def fill(self) -> None:
        """End the black hole: its connections are closed (clients reconnect) and new ones are forwarded."""
        self._holed.clear()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.cut()
