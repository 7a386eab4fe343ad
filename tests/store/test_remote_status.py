"""``neuron-build status [--remote]`` against a bucket on the local S3 server (moto's, over HTTP), as two hosts
meet it: an offline build with pending pushes, a push, another host's new bucket, release and promotion, a
fetch, and a channel that moved on the remote since."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.cli import in_a_terminal, run_cli
from tests.helpers.projects import write_tiny_project


def FILE_MATRIX(url: str) -> str:  # a template, like MATRIX
    """:data:`MATRIX` for a ``file://`` remote: without the S3 client's options."""
    return "\n".join(ln for ln in MATRIX.format(remote=url, buckets="1, 4").splitlines()
                     if not ln.startswith("remote_options")) + "\n"


MATRIX = '''
[build]
backend = "torchscript"
timeout_s = 120
heartbeat_s = 1
remote = "{remote}"
remote_options = {{ config_kwargs = {{ retries = {{ total_max_attempts = 1 }} }} }}  # the dead endpoint fails fast

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.tiny]
factory = "tinylib.tiny:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [{buckets}] }}
'''


def checkout(root: Path, remote: str, buckets: str) -> Path:
    cfg = write_tiny_project(root)
    cfg.write_text(MATRIX.format(remote=remote, buckets=buckets))
    return cfg


def nb(cfg: Path, *args: str, env: dict | None = None, ok: tuple[int, ...] = (0,)):
    r = run_cli(*args, "-c", str(cfg), env=env)
    assert r.returncode in ok, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def status(cfg: Path, *extra: str) -> dict:
    doc = json.loads(nb(cfg, "status", "--json", *extra).stdout)
    assert doc["schema"] == "neuron-build/status/v1"
    return doc


