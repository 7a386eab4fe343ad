"""Pull: write the release a channel holds into a folder for a serving host, every file's checksum verified.

The folder holds ``<bucket id>/<files>`` (each bucket's artifact files and manifest) and ``release.json``,
which :class:`neuron_build.runtime.BucketedModel` loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.records import actor, check_channel, get_pointer, get_release
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.manifest import MANIFEST
from neuron_build.util import read_json, swap_in_folder, utc_now

PULL_FORMAT = 1


def copy_verified(src: Path, dst: Path, sha256: str, size: int, what: str) -> None:
    """Copy ``src`` to ``dst`` (parents made) while hashing it, and check its sha256 and size (bytes).

    Raises:
        UserError: ``src`` is missing, or its content does not match (``what`` names the artifact; the
            message says to move the object aside and rebuild). ``dst`` is left written on a mismatch.
    """
    h = hashlib.sha256()
    n = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            while b := fi.read(1 << 20):
                h.update(b)
                n += len(b)
                fo.write(b)
    except FileNotFoundError:
        raise UserError(f"{what}: file {src} is missing from the store") from None
    if h.hexdigest() != sha256 or n != size:
        raise UserError(f"{what}: {src} does not match its manifest (sha256 {h.hexdigest()[:16]}..., "
                        f"{n} bytes; expected {sha256[:16]}..., {size} bytes): the stored object is corrupt; "
                        f"move {src.parent} aside and rebuild the target")


def pull(store: ArtifactStore, model: str, channel: str, dest: str | Path,
         settings: ReleaseSettings | None = None) -> dict[str, Any]:
    """Write the release a channel holds into ``dest``: ``<bucket id>/<files>`` and ``release.json``.

    Every file is copied while its sha256 and size are checked against the artifact's manifest, and the
    manifest against the files the release recorded. Everything is written into a staging folder beside
    ``dest`` and swapped in with renames only when all checks pass: a missing or corrupt object fails the
    pull and leaves ``dest`` as it was.

    Args:
        settings: when given, ``channel`` must be one of its declared channels.

    Returns:
        The content of ``release.json`` (see :mod:`neuron_build.runtime`).

    Raises:
        UserError: unknown channel, empty channel, missing release record, or a missing or corrupt object
            (the message names the file).
    """
    if settings is not None:
        check_channel(settings, channel, "--channel")
    ptr = get_pointer(store, model, channel)
    if not ptr:
        raise UserError(f"channel {model}/{channel} holds no release; promote one into it first")
    rel = get_release(store, model, ptr.release)
    return pull_release(store, rel, dest, channel=channel, channel_version=ptr.version)


def pull_release(store: ArtifactStore, rel, dest: str | Path, channel: str | None = None,
                 channel_version: int | None = None) -> dict[str, Any]:
    """Write one release (a :class:`neuron_build.release.records.Release`) into ``dest``, as :func:`pull`
    does for the release a channel holds (the warm-up gate pulls a release before it is in a channel).

    Raises:
        UserError: as :func:`pull`.
    """
    model = rel.model
    if not str(dest).strip():
        raise UserError("--dest is empty; give the folder to pull into (e.g. --dest serve/minilm)")
    dest = Path(dest).absolute()
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--dest {dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / "release.json").is_file():
        raise UserError(f"--dest {dest} is a folder with other content (no release.json from an earlier "
                        f"pull); pull into a new or empty folder, or into one an earlier pull wrote")
    blocker = next((p for p in dest.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--dest {dest}: {blocker} is a file, not a folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.pull.{os.getpid()}.{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        buckets = []
        for a in rel.artifacts:
            what = f"{a.target} (key {a.key[:12]})"
            obj = store.artifact_dir(a.key)
            mf = read_json(obj / MANIFEST)
            if not isinstance(mf, dict) or mf.get("key") != a.key:
                raise UserError(f"{what}: object {obj} is missing from the store or has no valid {MANIFEST}; "
                                f"rebuild the target")
            files = mf.get("files", {})
            for name, ent in a.files.items():
                have = files.get(name)
                if have is None or have.get("sha256") != ent["sha256"]:
                    raise UserError(f"{what}: {obj / MANIFEST} lists {name} with sha256 "
                                    f"{(have or {}).get('sha256', 'none')[:16]}..., but release {rel.id} "
                                    f"recorded {ent['sha256'][:16]}...: the object changed since the release")
            for name, ent in files.items():
                copy_verified(obj / name, staging / a.bucket_id / name, ent["sha256"], ent["size"], what)
            shutil.copyfile(obj / MANIFEST, staging / a.bucket_id / MANIFEST)
            buckets.append({
                "id": a.bucket_id, "target": a.target, "key": a.key, "sizes": a.bucket,
                "inputs": [{"name": i["name"], "shape": i["shape"], "dtype": i["dtype"]} for i in a.inputs],
                "artifact": f"{a.bucket_id}/{a.artifact}", "loader": a.loader,
                "files": {f"{a.bucket_id}/{n}": ent for n, ent in files.items()}})
        rt = rel.runtime
        doc = {"format": PULL_FORMAT, "release": rel.id, "model": model, "channel": channel,
               "channel_version": channel_version, "dtype": rel.dtype, "profile": rel.profile,
               "backend": rel.backend, "hardware_target": rel.hardware_target, "dims": rt["dims"],
               "inputs": rt["inputs"], "truncate": rt["truncate"], "convert_dtypes": rt["convert_dtypes"],
               "buckets": buckets, "toolchain": rel.toolchain, "pulled": utc_now(), "pulled_by": actor()}
        if rt.get("serving") is not None:
            doc["serving"] = rt["serving"]
        (staging / "release.json").write_text(json.dumps(doc, indent=2) + "\n")
        swap_in_folder(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return doc


__all__ = ["PULL_FORMAT", "copy_verified", "pull", "pull_release"]
