"""Damaged blobs and manifests, read-only stores and garbage collection on real builds: nothing damaged is
served, damage is reported with the releases and channels it breaks, deterministic rebuilds heal releases,
and gc removes exactly what nothing references and says what it could not remove."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.store import layout
from neuron_build.store.local import LocalStore
from neuron_build.workspace import Workspace
from tests.helpers.faultkit import (
    REPO,
    compile_counts,
    object_digests,
    plan_states,
    quick_ids,
    run_cli,
    verify,
    write_quick_project,
)

#: A model whose saved artifact differs at every compile (a build time is frozen into it): not byte-stable.
NOISY_MODEL = '''
import time

import torch
from torch import nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("built_at", torch.tensor([float(time.time_ns() % 1000003)]))

    def forward(self, x):
        return self.lin(x) + self.built_at


def build():
    return Noisy()
'''

NOISY_CONFIG = '''
[models.noisy]
factory = "quicklib.noisy:build"
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{ name = "x", shape = ["n", 8] }]
buckets = { n = [1] }
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A quick project with 4 targets built once; each test copies it."""
    root = tmp_path_factory.mktemp("built")
    cfg = write_quick_project(root / "p", n=4)
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


def copy_project(cfg: Path, dest: Path) -> Path:
    shutil.copytree(cfg.parent, dest)
    return dest / cfg.name


def keys_of(cfg: Path) -> dict[str, str]:
    b = Builder(Workspace(load_project(cfg)))
    return {t.id: b.ws.key(t).key for t in b.ws.targets}


def blob_file(store: LocalStore, key: str, name: str = "model.pt") -> Path:
    return store.path(layout.blob_path(store.raw_manifest(key)["files"][name]["sha256"]))


def overwrite(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)  # blobs are stored read-only
    path.write_bytes(data)


def reasons_in_quarantine(store: LocalStore) -> dict[str, str]:
    return {d.name.split(".")[0]: (d / "reason.txt").read_text().strip() for d in (store.root / "quarantine").iterdir()}


@pytest.mark.slow
def test_damage_is_reported_never_served_and_rebuilt(built, tmp_path):
    """Fault: a flipped byte inside the model.pt blob (same size), a manifest overwritten with garbage and
    one whose op count was edited (still valid JSON). Reads (show, plan, verify) serve none of it and move
    nothing; the cheap verify finds the manifests, only ``verify --deep`` the flipped byte, naming every key
    whose manifest lists the blob; ``verify --deep --repair`` quarantines each with its reason, and the next
    build compiles exactly those keys again, to the same bytes."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    before = object_digests(store.root)
    flip = blob_file(store, keys[t1])
    sharing = sorted(t for t in (t1, t2) if blob_file(store, keys[t]) == flip)  # same bytes: one blob
    data = bytearray(flip.read_bytes())
    data[len(data) // 2] ^= 0xFF
    overwrite(flip, bytes(data))
    store.path(layout.manifest_path(keys[t3])).write_text('{"key": "garb')
    mf = store.path(layout.manifest_path(keys[t4]))
    raw = json.loads(mf.read_text())
    raw["metrics"]["op_count"] += 1
    mf.write_text(json.dumps(raw, indent=2))

    # nothing damaged is served, and reads move nothing
    for t in (t3, t4):
        r = run_cli("show", t, "-c", str(cfg))
        assert r.returncode == 2 and f"{t}: the artifact of its current key {keys[t][:12]} is damaged (manifest " \
            in r.stderr and r.stderr.rstrip().endswith(f"run `neuron-build build {t}` to make it again"), (t, r.stderr)
    assert plan_states(cfg) == {t1: "cached", t2: "cached", t3: "missing", t4: "missing"}
    assert store.path(layout.manifest_path(keys[t3])).exists() and not (store.root / "quarantine").exists()

    rc, rep = verify(cfg, deep=False)
    assert rc == 1 and rep["ok"] == 2
    assert sorted((b["kind"], b["key"], b["moved_to"]) for b in rep["bad"]) == sorted(
        [("manifest", keys[t3], None), ("manifest", keys[t4], None)])
    rc, rep = verify(cfg, deep=True)
    blob = next(b for b in rep["bad"] if b["kind"] == "blob")
    assert rc == 1 and blob["key"] == flip.name and sorted(blob["keys"]) == sorted(keys[t] for t in sharing)
    assert blob["reason"].startswith("model.pt: blob ") and "hashes to" in blob["reason"]
    assert blob["pinned_by"] == [] and blob["fix"] == (
        f"`neuron-build verify --deep --repair` (moves the damaged blob to quarantine/), then "
        f"`neuron-build build {blob['target']}` compiles it again")  # a build alone calls it cached
    assert not (store.root / "quarantine").exists()

    rc, rep = verify(cfg, deep=True, repair=True)
    assert rc == 1 and {b["kind"] for b in rep["bad"]} == {"blob", "manifest"}
    reasons = reasons_in_quarantine(store)
    assert set(reasons) == {keys[t] for t in (*sharing, t3, t4)} | {flip.name}
    assert reasons[keys[t3]].startswith("manifest is not valid JSON")
    assert reasons[keys[t4]].startswith("manifest does not match its own sha256 (edited or corrupt)")
    assert "(found by verify --repair)" in reasons[flip.name]
    assert not flip.exists()

    n0 = compile_counts(cfg.parent / ".neuron-build")
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert compile_counts(cfg.parent / ".neuron-build") - n0 == {t: 1 for t in (*sharing, t3, t4)}
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 4
    # (the torchscript artifact records its source file's path, and this copy of the project moved: the
    # rebuilt blobs differ from the originals, which is why healing a release is shown in place below)
    assert set(object_digests(store.root)) == set(before)


@pytest.mark.slow
def test_a_missing_blob_is_found_by_the_build_and_rebuilt(built, tmp_path):
    """Fault: a blob deleted under a committed manifest (what a careless clean-up leaves). The build's
    lookup moves the manifest aside with its reason and compiles the key again."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1 = quick_ids(4)[0]
    gone = blob_file(store, keys[t1])
    users = [t for t, k in keys.items() if blob_file(store, k) == gone]
    gone.unlink()
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(users)} built, {4 - len(users)} cached" in r.stdout
    reasons = reasons_in_quarantine(store)
    assert set(reasons) == {keys[t] for t in users}
    assert all(why.startswith("model.pt: blob ") and why.endswith("is missing") for why in reasons.values())
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 4


