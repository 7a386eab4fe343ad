"""Headless Debian ``chromium`` driven through the DevTools protocol (``websocket-client``), for tests that
render a page as a user's browser would: load a file, collect script errors, console errors and every
network request, and evaluate an expression in the page."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def chromium_binary() -> str:
    """The chromium executable (``.ci/run`` installs Debian's ``chromium`` when it is missing)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("chromium is not installed: apt-get install -y chromium (.ci/run does this)")


class Browser:
    """One headless chromium process with one page, as a context manager."""

    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        import websocket

        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                self.__exit__()
                raise RuntimeError(f"chromium did not start its DevTools endpoint: {err[-2000:]}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        url = next(p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page")
        self.ws = websocket.create_connection(url, timeout=self.timeout_s, suppress_origin=True)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc: Any) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        self.proc.kill()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events that arrive meanwhile are kept)."""
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def load(self, path: Path) -> dict[str, Any]:
        """Open ``path`` (a local file) and wait for its load event, then a moment for late scripts.

        Returns:
            ``{"errors": [...], "requests": [urls]}``: uncaught exceptions, console errors and error log
            entries of this page, and every URL it requested (the page itself included).
        """
        self.events = []
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading in {self.timeout_s:g} s")
            self.events.append(json.loads(self.ws.recv()))
        self.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 300))", awaitPromise=True)
        errors, requests = [], []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append(d.get("exception", {}).get("description") or d.get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text"))
            elif m == "Network.requestWillBeSent":
                requests.append(p["request"]["url"])
        return {"errors": errors, "requests": requests}

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")
