import json
import struct
from pathlib import Path

import pytest

from neuron_build.compilers.neuron import neff
from neuron_build.compilers.neuron.neff import NeffError, payload_kind, read_neff_header
from tests.helpers.neff import build_neff, neff_header, tar_bytes, tar_gz_bytes, write_neff

FILES = {"neff.json": b'{"version": 2}', "sg00/def.json": b"{}" * 300}


@pytest.fixture
def neff_path(tmp_path: Path) -> Path:
    return write_neff(tmp_path / "graph.neff", tar_gz_bytes(FILES))


def test_header_struct_is_1024_bytes():
    assert struct.calcsize(neff.HEADER_FORMAT) == 1024 == neff.HEADER_SIZE


def test_reads_every_field(neff_path: Path):
    payload_len = len(tar_gz_bytes(FILES))
    h = read_neff_header(neff_path)
    assert h.pkg_version == 1
    assert h.header_size == 1024
    assert h.data_size == payload_len
    assert h.neff_version_major == 2
    assert h.neff_version_minor == 0
    assert h.version == "2.0"
    assert h.build_version == "2.21.33363.0+82129205"
    assert h.num_tpb == 1
    assert h.hash == bytes(range(32)).hex()
    assert h.uuid == "01234567-89ab-cdef-0123-456789abcdef"
    assert h.name == "graph"
    assert h.requested_tpb_count == 1
    assert h.tpb_per_node == (2, 2)
    assert h.tpb_per_node_hex == struct.pack("<16I", 2, 2, *([0] * 14)).hex()
    assert h.feature_bits == 5
    assert h.lnc_size == 1
    assert h.file_size == 1024 + payload_len
    assert h.payload_kind == "tar.gz"


def test_to_json_is_serialisable_and_complete(neff_path: Path):
    h = read_neff_header(neff_path)
    doc = json.loads(json.dumps(h.to_json()))
    assert doc["neff_version"] == "2.0"
    assert doc["tpb_per_node"] == [2, 2]
    assert doc["uuid"] == "01234567-89ab-cdef-0123-456789abcdef"
    assert doc["payload_kind"] == "tar.gz"
    assert set(doc) >= {
        "pkg_version", "header_size", "data_size", "neff_version_major", "neff_version_minor",
        "build_version", "num_tpb", "hash", "uuid", "name", "requested_tpb_count", "tpb_per_node",
        "feature_bits", "lnc_size",
    }


def test_bytes_and_path_agree(neff_path: Path):
    data = neff_path.read_bytes()
    assert read_neff_header(data) == read_neff_header(neff_path)
    assert read_neff_header(bytearray(data)) == read_neff_header(str(neff_path))
    assert read_neff_header(memoryview(data)) == read_neff_header(neff_path)


def test_text_fields_are_cut_at_nul(tmp_path: Path):
    p = write_neff(tmp_path / "a.neff", b"x" * 10, name=b"enc\x00garbage", build_version=b"\xff2.x\x00zz")
    h = read_neff_header(p)
    assert h.name == "enc"
    assert h.build_version == "\ufffd2.x"
    assert h.tpb_per_node == (2, 2)


def test_all_zero_tpb_per_node_and_uuid(tmp_path: Path):
    p = write_neff(tmp_path / "z.neff", b"", tpb_per_node=bytes(64), uuid=bytes(16))
    h = read_neff_header(p)
    assert h.tpb_per_node == ()
    assert h.uuid == "00000000-0000-0000-0000-000000000000"
    assert h.data_size == 0
    assert h.payload_kind == "unknown"


def test_header_only_bytes_need_check_size_false(neff_path: Path):
    head = neff_path.read_bytes()[:1024]
    with pytest.raises(NeffError, match="data_size"):
        read_neff_header(head)
    assert read_neff_header(head, check_size=False).name == "graph"


def test_reads_only_the_header_of_a_large_file(tmp_path: Path, monkeypatch):
    payload_size = 300 * 1024 * 1024  # sparse: costs no disk
    p = tmp_path / "big.neff"
    with open(p, "wb") as fh:
        fh.write(neff_header(payload_size) + tar_gz_bytes(FILES))
        fh.truncate(1024 + payload_size)
    read_sizes = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self._fh = fh

        def read(self, n=-1):
            assert n is not None and n >= 0, "must not read the whole file"
            data = self._fh.read(n)
            read_sizes.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self._fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._fh.close()

    monkeypatch.setattr(neff, "open", lambda *a, **k: Spy(real_open(*a, **k)), raising=False)
    h = read_neff_header(p)
    assert h.data_size == payload_size
    assert h.file_size == 1024 + payload_size
    assert h.payload_kind == "tar.gz"
    assert payload_kind(p) == "tar.gz"
    assert sum(read_sizes) <= 2 * (1024 + 512)


