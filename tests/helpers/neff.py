"""Build NEFF-shaped files for tests (the product only reads NEFFs, it never writes them)."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
from pathlib import Path

HEADER_FORMAT = "<QQQQQ128sI32s16s256sI64sQI468s"

DEFAULT_FIELDS = {
    "pkg_version": 1,
    "header_size": 1024,
    "data_size": None,  # None: len(payload)
    "neff_version_major": 2,
    "neff_version_minor": 0,
    "build_version": b"2.21.33363.0+82129205",
    "num_tpb": 1,
    "hash": bytes(range(32)),
    "uuid": bytes.fromhex("0123456789abcdef0123456789abcdef"),
    "name": b"graph",
    "requested_tpb_count": 1,
    "tpb_per_node": struct.pack("<16I", 2, 2, *([0] * 14)),
    "feature_bits": 0x5,
    "lnc_size": 1,
    "padding": b"",
}


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A deterministic uncompressed tar archive of ``files``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_gz_bytes(files: dict[str, bytes]) -> bytes:
    """A deterministic gzip-compressed tar archive of ``files``."""
    return gzip.compress(tar_bytes(files), mtime=0)


def neff_header(payload_len: int, **fields) -> bytes:
    """The 1024-byte header; ``fields`` override DEFAULT_FIELDS (``data_size`` defaults to payload_len)."""
    unknown = set(fields) - set(DEFAULT_FIELDS)
    if unknown:
        raise TypeError(f"unknown NEFF header fields: {sorted(unknown)}")
    f = {**DEFAULT_FIELDS, **fields}
    if f["data_size"] is None:
        f["data_size"] = payload_len
    header = struct.pack(
        HEADER_FORMAT,
        f["pkg_version"], f["header_size"], f["data_size"], f["neff_version_major"],
        f["neff_version_minor"], f["build_version"], f["num_tpb"], f["hash"], f["uuid"], f["name"],
        f["requested_tpb_count"], f["tpb_per_node"], f["feature_bits"], f["lnc_size"], f["padding"],
    )
    assert len(header) == 1024
    return header


def build_neff(payload: bytes, **fields) -> bytes:
    """Header plus payload."""
    return neff_header(len(payload), **fields) + payload


def write_neff(path: Path, payload: bytes, **fields) -> Path:
    """Write a NEFF-shaped file and return its path."""
    path = Path(path)
    path.write_bytes(build_neff(payload, **fields))
    return path