# ------------------------------------------------------------------------------------------------------
# a promoted release through damage, verify and rebuild

@pytest.mark.slow
def test_a_promoted_release_survives_damage_verify_rebuild_or_is_reported(tmp_path):
    """Two models released and promoted to dev; both model.pt blobs are then truncated. ``verify`` names the
    release and the channel each damaged blob breaks, with the fix; pull refuses. The next build compiles
    both again: ``quick``'s torchscript artifact is byte-stable, so its blob is written again and its release
    is whole (verify clean for it, pull works); ``noisy``'s artifact is not, so its new build lands under a
    new digest, its release still pins the damaged blob, and verify keeps reporting it until a new release
    is cut and promoted."""
    cfg = write_quick_project(tmp_path / "p", n=1, models_extra=NOISY_CONFIG)
    (cfg.parent / "quicklib" / "noisy.py").write_text(NOISY_MODEL)
    c = ["-c", str(cfg)]
    assert run_cli("build", "-n", "2", *c).returncode == 0
    rel = {m: run_cli("release", m, "-q", *c).stdout.strip() for m in ("quick", "noisy")}
    for m, rid in rel.items():
        # noisy's graph holds its build time: a fresh capture never matches it (the fresh gate says so), waived
        waive = ["--waive", "fresh"] if m == "noisy" else []
        r = run_cli("promote", m, rid, "--to", "dev", "--allow-unvalidated", *waive, "--reason", "not validated in tests", *c)
        assert r.returncode == 0, r.stderr
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    blobs = {m: blob_file(store, keys[f"{m}/n1/fp32/p"]) for m in rel}
    for b in blobs.values():
        overwrite(b, b.read_bytes()[:100])

    rc, rep = verify(cfg, deep=False)
    assert rc == 1
    bad = {b["key"]: b for b in rep["bad"]}
    assert set(bad) == {b.name for b in blobs.values()}
    for m, b in blobs.items():
        assert bad[b.name]["pinned_by"] == [f"release {m}/{rel[m]}", f"channel {m}/dev"]
        assert bad[b.name]["kind"] == "blob" and bad[b.name]["target"] == f"{m}/n1/fp32/p"
        assert bad[b.name]["fix"] == (
            f"`neuron-build build {m}/n1/fp32/p` compiles it again; unless that compile is byte-identical "
            f"(AOTInductor's is not) it is a new artifact the release does not pin: make and promote a new release "
            f"(`neuron-build release {m} && neuron-build promote {m} RELEASE --to CHANNEL`)")
    text = run_cli("verify", *c).stdout
    assert f"pinned by release quick/{rel['quick']}, channel quick/dev" in text
    assert "fix: `neuron-build build quick/n1/fp32/p` compiles it again;" in text
    r = run_cli("pull", "quick", "--channel", "dev", "--dest", str(tmp_path / "serve"), *c)
    assert r.returncode == 2 and "does not match its sha256: the stored blob is damaged" in r.stderr

    r = run_cli("build", *c)
    assert r.returncode == 0 and "2 built" in r.stdout, r.stdout + r.stderr
    rc, rep = verify(cfg, deep=True)
    assert rc == 1 and [(b["key"], b["pinned_by"]) for b in rep["bad"]] == [
        (blobs["noisy"].name, [f"release noisy/{rel['noisy']}", "channel noisy/dev"])]
    assert rep["bad"][0]["reason"].startswith("model.pt: blob ") and "is 100 bytes" in rep["bad"][0]["reason"]
    assert rep["bad"][0]["fix"] == (  # the rebuild did not heal it: no loop on "rebuild"
        "no build writes this blob again (`neuron-build build noisy/n1/fp32/p` made another artifact since): make "
        "and promote a new release (`neuron-build release noisy && neuron-build promote noisy RELEASE --to CHANNEL`)")
    assert blob_file(store, keys["noisy/n1/fp32/p"]) != blobs["noisy"]  # the rebuild's new digest
    doc = json.loads(run_cli("pull", "quick", "--channel", "dev", "--dest", str(tmp_path / "serve"),
                             "--json", *c).stdout)
    assert doc["release"] == rel["quick"]  # the same release, healed by the deterministic rebuild
    r = run_cli("pull", "noisy", "--channel", "dev", "--dest", str(tmp_path / "serve-noisy"), *c)
    assert r.returncode == 2 and f"noisy/n1/fp32/p (key {keys['noisy/n1/fp32/p'][:12]}): model.pt" in r.stderr

    new = run_cli("release", "noisy", "-q", *c).stdout.strip()
    assert new != rel["noisy"]
    assert run_cli("promote", "noisy", new, "--to", "dev", "--allow-unvalidated", "--waive", "fresh", "--reason",
                   "not validated in tests", *c).returncode == 0
    assert run_cli("pull", "noisy", "--channel", "dev", "--dest", str(tmp_path / "serve-noisy"), *c).returncode == 0
    rc, rep = verify(cfg, deep=True)
    assert rc == 1 and [b["pinned_by"] for b in rep["bad"]] == [[f"release noisy/{rel['noisy']}"]]  # no channel