def test_payload_kind(tmp_path: Path):
    assert payload_kind(write_neff(tmp_path / "gz.neff", tar_gz_bytes(FILES))) == "tar.gz"
    assert payload_kind(write_neff(tmp_path / "tar.neff", tar_bytes(FILES))) == "tar"
    assert payload_kind(write_neff(tmp_path / "raw.neff", b"\x00" * 600)) == "unknown"
    short = tmp_path / "short.neff"
    short.write_bytes(b"abc")
    assert payload_kind(short) == "unknown"
    assert payload_kind(build_neff(tar_bytes(FILES))) == "tar"
    assert read_neff_header(tmp_path / "tar.neff").payload_kind == "tar"


# --- validation -----------------------------------------------------------------------------------


def _error(source, **kw) -> str:
    with pytest.raises(NeffError) as info:
        read_neff_header(source, **kw)
    return str(info.value)


def test_neff_error_is_a_value_error():
    assert issubclass(NeffError, ValueError)


def test_too_short(tmp_path: Path):
    p = tmp_path / "short.neff"
    p.write_bytes(b"\x01" * 100)
    assert _error(p) == f"{p} is not a NEFF: the file is 100 bytes, shorter than the 1024-byte NEFF header"


def test_empty_file(tmp_path: Path):
    p = tmp_path / "empty.neff"
    p.write_bytes(b"")
    assert "the file is 0 bytes" in _error(p)


def test_wrong_header_size(tmp_path: Path):
    p = write_neff(tmp_path / "model.neff", b"x" * 50, header_size=1701209960)
    assert _error(p) == f"{p} is not a NEFF: header_size is 1701209960, expected 1024"


def test_wrong_data_size_extra_bytes(tmp_path: Path):
    p = write_neff(tmp_path / "model.neff", b"x" * 50, data_size=40)
    assert _error(p) == f"{p} is not a NEFF: data_size is 40 but 50 bytes follow the header"


def test_wrong_data_size_truncated(tmp_path: Path):
    p = write_neff(tmp_path / "model.neff", b"x" * 50, data_size=5000)
    assert _error(p) == f"{p} is not a NEFF: data_size is 5000 but 50 bytes follow the header (truncated?)"


@pytest.mark.parametrize("major", [0, 17, 99, 2**63])
def test_absurd_major_version(tmp_path: Path, major: int):
    p = write_neff(tmp_path / "model.neff", b"x", neff_version_major=major)
    assert _error(p) == (
        f"{p} is not a NEFF: neff_version_major is {major}, expected 1..16 (real NEFFs carry 2)"
    )


@pytest.mark.parametrize("major", [1, 2, 16])
def test_sane_major_versions(tmp_path: Path, major: int):
    p = write_neff(tmp_path / "model.neff", b"x", neff_version_major=major)
    assert read_neff_header(p).neff_version_major == major


def test_text_file(tmp_path: Path):
    p = tmp_path / "notes.neff"
    p.write_text("This is a compiler log, not a NEFF.\n" * 100)
    msg = _error(p)
    assert msg.startswith(f"{p} is not a NEFF: header_size is ")
    assert msg.endswith(", expected 1024 (the file looks like text)")


def test_short_text_file(tmp_path: Path):
    p = tmp_path / "notes.neff"
    p.write_text("hello\n")
    assert _error(p) == (
        f"{p} is not a NEFF: the file is 6 bytes, shorter than the 1024-byte NEFF header"
        " (the file looks like text)"
    )


def test_png_like_file(tmp_path: Path):
    p = tmp_path / "picture.neff"
    png = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + bytes(range(256)) * 8
    p.write_bytes(png)
    header_size = struct.unpack_from("<Q", png, 8)[0]
    assert _error(p) == (
        f"{p} is not a NEFF: header_size is {header_size}, expected 1024 (the file looks like a PNG image)"
    )


def test_zip_file_hint(tmp_path: Path):
    p = tmp_path / "model.pt"
    p.write_bytes(b"PK\x03\x04" + b"\x00" * 2000)
    assert "(the file looks like a zip archive (a TorchScript .pt file is one))" in _error(p)


def test_bytes_error_names_the_source():
    assert _error(b"tiny").startswith("<bytes> is not a NEFF: the file is 4 bytes")
    assert _error(b"tiny", name="artifact/model.neff").startswith("artifact/model.neff is not a NEFF")


def test_missing_file_is_os_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        read_neff_header(tmp_path / "missing.neff")
    with pytest.raises(IsADirectoryError):
        read_neff_header(tmp_path)


def test_random_content_only_raises_neff_error():
    import random

    rnd = random.Random(7)
    for _ in range(300):
        size = rnd.choice([0, 1, 1023, 1024, 1025, 1600, 3000])
        data = rnd.randbytes(size)
        try:
            read_neff_header(data)
        except NeffError as exc:
            assert str(exc).startswith("<bytes> is not a NEFF: ")
        assert payload_kind(data) in ("tar.gz", "tar", "unknown")


def test_relative_paths(tmp_path: Path, monkeypatch):
    write_neff(tmp_path / "graph.neff", tar_gz_bytes(FILES))
    monkeypatch.chdir(tmp_path)
    assert read_neff_header("graph.neff").name == "graph"
    assert read_neff_header(Path("graph.neff")).payload_kind == "tar.gz"
