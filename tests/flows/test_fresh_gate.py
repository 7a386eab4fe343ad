"""Issue 37, items 5 and 6: what no recorder sees, the fresh capture catches. A factory reads a value from a
loopback HTTP server into a constant of its graph; the value changes; the first-level key cannot know (no file,
no variable changed), but ``verify --fresh`` captures the graph again and exits 1 naming the target and the
graph, the ``fresh`` promotion gate refuses (exit 3), and ``--waive fresh --reason`` promotes with the waiver
in the history."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.flows.test_graph_probe import MODEL, project
from tests.helpers.cli import run_cli


class Served:
    """A loopback HTTP server (a thread of the test) answering every GET with :attr:`value`."""

    def __init__(self, value: str):
        self.value = value
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = served.value.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/scale"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def networked(url: str) -> str:
    """MODEL whose output is scaled by a number the factory fetches from ``url`` (a constant of the graph)."""
    return MODEL.replace("        return x + self.down(h)\n", "        return (x + self.down(h)) * self.scale\n").replace(
        "def build():\n    return Block()\n",
        "def build():\n    import urllib.request\n    m = Block()\n"
        f"    m.scale = float(urllib.request.urlopen({url!r}, timeout=30).read())\n    return m\n")


def test_a_network_fed_factory_is_caught_by_verify_fresh_and_the_fresh_gate(tmp_path):
    with Served("2.0") as served:
        cfg = project(tmp_path / "proj", '"fp32"', "1", model=networked(served.url))
        c = ("-c", str(cfg))
        r = run_cli("build", *c)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        rel = run_cli("release", *c, "blk", "-q").stdout.strip()
        r = run_cli("promote", *c, "blk", rel, "--to", "dev", "--allow-unvalidated", "--reason", "first")
        assert r.returncode == 0 and "PASS fresh: 1 artifact(s) match" in r.stdout, r.stdout + r.stderr[-2000:]

        served.value = "3.0"  # no file or variable changed: the record can only say it was incomplete
        plan = json.loads(run_cli("plan", *c, "--json").stdout)
        (row,) = plan["targets"]
        assert row["state"] == "missing" and any("opened a connection" in w for w in row["changed"]), row
        r = run_cli("verify", "--fresh", *c)
        assert r.returncode == 1, r.stdout + r.stderr[-2000:]
        bad = [line for line in r.stdout.splitlines() if line.startswith("DIFFERS")]
        assert len(bad) == 1 and "blk/b1/fp32/p1" in bad[0] and "graph:" in bad[0], r.stdout
        doc = json.loads(run_cli("verify", "--fresh", *c, "--json").stdout)
        row = doc["targets"][0]
        assert (row["verdict"], row["component"], row["source"]) == ("differs", "graph", "current")
        assert row["fresh_graph_key"] != row["recorded_graph_key"] and doc["verdict"] == "fail"

        r = run_cli("promote", *c, "blk", "--from", "dev", "--to", "staging", "--allow-unvalidated", "--reason", "x")
        assert r.returncode == 3, r.stdout + r.stderr[-2000:]
        assert "FAIL fresh: 1 artifact(s) not what today's code builds: blk/b1/fp32/p1 graph" in r.stderr
        r = run_cli("promote", *c, "blk", "--from", "dev", "--to", "staging", "--allow-unvalidated",
                    "--waive", "fresh", "--reason", "the scale server moved on purpose", "--json")
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]
        hist = json.loads(run_cli("history", *c, "blk", "--channel", "staging", "--json").stdout)["history"]
        assert [e["action"] for e in hist] == ["refuse", "promote"]
        assert hist[-1]["waivers"] == [{"gate": "fresh", "reason": "the scale server moved on purpose"}]
        gate = next(g for g in hist[-1]["gates"] if g["name"] == "fresh")
        assert gate["verdict"] == "waived" and gate["figures"]["not_fresh"][0]["component"] == "graph"

        served.value = "2.0"  # back to what the artifact holds: fresh again
        r = run_cli("verify", "--fresh", *c, "blk/*")
        assert r.returncode == 0 and "1 fresh, 0 differ" in r.stdout, r.stdout + r.stderr[-2000:]


def test_a_target_without_a_graph_key_is_reported_unverifiable_not_passed(tmp_path):
    """An artifact built with the graph key off (``NEURON_BUILD_GRAPH_KEY=0``) records none: ``verify --fresh``
    has nothing to compare, says so on a line of its own and counts it; no probe runs for it."""
    cfg = project(tmp_path / "proj", '"fp32"', "1")
    c = ("-c", str(cfg))
    r = run_cli("build", *c, env={"NEURON_BUILD_GRAPH_KEY": "0"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run_cli("verify", "--fresh", *c)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "UNVERIFIABLE blk/b1/fp32/p1  its artifact records no graph key"
    assert "0 probe(s)" in r.stdout and "0 fresh, 0 differ, 0 unchecked, 1 unverifiable" in r.stdout
    r = run_cli("verify", "blk/*", *c)  # patterns are for --fresh: plain verify checks the whole store
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "verify blk/*: target patterns are for `verify --fresh`; plain verify checks the whole store"), r.stderr


#: An MLP whose weights come from a seed the factory reads through libc (no recorder sees it), its weights
#: kept apart: the graph key is the structure, the same for every seed.
SEEDED = '''
import ctypes
import torch
from torch import nn


def build():
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    torch.manual_seed(int((libc.getenv(b"TRIAL_SEED") or b"0").decode()))
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
'''

EXTERNAL = '''
[build]
backend = "inductor"
timeout_s = 900

[profiles.ext]
weights = "external"

[models.m]
factory = "seeded:build"
dtypes = ["fp32"]
profiles = ["ext"]
inputs = [{ name = "x", shape = ["batch", 8] }]
buckets = { batch = [2] }
'''


@pytest.mark.slow
def test_new_weight_values_no_recorder_sees_are_caught_with_external_weights(tmp_path):
    """With ``weights = "external"`` the graph key is the structure, never the weight values: ``verify
    --fresh`` compares the weights file the probe stages with the artifact's, so new values fed past the
    recorder are ``DIFFERS ... weights`` (it said ``fresh``), and the same values stay fresh."""
    (tmp_path / "seeded.py").write_text(SEEDED)
    (tmp_path / "buckets.toml").write_text(EXTERNAL)
    c = ("-c", str(tmp_path / "buckets.toml"))
    r = run_cli("build", *c, unset=("TRIAL_SEED",))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run_cli("verify", "--fresh", *c, unset=("TRIAL_SEED",))
    assert r.returncode == 0 and "1 fresh, 0 differ" in r.stdout, r.stdout + r.stderr[-2000:]
    r = run_cli("verify", "--fresh", *c, "--json", env={"TRIAL_SEED": "5"})
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    (row,) = json.loads(r.stdout)["targets"]
    assert (row["verdict"], row["component"]) == ("differs", "weights"), row
    assert row["fresh_graph_key"] == row["recorded_graph_key"] and "weights.safetensors" in row["reason"], row
