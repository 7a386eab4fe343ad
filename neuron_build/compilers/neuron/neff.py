"""Read and validate the header of a NEFF (Neuron Executable File Format) file.

Layout [doc]: a 1024-byte little-endian header followed by a tar archive (gzip-compressed in the
common package version).  Header fields, in order, as ``struct`` format
``<QQQQQ128sI32s16s256sI64sQI468s`` (exactly 1024 bytes):

    pkg_version u64, header_size u64, data_size u64, neff_version_major u64, neff_version_minor u64,
    neff_build_version 128 bytes (NUL-padded text), num_tpb u32, hash 32 bytes, uuid 16 bytes,
    name 256 bytes (NUL-padded text), requested_tpb_count u32, tpb_per_node 64 bytes,
    feature_bits u64, lnc_size u32, padding 468 bytes.

There is no magic number.  A file is accepted as a NEFF when [doc]: it holds at least 1024 bytes,
``header_size == 1024``, ``data_size == file size - 1024`` and the major version is sane (1..16; real
NEFFs carry 2 [doc]).  Decoding choices that are ours [guess]: text fields are cut at the first NUL
and decoded as UTF-8 with replacement; ``hash`` is shown as hex; ``uuid`` as a canonical UUID string;
``tpb_per_node`` is read as 16 little-endian u32 values with trailing zeros dropped (the raw bytes are
also kept as hex).  Verify these on a Neuron host before relying on them.

Reading touches only the header plus a few hundred bytes of payload (to sniff its kind); the size
comes from ``os.stat``, so multi-hundred-MB NEFFs cost nothing.  The product never writes NEFFs.
"""

from __future__ import annotations

import os
import struct
import uuid as uuid_mod
from dataclasses import dataclass
from typing import Any, Union

from neuron_build.errors import NeuronBuildError

__all__ = ["HEADER_FORMAT", "HEADER_SIZE", "NeffError", "NeffHeader", "payload_kind", "read_neff_header"]

HEADER_FORMAT = "<QQQQQ128sI32s16s256sI64sQI468s"
HEADER_SIZE = 1024
assert struct.calcsize(HEADER_FORMAT) == HEADER_SIZE

#: Accepted major versions (real NEFFs carry 2).
MAJOR_VERSIONS = range(1, 17)
#: Bytes of payload read after the header to sniff its kind (a tar header block is 512 bytes).
_SNIFF = 512

PathOrBytes = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]


class NeffError(ValueError, NeuronBuildError):
    """The file is not a (valid) NEFF. The message names the file and the check that failed."""


@dataclass(frozen=True)
class NeffHeader:
    """The decoded 1024-byte NEFF header.

    Integers are as stored; ``build_version`` and ``name`` are NUL-stripped text; ``hash`` is hex;
    ``uuid`` is a canonical UUID string; ``tpb_per_node`` is a tuple of ints (16 u32 values with
    trailing zeros dropped, a [guess]) and ``tpb_per_node_hex`` the raw 64 bytes as hex.
    ``file_size`` is the total size in bytes of what was read, ``payload_kind`` is "tar.gz", "tar" or
    "unknown".
    """

    pkg_version: int
    header_size: int
    data_size: int
    neff_version_major: int
    neff_version_minor: int
    build_version: str
    num_tpb: int
    hash: str
    uuid: str
    name: str
    requested_tpb_count: int
    tpb_per_node: tuple[int, ...]
    tpb_per_node_hex: str
    feature_bits: int
    lnc_size: int
    file_size: int
    payload_kind: str

    @property
    def version(self) -> str:
        """``"<major>.<minor>"``, e.g. ``"2.0"``."""
        return f"{self.neff_version_major}.{self.neff_version_minor}"

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict of every field plus ``neff_version`` (for the manifest)."""
        return {
            "pkg_version": self.pkg_version,
            "header_size": self.header_size,
            "data_size": self.data_size,
            "neff_version": self.version,
            "neff_version_major": self.neff_version_major,
            "neff_version_minor": self.neff_version_minor,
            "build_version": self.build_version,
            "num_tpb": self.num_tpb,
            "hash": self.hash,
            "uuid": self.uuid,
            "name": self.name,
            "requested_tpb_count": self.requested_tpb_count,
            "tpb_per_node": list(self.tpb_per_node),
            "tpb_per_node_hex": self.tpb_per_node_hex,
            "feature_bits": self.feature_bits,
            "lnc_size": self.lnc_size,
            "file_size": self.file_size,
            "payload_kind": self.payload_kind,
        }


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _sniff_payload(payload: bytes) -> str:
    if payload[:2] == b"\x1f\x8b":
        return "tar.gz"
    if payload[257:262] == b"ustar":
        return "tar"
    return "unknown"


def _looks_like(head: bytes) -> str:
    """A hint for the error message when a well-known file type was given instead of a NEFF."""
    signatures = [
        (b"PK\x03\x04", "a zip archive (a TorchScript .pt file is one)"),
        (b"\x89PNG\r\n\x1a\n", "a PNG image"),
        (b"\x1f\x8b", "a gzip file"),
        (b"\x7fELF", "an ELF binary"),
        (b"%PDF", "a PDF document"),
    ]
    for magic, what in signatures:
        if head.startswith(magic):
            return f" (the file looks like {what})"
    if head[257:262] == b"ustar":
        return " (the file looks like a tar archive)"
    sample = head[:512]
    if sample and all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        return " (the file looks like text)"
    return ""


def _read_head(source: PathOrBytes, what: str) -> tuple[bytes, int, str]:
    """Return (first HEADER_SIZE + _SNIFF bytes, total size, display name)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source).cast("B")
        return bytes(view[: HEADER_SIZE + _SNIFF]), view.nbytes, what
    path = os.fspath(source)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(HEADER_SIZE + _SNIFF)
    return data, size, path


