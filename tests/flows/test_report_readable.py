"""``report --html`` as a person reads it, in headless chromium at 1400 px (no compile: a ledger, a registry
document and serving traffic made here): whole build numbers on the x axis of a one-build window, "no
failures" in words instead of an empty chart, no table or chart wider than the page, graph reuses in the
header, six equal series each visible, and the traffic padding the page gives equal to ``buckets suggest``'s."""

from __future__ import annotations

import base64
import re

from neuron_build.evaluate.monitoring import evaluate
from neuron_build.evaluate.report_html import render_html
from neuron_build.evaluate.traffic_html import traffic_section
from neuron_build.project.config import MonitoringSettings, load_project
from neuron_build.store.ledger import LedgerRecord
from neuron_build.traffic import TrafficRecorder, load_traffic
from tests.helpers.chromium import Browser
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project

TARGETS = [f"m/b{i}/fp32/p1" for i in range(1, 7)]
ENC = '''
[models.enc]
factory = "tinylib.tiny:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "ids", shape = ["batch", "seq"], dtype = "int64", range = [0, 100] }]
buckets = { batch = [1, 4], seq = [16, 64] }
'''


def _ledger() -> list[LedgerRecord]:
    """Six targets compiled once each in 2.0 s with equal op counts (six series on one spot), a cache hit
    and a graph reuse; nothing failed."""
    recs = [LedgerRecord(t, f"{i:064x}", "compile", "PASS", f"2026-12-01T10:0{i}:00+00:00", compile_time_s=2.0,
                         peak_rss_bytes=2**28, op_count=10, artifact_bytes=4096) for i, t in enumerate(TARGETS)]
    recs.append(LedgerRecord(TARGETS[0], f"{0:064x}", "cached", "PASS", "2026-12-01T11:00:00+00:00"))
    recs.append(LedgerRecord(TARGETS[1], f"{99:064x}", "graph-reused", "PASS", "2026-12-01T11:01:00+00:00",
                             reused_from=f"{1:064x}"))
    return recs


def _registry() -> dict:
    """One model with 12 releases of the six targets (long ids, equal op counts): a wide table and chart."""
    rels = []
    for r in range(12):
        rid = f"r-{r:02d}" + "0123456789abcdef"[:14]  # as release_id makes them: r- and 16 hex digits
        rels.append({"id": rid, "dtype": "fp32", "profile": "p1", "backend": "torchscript", "created": "",
                     "channels": ["dev"] if r == 11 else [], "rolled_back": [],
                     "gates": [{"channel": "dev", "action": "promote", "gates": [
                         {"name": n, "verdict": "pass"} for n in ("validation", "bench", "op_count_drift",
                                                                  "compile_time_drift", "channel_order")]}],
                     "buckets": [{"bucket_id": t.split("/")[1], "target": t, "key": f"{r:02d}" + "ab" * 31,
                                  "in_matrix": True, "op_count": 10, "compile_time_s": 2.0, "artifact_bytes": 4096,
                                  "validation": {"reference": {"verdict": "fail", "error": "max abs error 0.25 > "
                                                               "atol 0.001 at output[0][3, 17]; " * 4}},
                                  "bench": {"cpu-" + "x" * 40: {"p50_ms": 1.0, "p99_ms": 2.0}}} for t in TARGETS]})
    return {"models": [{"model": "m", "in_config": True, "releases": rels, "timeline": [],
                        "channels": [{"channel": "dev", "declared": True, "release": rels[-1]["id"], "version": 12,
                                      "action": "promote", "time": "2026-12-01T12:00:00+00:00", "who": "ci"}]}]}


def _traffic(tmp_path):
    """Served requests of ``enc`` (batch x seq), each run in the smallest bucket that fits, saved to a file."""
    rec = TrafficRecorder("enc", "r1", ["batch", "seq"])
    for batch, seq, n in ((1, 10, 30), (3, 40, 10), (4, 60, 5), (1, 50, 20), (2, 12, 8)):
        bb, bs = min(b for b in (1, 4) if b >= batch), min(s for s in (16, 64) if s >= seq)
        for _ in range(n):
            rec.record({"batch": batch, "seq": seq}, f"b{bb}-s{bs}",
                       [(f"b{bb}-s{bs}", {"batch": bb, "seq": bs}, {"batch": batch, "seq": seq})])
    return rec.save(tmp_path / "traffic.jsonl")


