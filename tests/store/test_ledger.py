"""The build ledger, the kept failure workdirs and the checklist, on a real LocalStore (no compiles: fast).

The builds that fill a ledger for real are in tests/flows/test_monitoring.py."""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing
from pathlib import Path

import pytest

from neuron_build.errors import ConfigError
from neuron_build.evaluate.monitoring import SIGNALS, evaluate
from neuron_build.evaluate.openmetrics import openmetrics_text
from neuron_build.project.config import MonitoringSettings, load_project
from neuron_build.store import LocalStore, failures, ledger
from neuron_build.store.contract import ObjectIO
from neuron_build.store.gc import collect_garbage
from neuron_build.store.layout import failure_entry_path
from neuron_build.store.records import TargetRecord
from tests.helpers.projects import write_tiny_project

T0 = _dt.datetime(2026, 11, 30, 10, 0, tzinfo=_dt.timezone.utc)
KEY = "ab" * 32


def rec(target: str = "m/b1/fp32/p1", event: str = "compile", status: str = "PASS", minutes: float = 0, **kw):
    """A ledger record ``minutes`` after T0."""
    kw.setdefault("key", KEY)
    kw.setdefault("backend", "torchscript")
    kw.setdefault("attempt", 1 if event == "compile" else 0)
    if event == "compile" and status == "PASS":
        kw.setdefault("compile_time_s", 10.0)
        kw.setdefault("op_count", 5)
        kw.setdefault("artifact_bytes", 1000)
    return ledger.LedgerRecord(target=target, event=event, status=status,
                               time=(T0 + _dt.timedelta(minutes=minutes)).isoformat(), host="h", **kw)


def signal(records, name: str, store=None, **limits):
    rep = evaluate(records, MonitoringSettings(**limits), store=store)
    return next(s for s in rep.signals if s.name == name)


# ----------------------------------------------------------------------------------- ObjectIO, records

def test_local_store_object_io(tmp_path):
    store = LocalStore(tmp_path / "s")
    assert isinstance(store, ObjectIO)
    assert store.put_object("ledger/2026-11-30/a.json", b"1") is True
    assert store.put_object("ledger/2026-11-30/a.json", b"2", create_only=True) is False
    assert store.get_object("ledger/2026-11-30/a.json") == b"1"
    assert store.put_object("ledger/2026-11-30/a.json", b"3") is True
    assert store.get_object("ledger/2026-11-30/a.json") == b"3"
    store.put_object("ledger/2026-12-01/b.json", b"4")
    (tmp_path / "s" / "ledger" / "2026-12-01" / ".b.json.1.ab.tmp").write_bytes(b"torn")  # a killed writer's
    assert store.list_objects("ledger") == ["ledger/2026-11-30/a.json", "ledger/2026-12-01/b.json"]
    assert store.get_object("ledger/nope.json") is None
    assert store.delete_object("ledger/2026-11-30/a.json") is True
    assert store.delete_object("ledger/2026-11-30/a.json") is False
    assert not (tmp_path / "s" / "ledger" / "2026-11-30").exists()  # no empty folder left behind
    with pytest.raises(ValueError, match="not a relative path"):
        store.put_object("../escape", b"x")


def test_record_round_trip_and_unreadable_records_skipped(tmp_path):
    store = LocalStore(tmp_path / "s")
    r = rec(changed=("shapes",), failure_stage=None, peak_rss_bytes=123)
    path = ledger.append(store, r)
    assert path.startswith("ledger/2026-11-30/100000.000000Z-h-") and path.endswith(".json")
    store.put_object("ledger/2026-11-30/zz-garbage.json", b"{not json")
    store.put_object("ledger/2026-11-30/zz-other.json", json.dumps({"target": 1}).encode())
    assert ledger.read(store) == [r]
    assert ledger.read(store, since=T0 + _dt.timedelta(seconds=1)) == []
    assert ledger.read(store, until=T0 - _dt.timedelta(days=1)) == []


def _append_many(root: str, worker: int, n: int) -> None:
    store = LocalStore(root)
    for i in range(n):  # every writer uses the same timestamps: only the token keeps names apart
        ledger.append(store, rec(target=f"m/b{worker}/fp32/p1", minutes=i % 3, attempt=i))


