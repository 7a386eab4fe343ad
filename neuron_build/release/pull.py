"""Pull: write the release a channel holds into a folder for a serving host, every file's checksum verified.

The folder holds ``<bucket id>/<files>`` (each bucket's artifact files and manifest), ``release.json``,
which :class:`neuron_build.runtime.BucketedModel` loads, and the pull's own marker
(``.neuron-build-pull.json``: release id and the files it wrote). A pull replaces only a folder that
carries the marker, and deletes nothing it did not write.

Files of one digest pinned at several paths (the buckets of a TorchScript model traced to the same bytes)
are one file on disk: the later paths are hard links of the first (a copy where the file system has no
hard links), so a deploy host holds each blob once. The ``weights.safetensors`` every graph of a
text-generation model shares (one sha256: one model and
dtype) is written once, in the first bucket's folder that pins it; in
``release.json`` each bucket's ``files`` maps the pulled path (relative to the folder) to its size and
sha256, so the other buckets list that same path (``prefill-b2-s8/weights.safetensors``). A file's name
inside its artifact is the path after the first ``/`` (:func:`neuron_build.artifact.pulled_path`).

A large blob from S3 is downloaded in ranges through a partial file in ``.<dest>.partial/`` beside the
folder (:func:`neuron_build.store.ranged.resumable`), never inside a release folder: a pull killed midway
leaves it there, and the next pull continues from the bytes it has.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.artifact import release_version_problem
from neuron_build.compilers.textgen import WEIGHTS
from neuron_build.errors import UserError
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.records import actor, check_channel, get_pointer, get_release
from neuron_build.runtime.pulled import PULL_FORMAT, PulledBucket, PulledRelease, write_pulled
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.layout import MANIFEST
from neuron_build.store.ranged import resumable
from neuron_build.store.sync import TransferProgress
from neuron_build.trust import check_name, check_release
from neuron_build.util import fsync_path, read_json, swap_in_folder, utc_now, write_json_atomic

#: The marker every pull writes into its folder: only a folder carrying it is ever replaced by a pull.
MARKER = ".neuron-build-pull.json"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False when the system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _marker(folder: Path) -> dict[str, Any] | None:
    m = read_json(folder / MARKER)
    return m if isinstance(m, dict) and isinstance(m.get("files"), list) else None


def _foreign(folder: Path, marker: dict[str, Any]) -> list[str]:
    """Entries under ``folder`` that the pull which wrote ``marker`` did not write."""
    ours = set(marker["files"]) | {MARKER}
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_dir() and not p.is_symlink():
            if not any(o.startswith(rel + "/") for o in ours):
                out.append(rel + "/")
        elif rel not in ours:
            out.append(rel)
    return [r for r in out if not any(r.startswith(f) for f in out if f.endswith("/") and f != r)]


def _clean_leftovers(dest: Path) -> None:
    """Remove staging folders of earlier pulls into ``dest`` whose process is gone (they carry this pull's
    name pattern; a pull killed midway leaves one)."""
    from neuron_build.store.digests import pid_alive

    for p in dest.parent.glob(f".{dest.name}.pull.*"):
        parts = p.name.rsplit(".", 2)
        if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) != os.getpid() and not pid_alive(int(parts[1])):
            shutil.rmtree(p, ignore_errors=True)


def check_dest(dest: str | Path) -> Path:
    """The absolute pull folder ``dest`` after checking a pull may write it: absent, empty, or written by
    an earlier pull (it carries :data:`MARKER`) and holding nothing else.

    Raises:
        UserError: empty ``--dest``, a file in the way, a folder with content no pull wrote (named).
    """
    if not str(dest).strip():
        raise UserError("--dest is empty; give the folder to pull into (e.g. --dest serve/minilm)")
    dest = Path(dest).absolute()
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--dest {dest} exists and is not a folder")
    blocker = next((p for p in dest.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--dest {dest}: {blocker} is a file, not a folder")
    if dest.is_dir() and any(dest.iterdir()):
        marker = _marker(dest)
        if marker is None:
            raise UserError(f"--dest {dest} is a folder with other content (no {MARKER} from an earlier pull); "
                            f"pull into a new or empty folder, or into one an earlier pull wrote")
        foreign = _foreign(dest, marker)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise UserError(f"--dest {dest} holds files the earlier pull did not write ({shown}); a pull "
                            f"replaces only its own files: move them out of the folder, then pull again")
    return dest


def pinned_fix(target: str, damage: str, channel: str | None) -> str:
    """The fix for a blob of ``target`` that a release (in ``channel``) pins, for ``damage``
    (as :func:`neuron_build.store.verify.blob_fix`), naming the channel when there is one."""
    from neuron_build.store.verify import blob_fix

    fix = blob_fix(target, damage, ["release"])
    return fix.replace("--to CHANNEL", f"--to {channel}") if channel else fix


def pull(store: ArtifactStore, model: str, channel: str, dest: str | Path,
         settings: ReleaseSettings | None = None, warn: Callable[[str], None] | None = None,
         progress: TransferProgress | None = None) -> PulledRelease:
    """Write the release a channel holds into ``dest``: ``<bucket id>/<files>`` (with the artifact's
    ``manifest.json``), ``release.json`` and the pull's marker :data:`MARKER` (release id and the files
    it wrote).

    Every file the release pins is copied from its blob with :meth:`~neuron_build.store.contract.ActionCache.get_blob`
    (its sha256 verified), so any store implementation serves a pull. Everything is written into a
    staging folder beside ``dest`` and swapped in only when all of it is there (an atomic exchange where
    the system has one): a missing or damaged blob, or a pull killed midway, leaves ``dest`` as it was. A
    folder is replaced only when an earlier pull wrote it (it carries the marker) and holds nothing else.

    Args:
        settings: when given, ``channel`` must be one of its declared channels.
        warn: called with one line for what was skipped: an artifact's manifest that is damaged in the
            store or no longer lists the files the release pins (the bucket is pulled without it).
        progress: told of the files and bytes to copy, then of each file copied
            (:class:`~neuron_build.store.sync.TransferProgress`).

    Returns:
        What was pulled: :class:`PulledRelease` (``to_json()``: the content of ``release.json``, see
        :mod:`neuron_build.runtime`).

    Raises:
        UserError: unknown channel, empty channel, missing release record, a release this host's installed
            versions cannot load (:func:`release_version_problem`: one line naming both versions), a missing
            or damaged blob (the message names the file and the fix), or a ``dest`` the pull may not write
            (see :func:`check_dest`).
    """
    if settings is not None:
        check_channel(settings, channel, "--channel")
    check_name(model, "model", f"channel {model}/{channel}", store.location)
    check_name(channel, "channel", f"channel {model}/{channel}", store.location)
    ptr = get_pointer(store, model, channel)
    if not ptr:
        raise UserError(f"channel {model}/{channel} holds no release; promote one into it first")
    check_name(ptr.release, "release", f"channel pointer {model}/{channel}", store.location)  # before any path
    rel = get_release(store, model, ptr.release)
    return pull_release(store, rel, dest, channel=channel, channel_version=ptr.version, warn=warn, progress=progress)


def pull_release(store: ArtifactStore, rel, dest: str | Path, channel: str | None = None,
                 channel_version: int | None = None, warn: Callable[[str], None] | None = None,
                 progress: TransferProgress | None = None) -> PulledRelease:
    """Write one release (a :class:`neuron_build.release.records.Release`) into ``dest``, as :func:`pull`
    does for the release a channel holds (the warm-up gate pulls a release before it is in a channel).

    Raises:
        UserError: as :func:`pull`.
    """
    model = rel.model
    check_release(rel.to_json(), f"release {rel.id!r} of {model!r}", store.location)  # names become paths
    problem = release_version_problem(rel.backend, rel.toolchain, [(a.loader, a.artifact) for a in rel.artifacts],
                                      f"release {rel.id} of {model} ({channel or 'not in a channel'})")
    if problem:
        raise UserError(problem)
    dest = check_dest(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(dest)
    staging = dest.parent / f".{dest.name}.pull.{os.getpid()}.{secrets.token_hex(4)}"
    staging.mkdir()
    copier = _Copier(store, staging, rel.runtime.get("textgen") is not None, channel, warn, progress)
    if progress is not None:
        pinned = {ent["sha256"]: int(ent.get("size") or 0)  # a blob pinned twice is fetched once (then linked)
                  for a in rel.artifacts for ent in a.files.values()}
        progress.begin(len(pinned), sum(pinned.values()))
    partial = dest.parent / f".{dest.name}.partial"  # a large blob's partial download, resumed by the next pull
    try:
        with resumable(partial) as ours:  # (None: another pull into dest uses it; this one does not resume)
            buckets = tuple(copier.bucket(a) for a in rel.artifacts)
            if ours is not None:  # every blob is here: what a killed pull left there is of no use
                shutil.rmtree(partial, ignore_errors=True)
        rt = rel.runtime
        done = PulledRelease(
            release=rel.id, model=model, channel=channel, channel_version=channel_version, dtype=rel.dtype,
            profile=rel.profile, backend=rel.backend, hardware_target=rel.hardware_target, dims=rt["dims"],
            inputs=rt["inputs"], truncate=rt["truncate"], convert_dtypes=rt["convert_dtypes"], buckets=buckets,
            toolchain=rel.toolchain, pulled=utc_now(), pulled_by=actor(),
            textgen=rt.get("textgen"),  # prefill and decode graphs: BucketedModel.generate
            serving=rt.get("serving"))  # compile-cache / torchneuron: how serving rebuilds and compiles the model
        copier.written.append(write_pulled(staging, done))
        write_json_atomic(staging / MARKER, {"format": PULL_FORMAT, "release": rel.id, "model": model,
                                             "channel": channel, "store": store.location,
                                             "pulled": done.pulled, "files": sorted(copier.written)})
        for p in sorted(staging.rglob("*")):
            if p.is_file():
                fsync_path(p)
        if dest.exists() and _exchange(staging, dest):
            shutil.rmtree(staging, ignore_errors=True)  # the previous pull, exchanged out: all ours
        else:
            swap_in_folder(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if progress is not None:
            progress.end()
    return done


def _link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` becomes a hard link of ``src`` (same digest: one copy on disk); a copy where the file system
    has no hard links."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


@dataclass
class _Copier:
    """Copies a release's buckets into the staging folder of one pull (each blob's sha256 verified) and
    keeps the list of files written (``written``, relative paths)."""

    store: ArtifactStore
    staging: Path
    textgen: bool
    channel: str | None
    warn: Callable[[str], None] | None
    progress: TransferProgress | None

    def __post_init__(self) -> None:
        self.written: list[str] = []
        self.first: dict[str, str] = {}  # sha256 -> the path it was written at

    def bucket(self, a) -> PulledBucket:
        """Write one :class:`~neuron_build.release.records.ReleaseArtifact`'s files (and its manifest) into
        ``<bucket id>/``; return its bucket of the pulled record."""
        paths = {name: self._file(a, name, ent) for name, ent in a.files.items()}
        self._manifest(a)
        return PulledBucket(id=a.bucket_id, target=a.target, key=a.key, sizes=a.bucket,
                            inputs=[{"name": i["name"], "shape": i["shape"], "dtype": i["dtype"]} for i in a.inputs],
                            artifact=f"{a.bucket_id}/{a.artifact}", loader=a.loader,
                            files={paths[n]: ent for n, ent in a.files.items()})

    def _file(self, a, name: str, ent: dict[str, Any]) -> str:
        """Copy one pinned file from its blob; return the path it has in the pulled folder."""
        what = f"{a.target} (key {a.key[:12]})"
        rel_name = f"{a.bucket_id}/{name}"
        if self.textgen and name == WEIGHTS and ent["sha256"] in self.first:  # every graph's weights: written once
            if self.progress is not None:
                self.progress.file(a.target, name, int(ent.get("size") or 0), False)
            return self.first[ent["sha256"]]
        if ent["sha256"] in self.first:  # a blob two buckets pin: one file on disk, linked at both paths
            _link_or_copy(self.staging / self.first[ent["sha256"]], self.staging / rel_name)
            self.written.append(rel_name)
            if self.progress is not None:
                self.progress.file(a.target, name, int(ent.get("size") or 0), False)
            return rel_name
        try:
            self.store.get_blob(ent["sha256"], self.staging / rel_name)
        except FileNotFoundError:
            raise UserError(f"{what}: {name} (blob {ent['sha256'][:16]}...) is missing from the store "
                            f"{self.store.location}; {pinned_fix(a.target, 'missing', self.channel)}, "
                            f"or promote another release") from None
        except ValueError:
            raise UserError(f"{what}: {name} (blob {ent['sha256'][:16]}...) in {self.store.location} does "
                            f"not match its sha256: the stored blob is damaged; "
                            f"{pinned_fix(a.target, 'hashes to', self.channel)}") from None
        self.written.append(rel_name)
        self.first[ent["sha256"]] = rel_name
        if self.progress is not None:
            self.progress.file(a.target, name, int(ent.get("size") or 0), True)
        return rel_name

    def _manifest(self, a) -> None:
        """Copy the artifact's manifest when the store holds it intact and it lists the files the release
        pins; else warn (the bucket is pulled without it)."""
        mf = self.store.raw_manifest(a.key)
        found = self.store.lookup(a.key)
        if found.hit and isinstance(mf, dict) and mf.get("files") == a.files:
            (self.staging / a.bucket_id / MANIFEST).write_text(json.dumps(mf, indent=2) + "\n")
            self.written.append(f"{a.bucket_id}/{MANIFEST}")
        elif self.warn is not None:
            why = found.damage or ("it is not in the store" if mf is None else
                                   "it lists other files than the release pins (rebuilt since)")
            self.warn(f"{a.target} (key {a.key[:12]}): manifest not copied into {a.bucket_id}/ ({why}); its files "
                      f"are the release's, sha256 verified")


__all__ = ["MARKER", "check_dest", "pull", "pull_release"]
