"""What a command did not check, or could not read, is said (issue 40, item 8): plain ``verify`` says it
checked sizes only; a channel pointer that is not JSON is reported as corrupt by ``channels``, not shown as
an empty channel; ledger records ``report`` cannot read are counted and named, not skipped without a word."""

from __future__ import annotations

import json

from neuron_build.cli import main
from neuron_build.store.local import LocalStore
from tests.helpers.projects import write_tiny_project

RECORD = {"target": "tiny/b1/fp32/p1", "key": "ab" * 32, "event": "hit", "status": "cached",
          "time": "2026-12-02T05:00:00Z"}


def _project(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    store = LocalStore(cfg.parent / "artifacts")
    store.put_object("ledger/2026-12-02/050000.000000Z-host-0001.json",
                     json.dumps({"schema": 1, "records": [RECORD]}).encode())
    return cfg, store


def test_plain_verify_says_it_checked_sizes_only(tmp_path, capsys):
    cfg, _ = _project(tmp_path)
    assert main(["verify", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "(sizes only: a blob changed in place at the same size passes; --deep hashes every blob)" in out
    assert main(["verify", "--deep", "-c", str(cfg)]) == 0
    assert "(sha256 of every blob)" in capsys.readouterr().out
    assert main(["verify", "--json", "-c", str(cfg)]) == 0
    assert json.loads(capsys.readouterr().out)["not_checked"] == "blob contents (sha256): --deep hashes every blob"


def test_a_garbage_channel_pointer_is_reported_corrupt_by_channels(tmp_path, capsys):
    cfg, store = _project(tmp_path)
    store.put_object("channels/tiny/dev.json", b"\x00garbage")
    assert main(["channels", "-c", str(cfg)]) == 1
    out = capsys.readouterr().out
    path = cfg.parent / "artifacts" / "channels" / "tiny" / "dev.json"
    line = [x for x in out.splitlines() if "dev" in x]
    assert len(line) == 1 and line[0].split()[:3] == ["tiny", "dev", "CORRUPT"], out
    assert f"{path}: not a channel pointer (not a JSON object); its history records no promotion" in line[0] and "promote" in line[0]
    assert main(["channels", "--json", "-c", str(cfg)]) == 1
    rows = {r["channel"]: r for r in json.loads(capsys.readouterr().out)["channels"] if r["model"] == "tiny"}
    assert rows["dev"]["corrupt"].startswith(f"{path}: not a channel pointer") and rows["prod"]["corrupt"] is None


def test_report_counts_and_names_unreadable_ledger_records(tmp_path, capsys):
    cfg, store = _project(tmp_path)
    store.put_object("ledger/2026-12-02/060000.000000Z-host-abcd.json", b"[")
    store.put_object("ledger/2026-12-02/070000.000000Z-host-abcd.json",
                     json.dumps({"schema": 1, "records": [RECORD, {"target": 3}]}).encode())
    assert main(["report", "--since", "all", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert ("2 unreadable ledger records skipped: ledger/2026-12-02/060000.000000Z-host-abcd.json (not JSON), "
            "ledger/2026-12-02/070000.000000Z-host-abcd.json#1 (not a ledger record)") in out
    assert "neuron-build verify" in out
    assert main(["report", "--since", "all", "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 2 and doc["unreadable_records"] == [
        "ledger/2026-12-02/060000.000000Z-host-abcd.json (not JSON)",
        "ledger/2026-12-02/070000.000000Z-host-abcd.json#1 (not a ledger record)"]


def test_release_of_another_backend_advises_a_build_of_that_backend(tmp_path, capsys):
    """`release --backend inductor` on a torchscript project: `neuron-build build T` would build torchscript
    again; the advice says to set [build] backend first."""
    cfg, _ = _project(tmp_path)
    assert main(["release", "other", "--backend", "inductor", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert ("other/static/fp32/p1: missing: not built (key ") in err
    assert ("set [build] backend = \"inductor\" in buckets.toml, then run `neuron-build build "
            "other/static/fp32/p1` (a build now compiles for torchscript)") in err
    assert main(["release", "other", "-c", str(cfg)]) == 2       # the project's own backend: the plain advice
    err = capsys.readouterr().err
    assert "; run `neuron-build build other/static/fp32/p1`" in err and "[build] backend" not in err