def read_neff_header(source: PathOrBytes, *, check_size: bool = True, name: str | None = None) -> NeffHeader:
    """Read and validate the NEFF header of a file (path) or of the bytes of a whole NEFF.

    Only the header and the first 512 payload bytes are read; the size comes from ``os.fstat``.
    ``check_size=False`` skips the ``data_size`` check (for bytes holding only the header).
    ``name`` is used in error messages for bytes input (default ``"<bytes>"``).

    Raises ``NeffError`` (a ``ValueError``) naming the file and the failed check when the content is
    not a NEFF; ``OSError`` (``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``) when the
    file cannot be read. Never raises anything else for any content.
    """
    head, size, label = _read_head(source, name or "<bytes>")
    prefix = f"{label} is not a NEFF"
    if size < HEADER_SIZE:
        raise NeffError(
            f"{prefix}: the file is {size} bytes, shorter than the {HEADER_SIZE}-byte NEFF header"
            f"{_looks_like(head)}"
        )
    fields = struct.unpack(HEADER_FORMAT, head[:HEADER_SIZE])
    (pkg_version, header_size, data_size, major, minor, build_raw, num_tpb, hash_raw, uuid_raw,
     name_raw, requested_tpb_count, tpb_raw, feature_bits, lnc_size, _padding) = fields
    if header_size != HEADER_SIZE:
        raise NeffError(f"{prefix}: header_size is {header_size}, expected {HEADER_SIZE}{_looks_like(head)}")
    if check_size and data_size != size - HEADER_SIZE:
        hint = " (truncated?)" if data_size > size - HEADER_SIZE else ""
        raise NeffError(
            f"{prefix}: data_size is {data_size} but {size - HEADER_SIZE} bytes follow the header{hint}"
        )
    if major not in MAJOR_VERSIONS:
        raise NeffError(
            f"{prefix}: neff_version_major is {major}, expected {MAJOR_VERSIONS.start}.."
            f"{MAJOR_VERSIONS.stop - 1} (real NEFFs carry 2)"
        )
    tpb_values = list(struct.unpack("<16I", tpb_raw))
    while tpb_values and tpb_values[-1] == 0:
        tpb_values.pop()
    return NeffHeader(
        pkg_version=pkg_version,
        header_size=header_size,
        data_size=data_size,
        neff_version_major=major,
        neff_version_minor=minor,
        build_version=_text(build_raw),
        num_tpb=num_tpb,
        hash=hash_raw.hex(),
        uuid=str(uuid_mod.UUID(bytes=uuid_raw)),
        name=_text(name_raw),
        requested_tpb_count=requested_tpb_count,
        tpb_per_node=tuple(tpb_values),
        tpb_per_node_hex=tpb_raw.hex(),
        feature_bits=feature_bits,
        lnc_size=lnc_size,
        file_size=size,
        payload_kind=_sniff_payload(head[HEADER_SIZE:]),
    )


def payload_kind(source: PathOrBytes) -> str:
    """Sniff the payload after the 1024-byte header: "tar.gz" (gzip magic 1f 8b), "tar" (``ustar`` at
    offset 257 of the payload) or "unknown" (also for files shorter than the header). Does not
    validate the header (use :func:`read_neff_header`). Raises ``OSError`` if the file cannot be read.
    """
    head, _size, _label = _read_head(source, "<bytes>")
    return _sniff_payload(head[HEADER_SIZE:])
