"""A TCP fault proxy on loopback, between a client (s3fs, boto3) and a server (the moto S3 server): the
network faults a shared store meets, made on the wire instead of in a patched client.

Modes (:class:`TcpFaultProxy`):

- pass-through (the default, and :meth:`~TcpFaultProxy.heal`);
- ``delay(seconds)``: every chunk forwarded, either way, waits ``seconds`` first (a slow, long link);
- ``reset(match, after_bytes)``: the next connection whose client bytes contain ``match`` is closed with
  a TCP RST (``SO_LINGER`` 0) once ``after_bytes`` more bytes of it have been forwarded: a reset mid-transfer;
- ``black_hole(match, after_bytes)``: once a connection has sent ``match`` and ``after_bytes`` more, nothing
  is forwarded any more, on any connection: open ones are neither read nor answered, new ones are accepted
  and ignored (a network that swallows packets: the client's writes stall once the socket buffers are full);
  :meth:`~TcpFaultProxy.heal` closes what it swallowed, on both sides.

- ``lose_answer(match)``: the next connection whose client bytes contain ``match`` has its request delivered
  whole, and its answer is never delivered: when the server's response (other than ``100 Continue``) comes,
  the client's connection is reset instead (the request was applied, the client cannot know: a lost answer).

``match`` is a byte string looked for in what the client sends (an HTTP request line such as
``b"PUT /bucket/team/cas/"``); None matches the first bytes of any connection. The proxy's sockets have
small buffers (:data:`BUFFER`) so that a stalled transfer stalls after a few hundred KiB, not after the
several MiB a loopback socket buffers by default.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

#: SO_RCVBUF / SO_SNDBUF of the proxy's sockets, bytes.
BUFFER = 64 * 1024
CHUNK = 16 * 1024


class TcpFaultProxy:
    """Forward TCP connections from ``127.0.0.1:<port>`` (a free port) to ``upstream`` (``http://host:port``
    or ``host:port``), with faults.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (what ``AWS_ENDPOINT_URL`` points at).
        connections: connections accepted so far. resets: connections reset by a ``reset`` rule.
        holed: True once the black hole is open (until :meth:`heal`); holed_at: when it opened
            (``time.monotonic()``), or None.
    """

    def __init__(self, upstream: str):
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)  # inherited by accepted sockets
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.resets = 0
        self.holed = False
        self.holed_at: float | None = None
        self._delay = 0.0
        self._delays_left: int | None = None
        self._reset: list | None = None   # [match, after_bytes, times left]
        self._hole: list | None = None    # [match, after_bytes]
        self._lose: list | None = None    # [match, times left]
        self.lost_answers = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._ignored: list[socket.socket] = []  # accepted while the black hole was open
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-fault-proxy", daemon=True)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> TcpFaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            for s in self._open:
                _close(s)
            self._open.clear()
        self._thread.join(timeout=5)

    def heal(self) -> None:
        """Forward everything again from now on. Connections swallowed by a black hole are closed on both
        sides (their clients gave up; a server drops such connections by its own timeout), so a server
        never waits for the rest of a body that will not come."""
        with self._lock:
            self._delay, self._reset, self._hole, self.holed = 0.0, None, None, False
            self._lose = None
            self._delays_left = None
            ignored, self._ignored = self._ignored, []
        for s in ignored:
            _close(s)

    def delay(self, seconds: float, times: int | None = None) -> None:
        """Wait ``seconds`` before forwarding each chunk (either way); only the next ``times`` chunks when
        given (a link that stalls, then recovers)."""
        with self._lock:
            self._delay, self._delays_left = float(seconds), times

    def reset(self, match: bytes | None = None, after_bytes: int = 0, times: int = 1) -> None:
        """Reset (RST) the next ``times`` connections that send ``match``, ``after_bytes`` bytes later."""
        with self._lock:
            self._reset = [match, int(after_bytes), int(times)]

    def lose_answer(self, match: bytes | None = None, times: int = 1) -> None:
        """Deliver the requests of the next ``times`` connections that send ``match``, and reset each one's
        client instead of forwarding the server's answer."""
        with self._lock:
            self._lose = [match, int(times)]

    def black_hole(self, match: bytes | None = None, after_bytes: int = 0) -> None:
        """Stop forwarding everything once a connection has sent ``match`` and ``after_bytes`` more bytes
        (at once when ``match`` is None and ``after_bytes`` 0)."""
        with self._lock:
            if match is None and after_bytes <= 0:
                self.holed, self.holed_at = True, time.monotonic()
            else:
                self._hole = [match, int(after_bytes)]

    # -- forwarding ------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self._sock], [], [], 0.2)
                if not r:
                    continue
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.append(client)
                holed = self.holed
            if holed:
                with self._lock:
                    self._ignored.append(client)
                continue  # accepted, never read, never answered
            try:
                self._serve(client)
            except Exception as e:  # never let the accept loop die: a dead loop looks like a black hole
                import sys
                print(f"tcp fault proxy: cannot forward a connection: {e!r}", file=sys.stderr)
                _close(client)

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream, timeout=10)
        server.settimeout(None)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
        with self._lock:
            self._open.append(server)
        conn = _Conn()
        threading.Thread(target=self._pump, args=(client, server, conn, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: _Conn, upstream: bool) -> None:
        """Copy ``src`` to ``dst`` chunk by chunk, applying the faults (``upstream``: client to server)."""
        try:
            while not self._stop.is_set() and not conn.closed:
                if self.holed:
                    conn.swallowed = True
                    time.sleep(0.05)  # swallowed: neither read nor answered
                    continue
                if conn.swallowed:  # healed since: this connection stays dead, on both sides
                    conn.closed = True
                    _close(src)
                    _close(dst)
                    return
                r, _, _ = select.select([src], [], [], 0.1)
                if not r:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    conn.closed = True
                    _shutdown(dst)
                    return
                if self._delay:
                    with self._lock:
                        wait = self._delay
                        if self._delays_left is not None:
                            self._delays_left -= 1
                            if self._delays_left <= 0:
                                self._delay, self._delays_left = 0.0, None
                    time.sleep(wait)
                if upstream:
                    data = self._upstream_faults(data, conn, src, dst)
                    if data is None:
                        return
                elif conn.lose_answer and not data.startswith(b"HTTP/1.1 100"):
                    conn.closed = True  # the request was applied; its answer is lost on the way back
                    with self._lock:
                        self.lost_answers += 1
                    _rst(dst)
                    _close(src)
                    return
                if self.holed:
                    conn.swallowed = True
                    continue
                dst.sendall(data)
        except OSError:
            conn.closed = True
            _close(src)
            _close(dst)

    def _upstream_faults(self, data: bytes, conn: _Conn, client: socket.socket, server: socket.socket) -> bytes | None:
        """Apply the reset and black-hole rules to a chunk the client sent; the bytes to forward (a prefix
        of ``data``), or None when the connection was reset."""
        with self._lock:
            window = conn.tail + data
            conn.tail = window[-256:]
            reset, hole = self._reset, self._hole
            if reset is not None and conn.reset_left is None and reset[2] > 0 and (
                    reset[0] is None or reset[0] in window):
                conn.reset_left = reset[1]
                reset[2] -= 1
            if hole is not None and conn.hole_left is None and (hole[0] is None or hole[0] in window):
                conn.hole_left = hole[1]
            lose = self._lose
            if lose is not None and not conn.lose_answer and lose[1] > 0 and (lose[0] is None or lose[0] in window):
                conn.lose_answer = True
                lose[1] -= 1
        if conn.reset_left is not None and conn.reset_left <= len(data):
            if conn.reset_left:
                server.sendall(data[:conn.reset_left])
            conn.closed = True
            with self._lock:
                self.resets += 1
            _rst(client)
            _close(server)
            return None
        if conn.reset_left is not None:
            conn.reset_left -= len(data)
        if conn.hole_left is not None:
            if conn.hole_left <= len(data):
                head = data[:conn.hole_left]
                with self._lock:
                    self.holed, self.holed_at = True, time.monotonic()
                    self._hole = None
                conn.hole_left = None
                if head:
                    server.sendall(head)
                return b""
            conn.hole_left -= len(data)
        return data


class _Conn:
    """The state of one proxied connection."""

    def __init__(self):
        self.closed = False
        self.swallowed = False  # it was open while the black hole was
        self.tail = b""
        self.reset_left: int | None = None
        self.hole_left: int | None = None
        self.lose_answer = False  # its answer is never delivered (lose_answer)


def _rst(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(s)


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass


__all__ = ["TcpFaultProxy"]
