"""SIGKILL of the build at every store write and at random moments, and a real full file system: every
object stays complete or absent, nothing already stored is lost, and the next build finishes."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_build.store.local import LocalStore
from neuron_build.store.verify import verify_store
from tests.helpers.faultkit import (
    HERE,
    cli_env,
    fill,
    free_bytes,
    object_digests,
    plan_states,
    quick_ids,
    run_cli,
    start_build,
    tmpfs,
    verify,
    wait_for,
    workers_alive,
    write_quick_project,
)

STAGES = ("preparing the compile", "while compiling", "writing the artifact", "writing the manifest", "publishing")


def crash_at(cfg: Path, target: str, k: int, replay: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "crashpoint.py"), str(cfg), target, str(k), str(replay)],
                          env=cli_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_sigkill_at_each_store_write_leaves_objects_complete_or_absent(tmp_path):
    """Fault: the builder process SIGKILLs itself at a chosen file-system write after its compile worker
    exited (the worker's outputs are those of one real compile, replayed so each point costs no compile): writing the compile log into the object, the manifest's temporary file and its rename,
    each blob's temporary link and rename into cas/, the logs, the manifest's create-only link into ac/
    (the commit point), the view, clearing the failure record, writing the
    target record, the host-memory ledger, removing the staging folder and the lock's owner record (one
    point per distinct step, each in a fresh copy of the store). After each: verify --deep is clean, the
    target's object is complete or absent, the object built before is byte-identical, and the next build
    finishes with the target PASS."""
    template = tmp_path / "template"
    cfg0 = write_quick_project(template, n=2, build_extra="max_host_memory_gb = 100")
    t_old, t_new = quick_ids(2)[1], quick_ids(2)[0]
    r = run_cli("build", "-c", str(cfg0), t_old)
    assert r.returncode == 0, r.stdout + r.stderr
    probe, replay = tmp_path / "probe", tmp_path / "replay"
    shutil.copytree(template, probe)
    replay.mkdir()
    r = crash_at(probe / "buckets.toml", t_new, 0, replay)  # a real compile; its worker outputs are kept
    assert r.returncode == 0, r.stderr
    # the writes of a replay (no worker, so no graph-key lock taken while it ran), counted without a kill
    probe2 = tmp_path / "probe2"
    shutil.copytree(template, probe2)
    r = crash_at(probe2 / "buckets.toml", t_new, 10**9, replay)
    assert r.returncode == 0, r.stderr
    writes = json.loads(r.stdout.splitlines()[-1])["writes"]
    # the publish: blobs renamed into cas/, then the manifest linked into ac/ create-only (the commit point)
    commit = [i for i, w in enumerate(writes) if re.match(r"os\.link \.[0-9a-f]{64}\.json\.", w)]
    blobs = [i for i, w in enumerate(writes) if re.match(r"os\.rename \.[0-9a-f]{64}\.\d+\.[0-9a-f]+\.tmp$", w)]
    assert commit and blobs and max(blobs) < commit[0], writes
    # one crash point per distinct step: the first of each run of folder creations, and of the removals
    # inside the staging folder's rmtree only the rmtree itself
    points, in_rmtree = [], False
    for i, w in enumerate(writes):
        if w.startswith("shutil.rmtree"):
            in_rmtree = True
            points.append(i + 1)
            continue
        if in_rmtree and w.startswith(("os.remove", "os.rmdir")):
            continue
        in_rmtree = False
        if not (w.startswith("os.mkdir") and i > 0 and writes[i - 1].startswith("os.mkdir")):
            points.append(i + 1)
    assert len(points) >= 12
    outcomes = []
    for k in points:
        root = tmp_path / f"k{k}"
        shutil.copytree(template, root)
        cfg = root / "buckets.toml"
        store = LocalStore(root / "artifacts")
        before = object_digests(store.root)
        r = crash_at(cfg, t_new, k, replay)
        assert r.returncode == -signal.SIGKILL, (k, writes[k - 1], r.stdout, r.stderr)
        rep = verify_store(store, deep=True)
        assert rep.clean, (k, writes[k - 1], rep.to_json())
        after = object_digests(store.root)
        assert {key: after[key] for key in before} == before  # nothing already stored was lost or changed
        published = len(after) == 2
        outcomes.append((writes[k - 1], "published" if published else "absent"))
        r = run_cli("build", "-c", str(cfg))
        assert r.returncode == 0, (k, writes[k - 1], r.stdout, r.stderr)
        assert plan_states(cfg) == {t_new: "cached", t_old: "cached"}
        assert verify_store(store, deep=True).clean
        assert not any((store.root / "staging").iterdir())
    # the crash points really straddle the publish: some left the object absent, later ones complete
    assert {o for _, o in outcomes} == {"absent", "published"}
    print("\n".join(f"{w:50} -> {o}" for w, o in outcomes))


@pytest.mark.slow
def test_sigkill_at_random_moments_then_the_next_build_finishes(tmp_path):
    """Fault: `neuron-build build -n 2` of a 4-target matrix is SIGKILLed at seeded random moments (one
    per round; each round changes the model source, so every target needs a new compile). After each
    kill: no compile worker survives, verify --deep is clean, every object of earlier rounds is intact,
    and the next build finishes with every target PASS."""
    rng = random.Random(20261129)
    cfg = write_quick_project(tmp_path / "p", n=4)
    store = cfg.parent / "artifacts"
    src = cfg.parent / "quicklib" / "quick.py"
    ids = quick_ids(4)
    kept: dict = {}
    report = []
    for rnd in range(4):
        src.write_text(src.read_text() + f"\n# round {rnd}\n")
        p = start_build(cfg, tmp_path / f"r{rnd}.out", "-n", "2")
        delay = rng.uniform(0.3, 5.0)
        time.sleep(delay)
        finished = p.poll() is not None
        if not finished:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        wait_for(lambda: not workers_alive(str(store)), timeout=30, what="orphaned workers to die")
        built_at_kill = sum(s == "cached" for s in plan_states(cfg).values())
        rc, rep = verify(cfg)
        assert rc == 0 and rep["bad"] == [], (rnd, delay, rep)
        now = object_digests(store)
        assert {k: now.get(k) for k in kept} == kept
        r = run_cli("build", "-n", "2", "-c", str(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        assert plan_states(cfg) == {t: "cached" for t in ids}
        assert verify(cfg)[0] == 0
        kept = object_digests(store)
        report.append(f"round {rnd}: killed after {delay:.2f} s ({'already finished' if finished else 'running'}), "
                      f"{built_at_kill}/4 built at the kill")
    assert len(kept) == 16  # 4 rounds x 4 targets, nothing lost
    print("\n".join(report))


@pytest.mark.slow
def test_disk_full_fails_the_target_cleanly_and_loses_nothing(tmp_path):
    """Fault: the store lives on a real 40 MiB tmpfs that is filled with a ballast file so that exactly
    N bytes stay free, for N from 0 up in 4 KiB steps past the artifact's size, so the disk fills up at
    each stage in turn: preparing the compile, while the worker saves the model, writing the compile log
    into the object, writing the manifest. Each time the target must fail with status ERROR and a reason
    saying "no space left on device" and where, leave no staging files, and lose nothing stored (the
    object built before stays byte-identical, verify --deep clean); with room again it builds."""
    with tmpfs(tmp_path / "fs", "40m") as fs:
        cfg = write_quick_project(tmp_path / "p", n=2, store=str(fs / "artifacts"), kwargs="{ width = 8, extra_mb = 2 }",
                                  build_extra="max_host_memory_gb = 100")
        first, second = quick_ids(2)
        r = run_cli("build", "-c", str(cfg), first)
        assert r.returncode == 0, r.stdout + r.stderr
        store = LocalStore(fs / "artifacts")
        (man,) = [m for m in store.manifests()]
        size = man.files["model.pt"].size
        before = object_digests(store.root)
        page = 4096
        levels = [0] + [((size + page - 1) // page + k) * page for k in range(16)]
        stages = []
        for leave in levels:
            ballast = fill(fs, leave)
            assert free_bytes(fs) <= leave
            r = run_cli("build", "-c", str(cfg), second)
            ballast.unlink()
            assert not any((store.root / "staging").iterdir()), leave
            now = object_digests(store.root)
            assert {k: now.get(k) for k in before} == before, leave
            if r.returncode == 0:
                stages.append("PASS")
                break
            assert r.returncode == 1, r.stderr
            (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("  FAILED")]
            assert line.startswith(f"  FAILED {second}: ERROR: no space left on device"), line
            assert str(fs / "artifacts") in line
            stages.append(next(s for s in STAGES if s in line))
            assert verify(cfg)[0] == 0
        assert stages[0] == "preparing the compile" and stages[-1] == "PASS", stages
        assert "while compiling" in stages, stages
        assert {"writing the artifact", "writing the manifest", "publishing"} & set(stages), stages
        rc, rep = verify(cfg)
        assert rc == 0 and rep["ok"] == 2
        assert {k: v for k, v in object_digests(store.root).items() if k in before} == before
        print(stages)


def crash_cli(k: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "crashcli.py"), str(k), *args], env=cli_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_sigkill_during_release_and_promotion_leaves_channels_consistent(tmp_path):
    """Fault: `neuron-build release` and `neuron-build promote` are SIGKILLed at each of their file-system
    writes (release record, channel lock, pointer, history). After each kill, verify --deep is clean
    (every channel points at a release whose artifacts are all complete), the channel holds the old
    release or the new one, never anything else, and running the command again finishes the job."""
    template = tmp_path / "template"
    cfg0 = write_quick_project(template, n=2, build_extra="")
    cfg0.write_text(cfg0.read_text() + '\n[release]\nchannels = ["dev", "prod"]\n')
    assert run_cli("build", "-n", "2", "-c", str(cfg0)).returncode == 0
    r = run_cli("release", "quick", "-q", "-c", str(cfg0))
    assert r.returncode == 0, r.stderr
    r1 = r.stdout.strip()
    r = run_cli("promote", "quick", r1, "--to", "dev", "--allow-unvalidated", "--reason", "crash test", "-c", str(cfg0))
    assert r.returncode == 0, r.stdout + r.stderr
    src = template / "quicklib" / "quick.py"
    src.write_text(src.read_text() + "\n# v2\n")
    assert run_cli("build", "-n", "2", "-c", str(cfg0)).returncode == 0

    def pointer(root: Path) -> str | None:
        p = root / "artifacts" / "channels" / "quick" / "dev.json"
        return json.loads(p.read_text())["release"] if p.exists() else None

    # the release command, then the promotion of its release, each killed at every write
    probe = tmp_path / "probe"
    shutil.copytree(template, probe)
    r = crash_cli(0, "release", "quick", "-q", "-c", str(probe / "buckets.toml"))
    assert r.returncode == 0, r.stderr
    r2 = r.stdout.strip()
    rel_writes = json.loads(r.stderr.splitlines()[-1])["writes"]
    shutil.copytree(probe, tmp_path / "probe2")
    promote = ["promote", "quick", r2, "--to", "dev", "--allow-unvalidated", "--reason", "crash test"]
    r = crash_cli(0, *promote, "-c", str(tmp_path / "probe2" / "buckets.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    pro_writes = json.loads(r.stderr.splitlines()[-1])["writes"]
    assert pointer(tmp_path / "probe2") == r2
    assert any("dev.json" in w for w in pro_writes) and any(r2 in w for w in rel_writes), (rel_writes, pro_writes)

    seen = set()
    for cmd, n, base in (("release", len(rel_writes), template), ("promote", len(pro_writes), probe)):
        for k in range(1, n + 1):
            root = tmp_path / f"{cmd}{k}"
            shutil.copytree(base, root)
            cfg = root / "buckets.toml"
            args = ["release", "quick", "-q"] if cmd == "release" else promote
            r = crash_cli(k, *args, "-c", str(cfg))
            assert r.returncode == -signal.SIGKILL, (cmd, k, r.stdout, r.stderr)
            rc, rep = verify(cfg)
            assert rc == 0, (cmd, k, rep)
            assert pointer(root) in (r1, r2)
            seen.add((cmd, pointer(root)))
            again = run_cli(*args, "-c", str(cfg))
            if cmd == "promote" and pointer(root) == r2 and again.returncode != 0:
                assert r2 in again.stdout + again.stderr  # already promoted: refused, naming the release
            else:
                assert again.returncode == 0, (cmd, k, again.stdout, again.stderr)
            if cmd == "release":
                assert again.stdout.strip() == r2
            else:
                assert pointer(root) == r2
            assert verify(cfg)[0] == 0
    assert ("promote", r1) in seen and ("promote", r2) in seen  # kills before and after the swap
