"""The pulled-release record: what ``neuron-build pull`` writes into a folder's ``release.json`` and every
reader of that folder reads, typed (:class:`PulledRelease`).

This is the one module that spells the file's name (:data:`RELEASE_FILE`, :func:`release_file`): the pull
writes the record with :func:`write_pulled`, and the runtime (:class:`neuron_build.runtime.BucketedModel`,
:func:`neuron_build.runtime.install_release`), NxDI serving and the text-generation loader read it with
:func:`read_pulled`, which checks every name the record turns into a path before one is opened
(:mod:`neuron_build.trust`). A layer of its own over core (pure, torch-free), so the release, the compilers and
the routing rules may import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.loaders import LOADERS, TORCH_DTYPES

#: The record's file name in a pulled folder.
RELEASE_FILE = "release.json"
#: The record's ``format``.
PULL_FORMAT = 1


def release_file(root: str | Path) -> Path:
    """The record of the pulled folder ``root`` (``root / release.json``)."""
    return Path(root) / RELEASE_FILE


@dataclass(frozen=True)
class PulledBucket:
    """One bucket of a pulled release, as its ``release.json`` lists it (:meth:`to_json`).

    Attributes:
        id: the bucket's id, also its folder in the pulled folder (``b8-s64``).
        target, key: the build target it was compiled as and its key.
        sizes: bucket dim -> size; inputs: the concrete input specs (``name``, ``shape`` ints, ``dtype``).
        artifact: the model file, relative to the pulled folder; loader: the function that loads it.
        files: every pulled file of the bucket, relative to the folder -> ``{"sha256", "size"}`` (bytes).
    """

    id: str
    target: str
    key: str
    sizes: dict[str, int]
    inputs: list[dict[str, Any]]
    artifact: str
    loader: str
    files: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """The bucket's object in ``release.json`` (the fields in the order above)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> PulledBucket:
        """The bucket of ``release.json`` object ``doc`` (``where``: the file and the bucket's place, for
        messages): every field there and of its type, each size an int and each file entry an object with a
        ``sha256`` string and a ``size`` int.

        Raises:
            UserError: one line naming ``where``, the field and the fix (pull the release again).
        """
        if not isinstance(doc, dict):
            raise UserError(f"{where}: a bucket is {type(doc).__name__}, not an object; pull the release again")
        vals = _typed(doc, _BUCKET_TYPES, {}, where)
        bad = [d for d, n in vals["sizes"].items() if not isinstance(n, int) or isinstance(n, bool)]
        bad += [n for n, e in vals["files"].items()
                if not (isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("size"), int))]
        bad += [str(i) for i in vals["inputs"] if not isinstance(i, dict)]
        if bad:
            raise UserError(f"{where}: bucket {vals['id']!r}: {bad[0]!r} is not a size, file entry (sha256, size) "
                            f"or input spec; pull the release again")
        if vals["loader"] not in LOADERS:
            raise UserError(f"{where}: bucket {vals['id']!r}: 'loader' {vals['loader']!r} is not a loader this "
                            f"neuron-build knows ({', '.join(sorted(LOADERS))}); pull the release again")
        _check_dtypes(vals["inputs"], f"{where} inputs")
        return cls(**vals)