def test_the_report_page_reads_right_at_1400_px(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj", extra=ENC)
    project = load_project(cfg)
    tfile = _traffic(tmp_path)
    rep = evaluate(_ledger(), MonitoringSettings())
    page = tmp_path / "report.html"
    page.write_text(render_html(rep, sections=[traffic_section(project, load_traffic([tfile]))], registry=_registry()))
    with Browser() as b:
        b.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        got = b.load(page)
        head = b.evaluate("document.querySelector('h1 + p').textContent")
        ticks = b.evaluate("[...document.querySelectorAll('#chart-compile-time g[id^=\"xtick\"] text')]"
                           ".map(t => t.textContent.trim())")
        spots = b.evaluate("[...document.querySelectorAll('#chart-compile-time g[id^=\"line2d\"] use')]"
                           ".filter(u => !u.closest('g[id^=\"xtick\"], g[id^=\"ytick\"], g[id^=\"legend\"]'))"
                           ".map(u => u.getAttribute('x') + ',' + u.getAttribute('y'))")
        ops = b.evaluate("[...document.querySelectorAll('#chart-ops-m g[id^=\"line2d\"] use')]"
                         ".filter(u => !u.closest('g[id^=\"xtick\"], g[id^=\"ytick\"], g[id^=\"legend\"]'))"
                         ".filter(u => u.getBoundingClientRect().width > 0)"
                         ".map(u => { const r = u.getBoundingClientRect(); return Math.round(r.x) + ',' + Math.round(r.y); })")
        failures = b.evaluate("(() => { const e = document.getElementById('chart-failures'); "
                              "return [e.tagName, e.querySelectorAll('svg').length, e.textContent]; })()")
        page_w = b.evaluate("document.documentElement.clientWidth")
        scroll_w = b.evaluate("document.documentElement.scrollWidth")
        too_wide = b.evaluate("[...document.querySelectorAll('table, figure, svg, p')].filter(e => "
                              f"e.getBoundingClientRect().right > {page_w} + 1).map(e => e.id || e.tagName)")
        padding = b.evaluate("Object.fromEntries([...document.querySelectorAll('#traffic-enc-padding tr')].slice(1)"
                             ".map(tr => [tr.children[0].textContent, tr.children[1].textContent]))")
        shot = b.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    (tmp_path / "report.png").write_bytes(base64.b64decode(shot["data"]))
    assert got["errors"] == [] and got["requests"] == [page.resolve().as_uri()]
    assert "6 compiles (0 failed), 1 cache hits, 0 reuses, 1 graph reuses" in " ".join(head.split()), head
    assert ticks == ["1"], ticks                                   # one build: the tick "1", no 0.96, 0.98, ...
    assert len(set(spots)) == 6, spots                             # six equal compile times, six visible markers
    assert len(set(ops)) >= 6 * 12, len(set(ops))                  # six equal op counts at each of 12 releases
    assert failures[0] == "P" and failures[1] == 0 and "no failures" in failures[2], failures
    assert scroll_w <= page_w and too_wide == [], (scroll_w, page_w, too_wide)
    # the padding the page gives is the one buckets suggest prints, per searched dims
    for dims, key in ((["--dim", "seq"], "seq"), (["--dim", "batch"], "batch"), ([], "batch x seq")):
        r = run_cli("-c", str(cfg), "buckets", "suggest", "enc", "--traffic", str(tfile), "--max-buckets", "4", *dims)
        assert r.returncode == 0, r.stderr
        cli = re.search(r"^current\s+.*?\s(\d+\.\d\d %)", r.stdout, flags=re.M).group(1)
        assert padding[key] == cli, (key, padding, r.stdout)
    served = next(v for k, v in padding.items() if k.startswith("as served"))
    assert served == padding["batch x seq"]                      # the runtime's counts: the same definition