# ------------------------------------------------------------------------------------------------------
# read-only stores and gc's truthfulness: real file permissions, as an unprivileged user

@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder another user can reach (pytest's own temporary folders are private to their owner)."""
    d = Path(tempfile.mkdtemp(prefix="nb-shared-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(d)], check=False)
        shutil.rmtree(d, ignore_errors=True)


def as_user(*args: str, cfg: Path) -> subprocess.CompletedProcess:
    """``neuron-build ARGS -c CFG`` as an unprivileged user: ``nobody`` when the tests run as root (root
    ignores file permissions), else the current user."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "neuron_build.cli", *args, "-c", str(cfg)]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=300)


def give_to_user(path: Path) -> None:
    """Make ``path`` (recursively) the unprivileged user's, when that user is ``nobody``."""
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "65534:65534", str(path)], check=True)


def test_a_read_only_store_serves_plan_ls_show_verify_and_pull(built, shared_tmp):
    """The store folder is made read-only (``chmod -R a-w``) and used by an unprivileged user: plan, ls, show,
    verify and pull work with no traceback; a damaged manifest there is reported and skipped, not moved."""
    cfg = copy_project(built, shared_tmp / "p")
    cfg.write_text(cfg.read_text() + "\n[release]\nmax_artifacts_per_model = 4\n")
    store_dir = cfg.parent / "artifacts"
    keys = keys_of(cfg)
    t1, _, t3, _ = quick_ids(4)
    r = run_cli("release", "quick", "-q", "-c", str(cfg))
    rid = r.stdout.strip()
    assert run_cli("promote", "quick", rid, "--to", "dev", "--allow-unvalidated", "--reason", "not validated in tests", "-c", str(cfg)).returncode == 0
    damaged = LocalStore(store_dir).path(layout.manifest_path(keys[t3]))
    damaged.write_text('{"key": "garb')
    give_to_user(cfg.parent)
    subprocess.run(["chmod", "-R", "a-w", str(store_dir)], check=True)
    snapshot = sorted((p.relative_to(store_dir).as_posix(), p.stat().st_mtime_ns) for p in store_dir.rglob("*"))

    r = as_user("plan", "--json", cfg=cfg)
    assert r.returncode == 0, r.stderr
    assert {x["target"]: x["state"] for x in json.loads(r.stdout)["targets"]}[t3] == "missing"
    r = as_user("ls", "--json", cfg=cfg)
    assert r.returncode == 0 and len(json.loads(r.stdout)["artifacts"]) == 3, r.stderr
    r = as_user("show", t1, "--json", cfg=cfg)
    assert r.returncode == 0 and json.loads(r.stdout)["key"] == keys[t1], r.stderr
    r = as_user("show", keys[t3], cfg=cfg)
    assert r.returncode == 2 and "is incomplete or damaged (manifest is not valid JSON" in r.stderr
    r = as_user("verify", "--deep", "--json", cfg=cfg)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert [(b["key"], b["moved_to"]) for b in rep["bad"]] == [(keys[t3], None)] and rep["ok"] == 3
    r = as_user("verify", "--repair", cfg=cfg)
    assert r.returncode == 2 and "is read-only; verify --repair moves damaged objects" in r.stderr
    dest = shared_tmp / "serve"
    dest.mkdir()
    give_to_user(dest)
    r = as_user("pull", "quick", "--channel", "dev", "--dest", str(dest / "quick"), cfg=cfg)
    assert r.returncode == 0, r.stderr
    pulled = json.loads((dest / "quick" / "release.json").read_text())
    assert pulled["release"] == rid and len(pulled["buckets"]) == 4
    assert (dest / "quick" / "n3" / "model.pt").is_file()  # the blobs the release pins are intact
    assert not (dest / "quick" / "n3" / "manifest.json").exists()  # the damaged manifest is skipped
    assert "manifest not copied" in r.stderr
    for r in (as_user("plan", cfg=cfg), as_user("ls", cfg=cfg), as_user("show", t3, cfg=cfg)):
        assert "Traceback" not in r.stderr and r.returncode in (0, 2)
    assert sorted((p.relative_to(store_dir).as_posix(), p.stat().st_mtime_ns) for p in store_dir.rglob("*")) == snapshot


def _age(path: Path, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(path, (t, t), follow_symlinks=False)


def _age_tree(path: Path, days: float) -> None:
    for p in [path, *path.rglob("*")]:
        _age(p, days)


@pytest.mark.slow
def test_gc_keeps_referenced_removes_the_rest(built, tmp_path):
    """Objects whose targets moved to new keys, two of them named by a release (and a channel), a staging
    folder of a dead builder, an old quarantined object, a lock file broken aside, and files gc did not
    write. gc --dry-run lists and removes nothing; gc removes exactly what the dry run listed, reports the
    bytes, never the released keys or their blobs, and leaves the foreign files (listed)."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    old = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    rid = run_cli("release", "quick", "-q", "-c", str(cfg)).stdout.strip()
    rel = store.release("quick", rid)
    keep = {"releases": [a for a in rel["artifacts"] if a["target"] in (t1, t2)]}
    store.put_release("quick", "r-0000000000000001", {**rel, "id": "r-0000000000000001", "artifacts": keep["releases"]})
    (store.root / "releases" / "quick" / f"{rid}.json").unlink()
    store.swap_channel("quick", "prod", {"release": "r-0000000000000001", "version": 1}, None)
    # a new model source: every target gets a new key, the old four are no longer any target's
    src = cfg.parent / "quicklib" / "quick.py"
    src.write_text(src.read_text() + "\n# v2\n")
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    new = keys_of(cfg)
    assert not set(new.values()) & set(old.values())
    # leftovers of faults, and files gc did not write
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    leftover = store.root / "staging" / f"{old[t3]}.{host}.{dead.pid}.abcd1234"
    (leftover / "object").mkdir(parents=True)
    (leftover / "object" / "model.pt").write_bytes(b"\0" * 5000)
    q = store.root / "quarantine" / f"{old[t4]}.deadbeef"
    q.mkdir(parents=True)
    (q / "reason.txt").write_text("test\n")
    _age(q, 30)
    aside = store.root / "locks" / f"{old[t3]}.lock.stale-123-abc"
    aside.write_text("")
    (store.root / "NOTES.txt").write_text("the team's notes")
    (store.root / "cas" / "zz").mkdir()
    (store.root / "cas" / "zz" / "junk").write_text("junk")
    for d in ("cas", "ac", "logs", "views"):
        _age_tree(store.root / d, 30)  # every blob is old enough to be collected when unreferenced
    digests = object_digests(store.root)

    r = run_cli("gc", "--dry-run", "--keep-days", "0", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert object_digests(store.root) == digests and leftover.exists() and q.exists()
    assert {x["key"] for x in dry["removed"] if x["kind"] == "object"} == {old[t3], old[t4]}
    assert sorted(u["path"] for u in dry["unknown"]) == ["NOTES.txt", "cas/zz/junk"]
    live_blobs = {e["sha256"] for k in [old[t1], old[t2], *new.values()]
                  for e in store.raw_manifest(k)["files"].values()}
    assert not {x["path"].rsplit("/", 1)[1] for x in dry["removed"] if x["kind"] == "blob"} & live_blobs

    r = run_cli("gc", "--keep-days", "0", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert sorted(x["path"] for x in rep["removed"]) == sorted(x["path"] for x in dry["removed"])
    assert rep["failed"] == [] and rep["bytes_freed"] == dry["bytes_freed"]
    assert store.raw_manifest(old[t3]) is None and store.raw_manifest(old[t4]) is None
    assert not (store.root / "logs" / old[t3]).exists() and not store.view_dir(old[t4]).exists()
    assert store.is_complete(old[t1], deep=True) and store.is_complete(old[t2], deep=True)
    assert all(store.is_complete(k, deep=True) for k in new.values())
    assert not leftover.exists() and not q.exists() and not aside.exists()
    assert (store.root / "NOTES.txt").read_text() == "the team's notes" and (store.root / "cas/zz/junk").exists()
    kinds = sorted(x["kind"] for x in rep["removed"])
    assert kinds.count("object") == 2 and {"staging", "quarantine", "lock"} <= set(kinds)
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 6

    # young unreferenced objects are kept by the default window; an unreadable release stops gc
    r = run_cli("gc", "-c", str(cfg))
    assert r.returncode == 0 and "kept 6 referenced and 0 unreferenced artifacts younger than 7 days" in r.stdout
    assert "left 2 files it did not write" in r.stdout
    (store.root / "releases" / "quick" / "r2.json").write_text("{not json")
    r = run_cli("gc", "--keep-days", "0", "-c", str(cfg))
    assert r.returncode == 2 and "r2.json: release file is unreadable" in r.stderr
    assert store.is_complete(old[t1]) and store.is_complete(old[t2])


def test_targets_that_left_the_matrix_keep_nothing_alive(built, tmp_path):
    """The matrix shrinks from 4 buckets to 2: the records of the 2 targets that left stay, but no longer keep
    their artifacts: gc collects those (and only those), with their logs and views."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    for k in (t3, t4):
        store.artifact_dir(keys[k])  # a view to collect too
    cfg.write_text(cfg.read_text().replace("n = [1, 2, 3, 4]", "n = [1, 2]"))
    r = run_cli("gc", "--keep-days", "0", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert sorted((x["key"], x["target"]) for x in rep["removed"] if x["kind"] == "object") == sorted(
        [(keys[t3], t3), (keys[t4], t4)])
    assert store.keys() == sorted([keys[t1], keys[t2]])
    assert store.is_complete(keys[t1], deep=True) and store.is_complete(keys[t2], deep=True)
    assert not store.view_dir(keys[t3]).exists() and not (store.root / "logs" / keys[t4]).exists()
    assert store.target(t3) is not None  # the record stays (explain compares new targets with it)


def test_gc_says_what_it_could_not_remove_and_fails(built, shared_tmp):
    """An unreferenced artifact whose action-cache folder the (unprivileged) user running gc may not write:
    gc removes everything else, lists that manifest under "could not remove" with the OS's reason, and exits 1."""
    cfg = copy_project(built, shared_tmp / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    cfg.write_text(cfg.read_text().replace("n = [1, 2, 3, 4]", "n = [1]"))
    locked = store.path(layout.manifest_path(keys[t3])).parent
    others = {store.path(layout.manifest_path(keys[t])).parent for t in (t1, t2, t4)}
    assert locked not in others, "the test needs t3's manifest alone in its prefix folder"
    give_to_user(cfg.parent)
    os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    if os.geteuid() == 0:
        os.chown(locked, 0, 0)  # root's, read-only for everyone else
    r = as_user("gc", "--keep-days", "0", cfg=cfg)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"COULD NOT REMOVE object {layout.manifest_path(keys[t3])}: Permission denied (left in place)" in r.stdout
    assert "could not remove 1 (listed above)" in r.stdout and "Traceback" not in r.stderr
    assert store.raw_manifest(keys[t3]) is not None and store.is_complete(keys[t3])  # its blobs kept too
    assert store.raw_manifest(keys[t2]) is None and store.raw_manifest(keys[t4]) is None
    assert store.is_complete(keys[t1], deep=True)