@dataclass(frozen=True)
class PulledRelease:
    """What a pull wrote into its folder: the content of its ``release.json`` (:meth:`to_json`), which
    :class:`neuron_build.runtime.BucketedModel` loads and ``pull --json`` prints.

    Attributes:
        release, model: the release id and its model.
        channel, channel_version: the channel it was pulled from and its version then (None: a release
            pulled by id, as the warm-up gate does).
        dtype, profile, backend, hardware_target: the release's.
        dims, inputs, truncate, convert_dtypes: the release's runtime record (bucket dims, input specs).
        buckets: one :class:`PulledBucket` per bucket.
        toolchain: the versions it was built with.
        pulled, pulled_by: when (ISO 8601 UTC) and by whom.
        textgen, serving: the runtime's text-generation and serving records, when the release has them.
    """

    release: str
    model: str
    channel: str | None
    channel_version: int | None
    dtype: str
    profile: str
    backend: str
    hardware_target: str
    dims: list[str]
    inputs: list[dict[str, Any]]
    truncate: bool
    convert_dtypes: bool
    buckets: tuple[PulledBucket, ...]
    toolchain: dict[str, Any]
    pulled: str
    pulled_by: str
    textgen: dict[str, Any] | None = None
    serving: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """``release.json``: ``format`` (:data:`PULL_FORMAT`) first, then the fields in the order above;
        ``textgen`` and ``serving`` only when set."""
        doc: dict[str, Any] = {"format": PULL_FORMAT}
        doc.update((k, getattr(self, k)) for k in self.__dataclass_fields__ if k not in ("textgen", "serving"))
        doc["buckets"] = [b.to_json() for b in self.buckets]
        for k in ("textgen", "serving"):
            if getattr(self, k) is not None:
                doc[k] = getattr(self, k)
        return doc

    @classmethod
    def from_json(cls, doc: Any, where: str) -> PulledRelease:
        """The record of ``release.json`` content ``doc`` (``where``: the file, for messages). ``release``,
        ``model``, ``backend``, ``dims``, ``inputs`` and ``buckets`` must be there; what else a pull writes
        (provenance, channel) may be missing (None, empty); every field present must have its type, and every
        bucket its fields (:meth:`PulledBucket.from_json`).

        Raises:
            UserError: one line naming ``where``, the field and the fix (pull the release again).
        """
        if not isinstance(doc, dict):
            raise UserError(f"{where}: not a pulled release (not a JSON object); pull the release again")
        if doc.get("format", PULL_FORMAT) != PULL_FORMAT:
            raise UserError(f"{where}: format {doc.get('format')!r}, this neuron-build reads format {PULL_FORMAT}; "
                            f"pull the release again with this neuron-build")
        vals = _typed(doc, _FIELD_TYPES, _MISSING_AS, where)
        if not vals["buckets"]:
            raise UserError(f"{where}: 'buckets' is empty: a release has at least one bucket; pull the release again")
        _check_dtypes(vals["inputs"], f"{where} inputs")
        vals["buckets"] = tuple(PulledBucket.from_json(b, f"{where} buckets[{i}]")
                                for i, b in enumerate(vals["buckets"]))
        return cls(**vals)


def _check_dtypes(specs: list[Any], where: str) -> None:
    """Every input spec of ``specs`` that is an object names its ``dtype`` by one of
    :data:`neuron_build.loaders.TORCH_DTYPES` (``where``: the file and the list, for messages).

    Raises:
        UserError: one line naming ``where``, the input, its dtype and the fix (pull the release again).
    """
    for i, spec in enumerate(specs):
        if isinstance(spec, dict) and spec.get("dtype") not in TORCH_DTYPES:
            raise UserError(f"{where}[{i}]: 'dtype' {spec.get('dtype')!r} of input {spec.get('name')!r} is not a "
                            f"dtype ({', '.join(TORCH_DTYPES)}); pull the release again")


def _typed(doc: dict[str, Any], types: dict[str, tuple[tuple[type, ...], bool]], missing_as: dict[str, Any],
           where: str) -> dict[str, Any]:
    """The fields ``types`` names of JSON object ``doc``, each checked against its types (a bool is no int);
    a missing or null field is refused when required, else read as ``missing_as`` gives (absent there: None).

    Raises:
        UserError: one line naming ``where``, the field and the fix (pull the release again).
    """
    vals = {}
    for name, (kinds, required) in types.items():
        if name not in doc or doc[name] is None:
            if required:
                raise UserError(f"{where}: no {name!r}; not a pulled release: pull the release again")
            vals[name] = missing_as.get(name)
            continue
        v = doc[name]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise UserError(f"{where}: {name!r} is {type(v).__name__}, not {kinds[0].__name__}; "
                            f"pull the release again")
        vals[name] = v
    return vals


