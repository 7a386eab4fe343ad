"""A real S3 endpoint for the tests: moto's ``ThreadedMotoServer`` on 127.0.0.1 and a free port, reached
by s3fs and boto3 over HTTP through ``AWS_ENDPOINT_URL`` exactly as they reach AWS; and a small HTTP proxy
in front of it that fails chosen requests (a 500 or a 503 SlowDown), since moto has no fault hooks for S3.
"""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """One moto server (start/stop), its URL, and a reset of all its state."""

    def __init__(self, port: int | None = None):
        from moto.server import ThreadedMotoServer

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> S3Server:
        self._server.start()
        return self

    def client(self):
        """A boto3 S3 client of this server (made once: a client costs about a second of CPU)."""
        if getattr(self, "_client", None) is None:
            import boto3
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                region_name=REGION)
        return self._client

    def stop(self) -> None:
        self._server.stop()

    def reset(self) -> None:
        """``POST /moto-api/reset``: every bucket and object gone."""
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10).read()


def slow_down(code: int = 503) -> tuple[int, bytes]:
    """The XML body S3 sends with a 503 SlowDown (a 500 InternalError for ``code`` 500, a 404 NoSuchUpload, a
    412 PreconditionFailed)."""
    name, msg = {503: ("SlowDown", "Please reduce your request rate."),
                 404: ("NoSuchUpload", "The specified upload does not exist."),
                 412: ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold")}.get(
        code, ("InternalError", "We encountered an internal error. Please try again."))
    return code, (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{name}</Code><Message>{msg}</Message>'
                  f"<RequestId>fault</RequestId></Error>").encode()


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards to ``upstream`` (the moto server) and answers chosen
    requests itself with an S3 error instead.

    ``fail(method, path_regex, times, code)`` arms a rule: the next ``times`` requests whose method and
    path (with the query) match get ``code`` (503: SlowDown, 500: InternalError); ``times=None`` fails every
    match. ``seen`` lists (method, path, status) of every request, for assertions.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.rules: list[list] = []
        self.seen: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = _read_chunked(self.rfile)
                fault = proxy._fault(self.command, self.path)
                if fault is not None:
                    status, data = slow_down(fault)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    proxy.seen.append((self.command, self.path, status))
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding",)}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection", "server", "date"):
                        self.send_header(k, v)
                # a HEAD answer has no body but the object's length
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()
                proxy.seen.append((self.command, self.path, resp.status))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def fail(self, method: str, path: str, times: int | None = 1, code: int = 503,
             when: Callable[[], bool] | None = None) -> None:
        with self._lock:
            self.rules.append([method, re.compile(path), times, code, when])

    def _fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for rule in self.rules:
                m, rx, times, code, when = rule
                if m == method and rx.search(path) and (times is None or times > 0) and (when is None or when()):
                    if times is not None:
                        rule[2] = times - 1
                    return code
        return None


def _read_chunked(f) -> bytes:
    out = b""
    while True:
        size = int(f.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            return out
        out += f.read(size)
        f.readline()


def aws_env(monkeypatch, endpoint: str, tmp_path: Path) -> None:
    """Point s3fs and boto3 at ``endpoint`` with test credentials, as a user's environment would, and
    keep every other AWS setting of the host out (no profile, no config file, no instance metadata)."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/neuron-build-tests/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/neuron-build-tests/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()

