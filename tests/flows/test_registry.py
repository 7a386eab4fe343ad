"""The registry as a release manager sees it, after a scripted release flow through the CLI: ``releases diff``
(text and JSON), the registry section of ``report --html`` rendered in headless chromium, and ``report --json``'s
registry figures.

The flow (module fixture, one tiny project, real builds, validations and benchmarks): release r1 (b1, b4),
promote it dev -> staging; edit a model source and add bucket 8, release r2 (b1, b4, b8), promote it into dev;
a refused promotion of r2 straight into prod; r2 dev -> staging; roll staging back to r1; finally drop bucket 8
from the matrix, so r2's b8 is a target no longer in the matrix.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.chromium import Browser
from tests.helpers.cli import run_cli
from tests.helpers.projects import edit, write_tiny_project

ACTOR = "release-manager@ci"
RELEASE = "\n[release]\nmax_latency_ratio = 100\n"


def cli(cfg: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    r = run_cli(*args, "-c", str(cfg), env={"NEURON_BUILD_ACTOR": ACTOR})
    assert r.returncode in ok, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def flow(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("registry") / "proj"
    cfg = write_tiny_project(root, extra=RELEASE)
    sel = "tiny/*/fp32/p1"
    cli(cfg, "build", "-n", "2", sel)
    cli(cfg, "validate", sel)
    cli(cfg, "bench", sel, "--max-time", "5")
    r1 = cli(cfg, "release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q").stdout.strip()
    cli(cfg, "promote", "tiny", r1, "--to", "dev")
    cli(cfg, "promote", "tiny", "--from", "dev", "--to", "staging")
    (root / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 3\n")
    edit(cfg, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 4, 8] }")
    cli(cfg, "build", "-n", "2", sel)
    cli(cfg, "validate", sel)
    cli(cfg, "bench", sel, "--max-time", "5")
    r2 = cli(cfg, "release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q").stdout.strip()
    cli(cfg, "promote", "tiny", r2, "--to", "dev")
    refused = cli(cfg, "promote", "tiny", r2, "--to", "prod", ok=(3,))
    cli(cfg, "promote", "tiny", "--from", "dev", "--to", "staging")
    cli(cfg, "rollback", "tiny", "--channel", "staging", "--reason", "p99 regression on canary")
    edit(cfg, "buckets = { batch = [1, 4, 8] }", "buckets = { batch = [1, 4] }")
    return {"cfg": cfg, "r1": r1, "r2": r2, "refused": refused.stderr}


def test_releases_diff_names_changed_buckets_and_key_components(flow):
    cfg, r1, r2 = flow["cfg"], flow["r1"], flow["r2"]
    doc = json.loads(cli(cfg, "releases", "diff", r1, "tiny@dev", "--json").stdout)
    assert doc["schema"] == "neuron-build/releases-diff/v1"
    assert (doc["a"]["id"], doc["b"]["id"]) == (r1, r2)
    assert (doc["changed"], doc["same"], doc["added"], doc["removed"]) == (["b1", "b4"], [], ["b8"], [])
    by = {b["bucket_id"]: b for b in doc["buckets"]}
    assert by["b1"]["key"] == {"same": False, "components": ["model: sources.tinylib/act.py"]}
    assert by["b8"]["state"] == "added" and by["b8"]["a"] is None and by["b8"]["key"] is None
    for bid in ("b1", "b4"):
        for side in ("a", "b"):
            s = by[bid][side]
            assert s["validation"] == {"cpu": {"verdict": "pass", "error": None}}
            assert s["op_count"] > 0 and s["compile_time_s"] > 0 and s["artifact_bytes"] > 0
            (bench,) = s["bench"].values()
            assert 0 < bench["p50_ms"] <= bench["p99_ms"]
    assert doc["toolchain"]["same"] is True and "torch" in doc["a"]["toolchain"]
    # the gate verdicts of every promotion and refusal of each release, oldest first
    assert [(g["channel"], g["action"]) for g in doc["a"]["gates"]] == [("dev", "promote"), ("staging", "promote")]
    assert [(g["channel"], g["action"]) for g in doc["b"]["gates"]] == [
        ("dev", "promote"), ("staging", "promote"), ("prod", "refuse")]
    prod = doc["b"]["gates"][2]["gates"]
    assert {g["name"]: g["verdict"] for g in prod}["channel_order"] == "fail"
    assert doc["a"]["channels"] == ["staging"] and doc["b"]["channels"] == ["dev"]

    # the same diff by prefix and as text
    text = cli(cfg, "releases", "diff", r1[:10], r2).stdout
    assert f"--- {r1}" in text and f"+++ {r2}" in text
    assert "~ b1: key changed" in text and "model: sources.tinylib/act.py" in text
    assert "+ b8: added (tiny/b8/fp32/p1" in text and "2 changed, 0 same, 1 added, 0 removed" in text
    same = json.loads(cli(cfg, "releases", "diff", "tiny@staging", r1, "--json").stdout)
    assert same["same"] == ["b1", "b4"] and same["changed"] == []
    # bad references: one line naming the reference
    r = cli(cfg, "releases", "diff", r1, "tiny@prod", ok=(2,))
    assert "tiny@prod: channel 'prod' of model 'tiny' holds no release" in r.stderr and "Traceback" not in r.stderr
    r = cli(cfg, "releases", "diff", r1, ok=(2,))
    assert "releases diff needs two releases (got 1)" in r.stderr
    r = cli(cfg, "releases", "diff", "r-00000000", r1, ok=(2,))
    assert "no release 'r-00000000'" in r.stderr
    # listing still works
    assert [x["id"] for x in json.loads(cli(cfg, "releases", "tiny", "--json").stdout)["releases"]] == [r1, r2]


def test_registry_page_renders_in_chromium_with_the_json_figures(flow, tmp_path):
    cfg, r1, r2 = flow["cfg"], flow["r1"], flow["r2"]
    page = tmp_path / "report.html"
    doc = json.loads(cli(cfg, "report", "--json", "--html", str(page)).stdout)
    (reg,) = [m for m in doc["registry"]["models"] if m["model"] == "tiny"]
    assert [(c["channel"], c["release"], c["version"]) for c in reg["channels"]] == [
        ("dev", r2, 2), ("staging", r1, 3), ("prod", None, None)]
    # oldest first (history times are whole seconds: entries of one second keep channel order)
    tl = reg["timeline"]
    assert [e["time"] for e in tl] == sorted(e["time"] for e in tl)
    per_channel = {c: [(e["action"], e["to"]) for e in tl if e["channel"] == c] for c in ("dev", "staging", "prod")}
    assert per_channel == {"dev": [("promote", r1), ("promote", r2)],
                           "staging": [("promote", r1), ("promote", r2), ("rollback", r1)],
                           "prod": [("refuse", r2)]}
    (refusal,) = [e for e in tl if e["action"] == "refuse"]
    assert refusal["failed_gates"] == ["channel_order"] and "prod" in refusal["refused"]
    (back,) = [e for e in tl if e["action"] == "rollback"]
    assert (back["from"], back["to"], back["reason"]) == (r2, r1, "p99 regression on canary")
    rels = {r["id"]: r for r in reg["releases"]}
    assert [b["target"] for b in rels[r2]["buckets"]] == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1", "tiny/b8/fp32/p1"]
    assert [b["in_matrix"] for b in rels[r2]["buckets"]] == [True, True, False]   # bucket 8 left the matrix
    assert rels[r2]["rolled_back"][0]["channel"] == "staging" and rels[r1]["channels"] == ["staging"]
    others = [m for m in doc["registry"]["models"] if m["model"] == "other"]
    assert others and others[0]["releases"] == []

    with Browser() as b:
        got = b.load(page)
        assert got["errors"] == [] and got["requests"] == [page.resolve().as_uri()]
        channels = b.evaluate("[...document.querySelectorAll('#channels-tiny tr')].slice(1).map("
                              "tr => [...tr.cells].slice(0, 3).map(td => td.textContent))")
        last_move = b.evaluate("[...document.querySelectorAll('#channels-tiny tr')].slice(1).map("
                               "tr => tr.cells[3].textContent)")
        timeline = b.evaluate("[...document.querySelectorAll('#timeline-tiny tr')].slice(1).map("
                              "tr => [...tr.cells].map(td => td.textContent))")
        cells = b.evaluate("[...document.querySelectorAll('#releases-tiny tr.bucket')].map(tr => ({"
                           "release: tr.dataset.release, target: tr.dataset.target, gone: tr.classList.contains('gone'), "
                           "text: tr.textContent, figures: Object.fromEntries([...tr.querySelectorAll('td[data-field]')]"
                           ".map(td => [td.dataset.field, [td.dataset.value, td.textContent]]))}))")
        charts = b.evaluate("Object.fromEntries([...document.querySelectorAll('#registry-tiny figure')].map(f => [f.id, {"
                            "width: f.querySelector('svg').getBoundingClientRect().width, "
                            "lines: f.querySelectorAll('svg path').length, text: f.querySelector('svg').textContent}]))")
        empty = b.evaluate("[...document.querySelectorAll('#registry p.empty')].map(p => [p.id, p.textContent])")
        legend_overlap = b.evaluate(
            "(() => { const f = document.querySelector('#chart-latency-tiny svg'); const r = f.getBoundingClientRect();"
            " return [...f.querySelectorAll('text')].filter(t => t.textContent.includes('tiny/b')).map(t => {"
            " const q = t.getBoundingClientRect(); return q.right <= r.right + 1 && q.width > 0; }); })()")
    assert channels == [["dev", r2, "2"], ["staging", r1, "3"], ["prod", "(empty)", "—"]]
    assert last_move == ["promoted", "rolled back", "—"]
    action = {"promote": "promoted", "refuse": "refused", "rollback": "rolled back"}
    assert [(row[0], row[1], row[2], row[3]) for row in timeline] == [
        (e["time"], e["channel"], action[e["action"]], f"{e['from'] or '(empty)'} → {e['to']}") for e in tl]
    (refused_row,) = [row for row in timeline if row[2] == "refused"]
    (back_row,) = [row for row in timeline if row[2] == "rolled back"]
    assert refused_row[6] == "failed: channel_order" and back_row[7] == "p99 regression on canary"
    # every bucket row holds the JSON's numbers
    assert [(c["release"], c["target"]) for c in cells] == [
        (r, b["target"]) for r in (r1, r2) for b in rels[r]["buckets"]]
    for c in cells:
        (bj,) = [x for x in rels[c["release"]]["buckets"] if x["target"] == c["target"]]
        (bench,) = bj["bench"].values()
        assert bj["op_count"] > 0 and c["figures"]["op_count"] == [repr(bj["op_count"]), str(bj["op_count"])]
        assert c["figures"]["artifact_bytes"] == [repr(bj["artifact_bytes"]), f"{bj['artifact_bytes']:,}"]
        assert c["figures"]["compile_time_s"] == [repr(bj["compile_time_s"]), f"{bj['compile_time_s']:.2f}"]
        assert c["figures"]["p50_ms"] == [repr(bench["p50_ms"]), f"{bench['p50_ms']:.4g}"]
        assert c["figures"]["p99_ms"] == [repr(bench["p99_ms"]), f"{bench['p99_ms']:.4g}"]
        assert "cpu pass" in c["text"]
        assert c["gone"] == (not bj["in_matrix"]) and (("no longer in the matrix" in c["text"]) == c["gone"])
    assert [c["target"] for c in cells if c["gone"]] == ["tiny/b8/fp32/p1"]
    # the charts: drawn by matplotlib, one legend entry per target, b8 marked, legend inside the page
    assert set(charts) == {"chart-latency-tiny", "chart-ops-tiny"}
    for ch in charts.values():
        assert ch["width"] > 300 and ch["lines"] > 5
        assert "tiny/b1/fp32/p1" in ch["text"] and "tiny/b8/fp32/p1 (no longer in the matrix)" in ch["text"]
        assert r1[:10] in ch["text"] and r2[:10] in ch["text"]
    assert "latency (ms)" in charts["chart-latency-tiny"]["text"] and "op count" in charts["chart-ops-tiny"]["text"]
    assert legend_overlap and all(legend_overlap)
    # a model without releases is one line, not an empty chart
    assert ["", "no releases yet (`neuron-build release other`)"] in empty


def test_registry_charts_with_many_targets_and_none(tmp_path):
    """The legend of a chart with 40 targets spreads over columns beside the axes; a chart without a figure
    to draw is one line."""
    from neuron_build.evaluate.registry import render_registry

    rels = [{"id": f"r-{i:016x}", "dtype": "fp32", "profile": "p1", "backend": "inductor", "channels": [],
             "rolled_back": [], "gates": [],
             "buckets": [{"bucket_id": f"b{j}", "target": f"m/b{j}/fp32/p1", "key": "ab" * 32, "in_matrix": j < 30,
                          "op_count": 10 + j + i, "compile_time_s": 1.0, "artifact_bytes": 100,
                          "validation": {}, "bench": {}} for j in range(40)]} for i in range(3)]
    doc = {"models": [{"model": "m", "in_config": True, "channels": [], "timeline": [], "releases": rels}]}
    page = tmp_path / "many.html"
    page.write_text(f"<!DOCTYPE html><html><body>{render_registry(doc)}</body></html>")
    with Browser() as b:
        assert b.load(page)["errors"] == []
        ops = b.evaluate("(() => { const s = document.querySelector('#chart-ops-m svg'); const r = s.getBoundingClientRect();"
                         " const ts = [...s.querySelectorAll('text')].filter(t => t.textContent.startsWith('m/b'));"
                         " return {n: ts.length, xs: new Set(ts.map(t => Math.round(t.getBoundingClientRect().left))).size,"
                         " inside: ts.every(t => t.getBoundingClientRect().right <= r.right + 1),"
                         " bottom: Math.max(...ts.map(t => t.getBoundingClientRect().bottom)) <= r.bottom + 1}; })()")
        latency = b.evaluate("document.querySelector('#chart-latency-m').outerHTML")
    assert ops == {"n": 40, "xs": 3, "inside": True, "bottom": True}
    assert latency == ('<p class="empty" id="chart-latency-m">no benchmark recorded for m\'s releases '
                       '(run `neuron-build bench`)</p>')