#: field -> (the JSON types it may have, whether a record without it is refused)
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "release": ((str,), True), "model": ((str,), True), "channel": ((str,), False),
    "channel_version": ((int,), False), "dtype": ((str,), False), "profile": ((str,), False),
    "backend": ((str,), True), "hardware_target": ((str,), False), "dims": ((list,), True),
    "inputs": ((list,), True), "truncate": ((bool,), False), "convert_dtypes": ((bool,), False),
    "buckets": ((list,), True), "toolchain": ((dict,), False), "pulled": ((str,), False),
    "pulled_by": ((str,), False), "textgen": ((dict,), False), "serving": ((dict,), False),
}
#: what a missing optional field reads as (absent here: None)
_MISSING_AS: dict[str, Any] = {"dtype": "", "profile": "", "hardware_target": "", "truncate": False,
                               "convert_dtypes": False, "toolchain": {}, "pulled": "", "pulled_by": ""}
#: bucket field -> (the JSON types it may have, whether a bucket without it is refused)
_BUCKET_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((str,), True), "target": ((str,), True), "key": ((str,), True), "sizes": ((dict,), True),
    "inputs": ((list,), True), "artifact": ((str,), True), "loader": ((str,), True), "files": ((dict,), True),
}


def read_release(root: Path, fix: str) -> dict[str, Any]:
    """The content of ``root``'s ``release.json`` (not yet checked: :func:`check_pulled`).

    Raises:
        UserError: unreadable or not JSON: one line naming the file, then ``fix``.
    """
    try:
        return json.loads(release_file(root).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{release_file(root)}: cannot read it ({e}); {fix}") from None


def check_pulled(release: Any, root: Path) -> None:
    """Check the names a pulled ``release.json`` (in folder ``root``) turns into paths before any is opened:
    bucket ids, file names and model files are relative paths inside ``root`` (:mod:`neuron_build.trust`),
    and no file listed is reached through a symlink that leaves ``root``.

    Raises:
        UntrustedRecord: one line naming ``release.json`` and the offending name.
        UserError: ``release.json`` is not a pulled release (no ``buckets`` list).
    """
    from neuron_build.trust import UntrustedRecord, check_release, refusal

    where = str(release_file(root))
    if not isinstance(release, dict) or not isinstance(release.get("buckets"), list):
        raise UserError(f"{where}: not a pulled release (no buckets list); pull a release into {root} with "
                        f"`neuron-build pull MODEL --channel C --dest {root}`")
    what = f"release {release.get('release')!r} of {release.get('model')!r}"
    check_release(release, what, where)
    top = root.resolve()
    for b in release["buckets"]:
        for name in [*b.get("files", {}), b.get("artifact") or ""]:
            p = (root / name).resolve() if name else top
            if p != top and top not in p.parents:
                raise UntrustedRecord(refusal(what, where, f"file {name!r} resolves to {p}, outside {top}"))


def read_pulled(root: str | Path, fix: str) -> PulledRelease:
    """The record of the pulled folder ``root``, read and checked: readable JSON (else one line naming the file,
    then ``fix``), every name it turns into a path inside ``root`` (:func:`check_pulled`), every field of its
    type (:meth:`PulledRelease.from_json`). The files it lists are not opened here
    (:func:`neuron_build.runtime.verify_pulled`).

    Raises:
        UserError, UntrustedRecord: one line naming the file and the fix.
    """
    root = Path(root)
    doc = read_release(root, fix)
    check_pulled(doc, root)
    return PulledRelease.from_json(doc, str(release_file(root)))


def write_pulled(folder: Path, record: PulledRelease) -> str:
    """Write ``record`` as ``folder``'s ``release.json`` (indented, one trailing newline); return its name in
    the folder (for the pull's list of files written)."""
    release_file(folder).write_text(json.dumps(record.to_json(), indent=2) + "\n")
    return RELEASE_FILE


__all__ = ["PULL_FORMAT", "RELEASE_FILE", "PulledBucket", "PulledRelease", "check_pulled", "read_pulled", "read_release",
           "release_file", "write_pulled"]
