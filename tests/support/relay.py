"""A loopback TCP relay in front of a real server that a test can freeze and thaw.

Frozen, the relay keeps every connection open and accepts new ones but forwards nothing, either
way: bytes in flight stay in the relay (or in the kernel's buffers) until it thaws, when they are
delivered in order. That is a database host that stops answering without a reset (a partition, a
hung VM): the client's socket stays connected, nothing arrives, no error comes. Unlike a cut, a
thaw loses nothing, so a test can check both that the client gave up in time and that the server
is reachable again afterwards.

The upstream is a TCP port or a Unix socket path (pgserver's PostgreSQL listens on one).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FreezableRelay:
    """Forwards 127.0.0.1:``port`` (a free port) to ``upstream``: ``(host, port)`` or a Unix socket path."""

    def __init__(self, upstream: tuple[str, int] | str):
        self.upstream = upstream
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, name="relay-accept", daemon=True)

    def __enter__(self) -> FreezableRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def freeze(self) -> None:
        """Stop forwarding, both ways, on every connection (open or new); close nothing."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Forward again, what waited first."""
        self._flowing.set()

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.upstream)
            return sock
        return socket.create_connection(self.upstream, timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect_upstream()
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="relay-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()  # frozen: read nothing, so the sender's bytes wait in the kernel
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # frozen while reading: hold what was read until the thaw
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.thaw()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class RelayProcess:
    """A :class:`FreezableRelay` in a child process (``python -m tests.support.relay UPSTREAM``), so
    a test that counts its own threads and descriptors counts none of the relay's. SIGUSR1
    freezes it, SIGUSR2 thaws it; :meth:`freeze` and :meth:`thaw` return once the relay says it
    did (a line on its stdout). Without that wait, a connection made just after ``freeze()``
    could go through before the relay's main thread ran the handler (up to its 50 ms sleep, longer
    on a loaded machine): a fresh-clone run saw a "frozen" database answer in 0.01 s."""

    def __init__(self, upstream: str):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.relay", upstream],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def freeze(self) -> None:
        import signal

        self._signal_and_wait(signal.SIGUSR1, "frozen")

    def thaw(self) -> None:
        import signal

        self._signal_and_wait(signal.SIGUSR2, "thawed")

    def _signal_and_wait(self, signum: int, said: str) -> None:
        assert self.proc.stdout is not None
        self.proc.send_signal(signum)
        line = self.proc.stdout.readline().strip()  # one line per signal: the next one waits for it
        assert line == said, f"the relay said {line!r}, not {said!r} (exit status {self.proc.poll()})"

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _serve(upstream: str) -> None:
    import signal
    import sys
    import time

    relay = FreezableRelay(upstream)
    def on_freeze(*_: object) -> None:
        relay.freeze()
        print("frozen", flush=True)

    def on_thaw(*_: object) -> None:
        relay.thaw()
        print("thawed", flush=True)

    signal.signal(signal.SIGUSR1, on_freeze)
    signal.signal(signal.SIGUSR2, on_thaw)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with relay:
        print(relay.port, flush=True)
        while True:  # not signal.pause(): a signal the kernel hands a pump thread would not wake it
            time.sleep(0.05)


if __name__ == "__main__":
    import sys

    _serve(sys.argv[1])