def test_concurrent_writers_lose_no_record(tmp_path):
    root = str(tmp_path / "s")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(root, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = ledger.read(LocalStore(root))
    assert len(got) == 240
    assert sorted((r.target, r.attempt) for r in got) == sorted((f"m/b{w}/fp32/p1", i) for w in range(4)
                                                                for i in range(60))


def test_parse_window():
    assert ledger.parse_window("24h") == _dt.timedelta(hours=24)
    assert ledger.parse_window("90m") == _dt.timedelta(minutes=90)
    assert ledger.parse_window("7d") == _dt.timedelta(days=7)
    assert ledger.parse_window("-3h") == _dt.timedelta(hours=3)
    with pytest.raises(ValueError, match="--since .24. is not a window"):
        ledger.parse_window("24")


# ----------------------------------------------------------------------------------- the checklist

def test_failure_rate_crossed_and_not():
    ok = [rec(target=f"m/b{i}/fp32/p1", minutes=i) for i in range(19)]
    one_bad = ok + [rec(target="bad/static/fp32/p1", status="ERROR", failure_stage="model", minutes=30)]
    s = signal(one_bad, "compile_failure_rate")
    assert (s.value, s.ok, s.verdict) == (0.05, True, "ok")  # 1 of 20 is 5 %: at the limit
    s = signal(one_bad + [rec(target="bad/static/fp32/p1", status="ERROR", failure_stage="model", minutes=31)],
               "compile_failure_rate")
    assert (s.value, s.ok, s.verdict) == (round(2 / 21, 4), False, "ALERT")
    assert s.figures["by_stage"] == {"model": 2} and s.figures["failing_targets"] == ["bad/static/fp32/p1"]
    assert "keep the compiler workdir" in s.action
    hits = [rec(event="cached", minutes=1)]
    assert signal(hits, "compile_failure_rate").verdict == "no data"  # cache hits are not compiles


def test_compile_time_p95_crossed_and_not():
    times = [rec(target=f"m/b{i}/fp32/p1", compile_time_s=float(10 * i + 10), minutes=i) for i in range(20)]
    s = signal(times, "compile_time_p95_s", max_compile_time_p95_s=190)
    assert (s.value, s.ok) == (190.0, True)  # nearest rank: of 20 values the 19th (ceil(0.95 * 20))
    s = signal(times, "compile_time_p95_s", max_compile_time_p95_s=189.9)
    assert (s.value, s.ok, s.figures["slowest"]) == (190.0, False, "m/b19/fp32/p1")
    fails_only = [rec(status="ERROR", compile_time_s=999.0)]
    assert signal(fails_only, "compile_time_p95_s").value is None


def test_recompiles_per_hour_crossed_and_not():
    first = rec(target="m/static/fp32/p1", changed=("new target",))
    again = [rec(target="m/static/fp32/p1", changed=("shapes",), minutes=10 * i) for i in (1, 2)]
    s = signal([first, *again], "recompiles_per_hour")
    assert (s.value, s.ok) == (2.0, True)
    third = rec(target="m/static/fp32/p1", changed=("shapes", "compiler_args"), minutes=30)
    s = signal([first, *again, third], "recompiles_per_hour")
    assert (s.value, s.ok) == (3.0, False)
    assert s.figures["changed"] == {"compiler_args": 1, "shapes": 3}
    spread = [rec(target="m/static/fp32/p1", changed=("shapes",), minutes=61 * i) for i in range(3)]
    assert signal(spread, "recompiles_per_hour").value == 1.0  # never more than one within 60 minutes
    retry = [rec(changed=("shapes",), attempt=2, status="TRANSIENT")]
    assert signal(retry, "recompiles_per_hour").value == 0.0  # a transient retry is not a recompile


def test_artifacts_per_model_crossed_and_not():
    three = [rec(target=f"m/b{b}/fp32/p1") for b in (1, 2, 4)]
    s = signal(three, "artifacts_per_model")
    assert (s.value, s.ok) == (3.0, True)
    four = three + [rec(target="m/b8/fp32/p1", event="cached")]
    s = signal(four, "artifacts_per_model")
    assert (s.value, s.ok) == (4.0, False)
    assert s.figures["per_model"] == {"m/fp32/p1/torchscript": 4}
    assert "merge buckets" in s.action
    failed_now = four + [rec(target="m/b8/fp32/p1", status="ERROR", minutes=5)]
    assert signal(failed_now, "artifacts_per_model").value == 3.0  # only targets whose newest build passed


def test_hbm_from_the_compile_log_or_not_measured():
    s = signal([rec()], "hbm_peak_fraction")
    assert (s.value, s.ok, s.verdict) == (None, None, "not measured here")
    est = [rec(status="ERROR", hbm_peak_bytes=int(22.84e9), backend="neuron")]
    s = signal(est, "hbm_peak_fraction")
    assert (s.value, s.ok) == (round(22.84 / 16, 4), False)
    s = signal([rec(hbm_peak_bytes=int(9e9))], "hbm_peak_fraction")
    assert (s.value, s.ok) == (0.5625, True)


def test_p99_ratio_from_stored_benchmarks(tmp_path):
    store = LocalStore(tmp_path / "s")
    old, new = "01" * 32, "02" * 32
    recs = [rec(key=old), rec(key=new, minutes=5, changed=("source",))]
    assert signal(recs, "p99_latency_ratio", store=store).verdict == "not measured here"
    store.put_result(old, "bench", "cpu--h", {"device_kind": "cpu", "latency_ms": {"p99": 2.0}})
    store.put_result(new, "bench", "cpu--h", {"device_kind": "cpu", "latency_ms": {"p99": 2.5}})
    s = signal(recs, "p99_latency_ratio", store=store)
    assert (s.value, s.ok) == (1.25, True)
    store.put_result(new, "bench", "cpu--h", {"device_kind": "cpu", "latency_ms": {"p99": 2.7}})
    s = signal(recs, "p99_latency_ratio", store=store)
    assert (s.value, s.ok) == (1.35, False)
    assert "roll back" in s.action


def test_utilisation_is_never_a_guess():
    s = signal([rec()], "neuroncore_utilisation")
    assert (s.value, s.ok, s.verdict) == (None, None, "not measured here")


def test_openmetrics_of_a_report_parses(tmp_path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    recs = [rec(target="m/b1/fp32/p1", peak_rss_bytes=2**20),
            rec(target="bad/static/fp32/p1", status="ERROR", failure_stage="model", minutes=1)]
    rep = evaluate(recs, MonitoringSettings())
    fams = {f.name: f for f in text_string_to_metric_families(openmetrics_text(rep, 3600).decode())}
    sample = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert sample[("neuron_build_signal_value", (("signal", "compile_failure_rate"),))] == 0.5
    assert sample[("neuron_build_signal_ok", (("signal", "compile_failure_rate"),))] == 0
    assert sample[("neuron_build_signal_measured", (("signal", "neuroncore_utilisation"),))] == 0
    assert ("neuron_build_signal_value", (("signal", "neuroncore_utilisation"),)) not in sample
    assert sample[("neuron_build_compile_failures", (("stage", "model"), ("target", "bad/static/fp32/p1")))] == 1
    assert sample[("neuron_build_target_peak_rss_bytes", (("target", "m/b1/fp32/p1"),))] == 2**20
    assert sample[("neuron_build_report_window_seconds", ())] == 3600
    assert {s for f in fams.values() for s in [f.name]} >= {"neuron_build_compiles", "neuron_build_cache_lookups"}
    assert {dict(s.labels)["signal"] for s in fams["neuron_build_signal_limit"].samples} == set(SIGNALS)


# ----------------------------------------------------------------------------------- kept failure workdirs

def _workdir(root: Path, sizes: dict[str, int]) -> Path:
    for name, size in sizes.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)
    return root


def _keep(store, tmp_path, target: str, n: int, keep_last: int = 2, max_bytes: int = 10**6, sizes=None):
    info = {"target": target, "key": KEY, "status": "ERROR", "reason": f"failure {n}", "failure_stage": "compile"}
    return failures.keep_workdir(store, _workdir(tmp_path / f"w-{target.replace('/', '_')}-{n}",
                                                 sizes or {"request.json": 100, "neuron/log-neuron-cc.txt": 50}),
                                 info, keep_last, max_bytes)


def test_failure_workdirs_kept_bounded_per_target_and_by_size(tmp_path):
    store = LocalStore(tmp_path / "s")
    for n in range(3):
        ent, removed = _keep(store, tmp_path, "m/b1/fp32/p1", n)
        assert ent is not None and ent.files == {"neuron/log-neuron-cc.txt": 50, "request.json": 100}
    kept = failures.kept(store)
    assert [e.reason for e in kept] == ["failure 1", "failure 2"]  # the last 2 per target
    assert store.get_object(failure_entry_path(kept[0].target, kept[0].entry, "files/neuron/log-neuron-cc.txt")) == b"x" * 50
    _keep(store, tmp_path, "m/b2/fp32/p1", 0)
    assert len(failures.kept(store)) == 3
    # a total cap of 400 bytes keeps the newest two entries (150 bytes each), oldest removed first
    ent, removed = _keep(store, tmp_path, "m/b3/fp32/p1", 0, max_bytes=400)
    assert [(e.target, e.reason) for e in removed] == [("m/b1/fp32/p1", "failure 1"), ("m/b1/fp32/p1", "failure 2")]
    assert sum(e.bytes for e in failures.kept(store)) <= 400
    assert [e.target for e in failures.kept(store)] == ["m/b2/fp32/p1", "m/b3/fp32/p1"]
    # a file larger than the cap alone is left out and named
    ent, _ = _keep(store, tmp_path, "m/b4/fp32/p1", 0, max_bytes=400, sizes={"request.json": 10, "model/graph.hlo": 500})
    assert ent.files == {"request.json": 10} and ent.omitted == {"model/graph.hlo": 500}


def test_gc_collects_failure_workdirs_once_the_target_passes(tmp_path):
    store = LocalStore(tmp_path / "s")
    _keep(store, tmp_path, "m/b1/fp32/p1", 0)
    _keep(store, tmp_path, "m/b2/fp32/p1", 0)
    store.put_target(TargetRecord(target="m/b1/fp32/p1", key=KEY, status="ERROR", time="t"))
    store.put_target(TargetRecord(target="m/b2/fp32/p1", key=KEY, status="PASS", time="t2"))
    # an entry whose writer died before entry.json, two hours ago
    stale = "20000101T000000.000000Z-0123abcd"
    store.put_object(f"failures/m/b3/fp32/p1/{stale}/files/request.json", b"{}")
    rep = collect_garbage(store, dry_run=True)
    fw = [r for r in rep.removed if r.kind == "failure-workdir"]
    assert sorted(r.path.split("/")[2] for r in fw) == ["b2", "b3"]
    assert len(failures.kept(store)) == 2  # a dry run removes nothing
    rep = collect_garbage(store)
    assert [e.target for e in failures.kept(store)] == ["m/b1/fp32/p1"]  # still failing: kept
    assert store.list_objects("failures/m/b3") == [] and store.list_objects("failures/m/b2") == []
    assert next(r for r in rep.removed if r.target == "m/b2/fp32/p1").bytes == 150
    # b1 passes as a cache hit (a doit build found its artifact): the ledger says so, gc removes it
    old = rec(target="m/b1/fp32/p1", event="cached", minutes=0)
    ledger.append(store, old)  # a hit from before the failure does not count
    assert [r.kind for r in collect_garbage(store).removed] == []
    now = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=1)
    ledger.append(store, ledger.LedgerRecord(target="m/b1/fp32/p1", key=KEY, event="cached", status="PASS",
                                             time=now.isoformat()))
    assert [r.target for r in collect_garbage(store).removed] == ["m/b1/fp32/p1"]
    assert failures.kept(store) == []


def test_monitoring_config_unknown_key_named(tmp_path):

    cfg = write_tiny_project(tmp_path / "p", extra="\n[monitoring]\nmax_failure_rate = 0.2\nkeep_failed_workdir = 3\n")
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    assert "monitoring.keep_failed_workdir" in str(e.value) and "keep_failed_workdirs" in str(e.value)
    cfg.write_text(cfg.read_text().replace("keep_failed_workdir = 3", "keep_failed_workdirs = 5"))
    mon = load_project(cfg).config.monitoring
    assert (mon.max_failure_rate, mon.keep_failed_workdirs, mon.max_compile_time_p95_s) == (0.2, 5, 400.0)