def test_status_against_the_remote(tmp_path, s3_env, s3_bucket):
    from tests.helpers.s3 import free_port

    url = f"s3://{s3_bucket}/team"
    a = checkout(tmp_path / "host-a" / "proj", url, "1, 4")
    down = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    nb(a, "build", env=down, ok=(1,))                                  # built here, both pushes pending
    doc = status(a)
    assert doc["built_here"] == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1"] and doc["missing_here"] == []
    keys = {t["target"]: t["key"] for t in doc["targets"]}
    assert sorted((p["target"], p["key"]) for p in doc["pending_pushes"]) == sorted(keys.items())
    assert all(p["reason"] for p in doc["pending_pushes"]) and "remote" not in doc
    r = nb(a, "status", "--remote", env=down, ok=(2,))
    assert f"remote store {url} cannot be read" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: remote store {url} cannot be read (")

    doc = status(a, "--remote")
    assert doc["remote"] == url
    assert sorted((x["target"], x["key"]) for x in doc["not_pushed"]) == sorted(keys.items())
    assert doc["remote_only"] == [] and doc["channels"] == [] and doc["releases"] == {"not_pushed": [], "remote_only": []}
    text = nb(a, "status", "--remote").stdout
    assert "not pushed: 2 artifacts" in text and "neuron-build push" in text and "pending pushes (2" in text

    nb(a, "push")
    doc = status(a, "--remote")
    assert doc["not_pushed"] == [] and doc["pending_pushes"] == [] and doc["remote_only"] == []
    assert "in sync" in nb(a, "status", "--remote").stdout

    # host B adds bucket 8 (compiled there, pushed by its build), releases and promotes into dev
    b = checkout(tmp_path / "host-b" / "proj", url, "1, 4, 8")
    nb(b, "build")
    r1 = nb(b, "release", "tiny", "-q").stdout.strip()
    nb(b, "promote", "tiny", r1, "--to", "dev", "--allow-unvalidated", "--reason", "status test")
    a.write_text(MATRIX.format(remote=url, buckets="1, 4, 8"))
    doc = status(a, "--remote")
    assert doc["missing_here"] == ["tiny/b8/fp32/p1"]
    assert [x["target"] for x in doc["remote_only"]] == ["tiny/b8/fp32/p1"] and doc["not_pushed"] == []
    assert doc["releases"] == {"not_pushed": [], "remote_only": [f"tiny@{r1}"]}
    assert [(c["model"], c["channel"], c["state"], c["local"], c["remote"]["release"]) for c in doc["channels"]] == [
        ("tiny", "dev", "remote only", None, r1)]
    text = nb(a, "status", "--remote").stdout
    assert "on the remote, not here: 1 artifact (tiny/b8/fp32/p1" in text and "neuron-build fetch" in text
    assert f"channel tiny/dev remote only: here (none), remote {r1} v1" in text

    nb(a, "fetch")
    doc = status(a, "--remote")
    assert doc["remote_only"] == [] and doc["missing_here"] == [] and doc["releases"]["remote_only"] == []
    assert [c["state"] for c in doc["channels"]] == ["same"]

    # B moves dev on: A's copy of the pointer now differs from the remote's
    b.write_text(MATRIX.format(remote=url, buckets="1, 4"))
    r2 = nb(b, "release", "tiny", "-q").stdout.strip()
    nb(b, "promote", "tiny", r2, "--to", "dev", "--allow-unvalidated", "--reason", "status test")
    (dev,) = status(a, "--remote")["channels"]
    assert dev["state"] == "differs"
    assert (dev["local"]["release"], dev["local"]["version"], dev["remote"]["release"], dev["remote"]["version"]) == (
        r1, 1, r2, 2)
    assert f"channel tiny/dev differs: here {r1} v1, remote {r2} v2" in nb(a, "status", "--remote").stdout


def test_push_fetch_and_pull_print_one_line_per_file_when_piped_and_a_bar_on_a_terminal(tmp_path):
    import re
    import sys


    url = (tmp_path / "shared").as_uri()
    a = checkout(tmp_path / "a", url, "1, 4")
    a.write_text(FILE_MATRIX(url))  # botocore's config_kwargs are no option of a file:// remote
    offline = a.read_text().replace(f'remote = "{url}"\n', "")
    a.write_text(offline)
    nb(a, "build")
    a.write_text(FILE_MATRIX(url))
    r = nb(a, "push", "--json")
    rep = json.loads(r.stdout)
    line = re.compile(r"^push tiny/b[14]/fp32/p1 (\S+): ([\d,]+) bytes \((\d+)/(\d+) files, ([\d,]+) of ([\d,]+) bytes"
                      r"(, ETA \d+ s)?\)$")
    lines = [m for m in map(line.match, r.stderr.splitlines()) if m]
    assert len(lines) == rep["blobs"] > 0 and len(lines) == len([x for x in r.stderr.splitlines() if x.startswith("push ")])
    assert sum(int(m[2].replace(",", "")) for m in lines) == rep["bytes"]
    assert [int(m[3]) for m in lines] == list(range(1, len(lines) + 1))        # counted in order
    assert lines[-1][5] == lines[-1][6] and int(lines[-1][4]) == len(lines)   # the last: all bytes of all files
    assert nb(a, "push").stderr.count("push tiny/") == 0                        # nothing left to copy: no line

    b = checkout(tmp_path / "b", url, "1, 4")
    b.write_text(FILE_MATRIX(url))
    r = nb(b, "fetch", "--json")
    got = [x for x in r.stderr.splitlines() if x.startswith("fetch tiny/")]
    assert len(got) == json.loads(r.stdout)["blobs"] == rep["blobs"]
    r1 = nb(b, "release", "tiny", "-q").stdout.strip()
    nb(b, "promote", "tiny", r1, "--to", "dev", "--allow-unvalidated", "--reason", "progress test")
    r = nb(b, "pull", "tiny", "--channel", "dev", "--dest", str(tmp_path / "serve"))
    pulled = [x for x in r.stderr.splitlines() if x.startswith("pull tiny/")]
    assert len(pulled) == 1  # b1 and b4 pin one blob: fetched once, then linked (one file on disk)
    assert re.match(r"pull tiny/b1/fp32/p1 model\.pt: ([\d,]+) bytes \(1/1 files, \1 of \1 bytes", pulled[-1])

    # on a terminal: rich's bar with the bytes (no per-file lines)
    out = in_a_terminal([sys.executable, "-m", "neuron_build.cli", "pull", "tiny", "--channel", "dev", "--dest",
                         str(tmp_path / "serve"), "-c", str(b)], cwd=tmp_path)
    assert "pulled " + r1 in out and "pull tiny/b1/fp32/p1 model.pt:" not in out
    assert re.search(r"\d+(\.\d+)?/\d+(\.\d+)? kB", out), out
