"""Restore speed from S3: our pull path against a plain s3fs ``get`` of the same files, in one run.

    PYTHONPATH=. python benchmarks/restore_s3.py [--rounds 5] [--dtype fp32] [--from-store DIR] [--out FILE]

Starts a moto S3 server (``python -m moto.server`` in its own process, on 127.0.0.1 and a free port),
publishes a release of three artifacts shaped like the shipped minilm release (one ``model.pt2`` per
bucket b8-s32/s64/s128: 92.4 MB each in fp32, 47.3 MB in bf16, the sizes of a real build) through
:class:`~neuron_build.store.remote.RemoteStore`, points a channel at it, then times, interleaved round by
round (the order alternating):

- ``pull``: :func:`neuron_build.release.pull.pull` with the store (every blob through ``get_blob``,
  digest-verified, the release folder fsynced and swapped in), what a deploy host runs;
- ``get_blob``: only the ``get_blob`` of every file of the release (digest-verified), no fsync;
- ``s3fs_get``: one plain ``s3fs.S3FileSystem().get([...], [...])`` of the same objects (no verification).

Prints JSON: bytes, per-mode seconds of every round, median throughput (MB/s, 10^6 bytes) and the ratio
of each of ours to s3fs's (goal: >= 0.8). The files are random bytes of the real sizes unless
``--from-store`` names a built local store (old ``objects/`` or new ``cas/`` layout) to take the real
minilm files from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

#: sizes in bytes of model.pt2 of the shipped minilm targets b8-s32, b8-s64, b8-s128 (a real build)
MINILM_SIZES = {"fp32": [92363695, 92366895, 92370799], "bf16": [47259247, 47270639, 47261999]}
BUCKETS = ["b8-s32", "b8-s64", "b8-s128"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_files(store: Path, dtype: str) -> list[Path] | None:
    found = {}
    for m in store.rglob("manifest.json"):
        try:
            raw = json.loads(m.read_text())
        except ValueError:
            continue
        t = raw.get("target", "")
        if t.startswith("minilm/") and f"/{dtype}/" in t and "model.pt2" in raw.get("files", {}):
            b = t.split("/")[1]
            sha = raw["files"]["model.pt2"]["sha256"]
            for cand in (m.parent / "model.pt2", store / "cas" / sha[:2] / sha):
                if cand.is_file():
                    found[b] = cand
    return [found[b] for b in BUCKETS] if all(b in found for b in BUCKETS) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", choices=sorted(MINILM_SIZES), default="fp32")
    ap.add_argument("--from-store", help="a built local store to take the real minilm files from")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="restore-s3-"))
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                          XDG_CACHE_HOME=str(work / "xdg"))
        import boto3
        import s3fs

        from neuron_build.release.pull import pull
        from neuron_build.release.records import Release, release_id
        from neuron_build.store.manifest import Manifest, Metrics
        from neuron_build.store.remote import RemoteStore
        from neuron_build.util import file_sha256

        boto3.client("s3").create_bucket(Bucket="restore-bench")
        url = "s3://restore-bench/store"
        store = RemoteStore(url, cache_dir=work / "builder-cache")

        real = _real_files(Path(args.from_store), args.dtype) if args.from_store else None
        source = f"real minilm files from {args.from_store}" if real else "random bytes of the minilm sizes"
        arts, total = [], 0
        for i, b in enumerate(BUCKETS):
            folder = store.new_staging(f"{i:02x}" * 32) / "object"
            folder.mkdir()
            if real:
                shutil.copyfile(real[i], folder / "model.pt2")
            else:
                with open(folder / "model.pt2", "wb") as f:
                    f.write(os.urandom(MINILM_SIZES[args.dtype][i]))
            size = (folder / "model.pt2").stat().st_size
            total += size
            sha = file_sha256(folder / "model.pt2")
            key = f"{i + 1:02x}" * 32
            store.seal(folder, Manifest(
                key=key, target=f"minilm/{b}/{args.dtype}/o2", model="minilm", bucket={"batch": 8, "seq": 32 << i},
                dtype=args.dtype, profile="o2", backend="inductor", hardware_target="cpu", key_details={},
                component_hashes={}, files={"model.pt2": {"sha256": sha, "size": size}},
                metrics=Metrics(status="PASS", compile_time_s=1.0, artifact_bytes=size), toolchain={},
                created="2026-12-01T00:00:00+00:00", host="bench"))
            store.publish(folder, key)
            arts.append({"target": f"minilm/{b}/{args.dtype}/o2", "key": key, "bucket": {"batch": 8, "seq": 32 << i},
                         "bucket_id": b, "inputs": [], "files": {"model.pt2": {"sha256": sha, "size": size}},
                         "artifact": "model.pt2", "loader": "pt2"})
        rel = Release(id="", format=1, model="minilm", dtype=args.dtype, profile="o2", backend="inductor",
                      hardware_target="cpu", artifacts=(), toolchain={},
                      runtime={"dims": {}, "inputs": [], "truncate": False, "convert_dtypes": False})
        content = {**rel.content(), "artifacts": arts}
        rid = release_id(content)
        store.put_release("minilm", rid, {"id": rid, **content})
        store.swap_channel("minilm", "prod", {"model": "minilm", "channel": "prod", "release": rid, "version": 1},
                           None)
        blobs = [(a["files"]["model.pt2"]["sha256"], a["bucket_id"]) for a in arts]
        rpaths = [f"restore-bench/store/cas/{sha[:2]}/{sha}" for sha, _ in blobs]

        def ours_pull(dest: Path) -> None:
            pull(RemoteStore(url, cache_dir=work / "deploy-cache"), "minilm", "prod", dest)

        def ours_get_blob(dest: Path) -> None:
            s = RemoteStore(url, cache_dir=work / "deploy-cache")
            for sha, b in blobs:
                s.get_blob(sha, dest / b / "model.pt2")

        def plain(dest: Path) -> None:
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            fs.get(rpaths, [str(dest / b / "model.pt2") for _, b in blobs])

        modes = {"pull": ours_pull, "get_blob": ours_get_blob, "s3fs_get": plain}
        for fn in modes.values():  # warm up: clients made, server caches filled
            d = work / "warm"
            (d / "x").mkdir(parents=True, exist_ok=True)
            fn(d / "x")
            shutil.rmtree(d)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for m in order:
                dest = work / f"{m}-{r}"
                dest.mkdir()
                if m == "pull":
                    dest.rmdir()  # pull makes its folder
                t0 = time.perf_counter()
                modes[m](dest)
                times[m].append(time.perf_counter() - t0)
                got = sum(p.stat().st_size for p in dest.rglob("model.pt2"))
                assert got == total, f"{m} wrote {got} bytes, expected {total}"
                shutil.rmtree(dest)
        mbps = {m: round(total / statistics.median(t) / 1e6, 1) for m, t in times.items()}
        out = {
            "benchmark": "restore_s3", "source": source, "dtype": args.dtype, "files": len(blobs),
            "bytes": total, "rounds": args.rounds, "seconds": {m: [round(x, 3) for x in t] for m, t in times.items()},
            "throughput_MBps": mbps,
            "ratio_vs_s3fs_get": {m: round(mbps[m] / mbps["s3fs_get"], 3) for m in ("pull", "get_blob")},
            "goal": ">= 0.8",
            "host": {"name": platform.node(), "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                     "python": platform.python_version(), "s3fs": s3fs.__version__},
        }
        text = json.dumps(out, indent=2)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
