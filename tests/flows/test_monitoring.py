"""The ledger filled by real builds, through the CLI as a user runs it: ``failures``, ``report`` (text, JSON,
HTML rendered in headless chromium) and ``metrics`` (parsed as OpenMetrics), ``gc`` of the kept workdirs,
concurrent builders, and the Neuron failure stage under the toolchain double."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.env import neuron_env
from tests.helpers.chromium import Browser
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, write_tiny_project

MODELS = '''
[models.four]
factory = "tinylib.tiny:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 16] }]
buckets = { batch = [1, 2, 3, 4] }

[models.bad]
factory = "tinylib.tiny:broken"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 16] }]
'''
BAD = "bad/static/fp32/p1"


def cli(cfg: Path, *args: str, env: dict | None = None, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    r = run_cli(*args, "-c", str(cfg), env=env)
    assert r.returncode in ok, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def thresholds(cfg: Path) -> dict[str, dict]:
    rep = json.loads(cli(cfg, "report", "--json").stdout)
    assert rep["schema"] == "neuron-build/report/v1"
    return {t["name"]: t for t in rep["thresholds"]}


def test_report_metrics_failures_and_gc_after_real_builds(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj", extra=MODELS + "\n[monitoring]\nkeep_failed_workdirs = 1\n")
    cli(cfg, "build", "-n", "2", "four", "bad", ok=(1,))          # four buckets pass, bad fails
    for last in (5, 6, 7):                                         # change a bucket three times: 3 recompiles
        edit(cfg, f"batch = [1, 2, 3, {last - 1}]", f"batch = [1, 2, 3, {last}]")
        cli(cfg, "build", "four", *(["bad"] if last == 5 else []), ok=(0, 1))   # 3 cache hits each; bad fails again

    t = thresholds(cfg)
    assert [n for n in t] == ["compile_failure_rate", "compile_time_p95_s", "recompiles_per_hour",
                              "artifacts_per_model", "hbm_peak_fraction", "p99_latency_ratio", "neuroncore_utilisation"]
    assert {k: t["compile_failure_rate"][k] for k in ("value", "limit", "ok")} == {"value": round(2 / 9, 4),
                                                                                   "limit": 0.05, "ok": False}
    assert t["compile_failure_rate"]["figures"]["by_stage"] == {"model": 2}
    assert t["compile_failure_rate"]["action"].startswith("keep the compiler workdir")
    assert (t["recompiles_per_hour"]["value"], t["recompiles_per_hour"]["ok"]) == (3.0, False)
    assert t["recompiles_per_hour"]["figures"]["targets"] == {"four/b5/fp32/p1": 1, "four/b6/fp32/p1": 1,
                                                              "four/b7/fp32/p1": 1}
    assert t["recompiles_per_hour"]["figures"]["changed"] == {"inputs: inputs": 3}   # the shapes changed
    assert (t["artifacts_per_model"]["value"], t["artifacts_per_model"]["ok"]) == (4.0, False)
    assert t["artifacts_per_model"]["figures"]["per_model"] == {"four/fp32/p1/torchscript": 4}
    p95 = t["compile_time_p95_s"]
    assert p95["ok"] is True and 0 < p95["value"] < 400
    for name in ("hbm_peak_fraction", "p99_latency_ratio", "neuroncore_utilisation"):
        assert (t[name]["value"], t[name]["ok"], t[name]["verdict"]) == (None, None, "not measured here")
    rep = json.loads(cli(cfg, "report", "--json").stdout)
    assert (rep["compiles"], rep["failed"], rep["cached"]) == (9, 2, 9)
    rows = {r["target"]: r for r in rep["targets"]}
    assert rows["four/b7/fp32/p1"]["op_count"] > 0 and rows["four/b7/fp32/p1"]["artifact_bytes"] > 0
    assert rows["four/b1/fp32/p1"]["peak_rss_bytes"] > 0 and len(rows["four/b1/fp32/p1"]["builds"]) == 1
    assert rows["four/b1/fp32/p1"]["cache_hits"] == 3

    # the same figures against raised limits: every measured signal passes; a tiny p95 limit fails
    cfg.write_text(cfg.read_text().replace("keep_failed_workdirs = 1", "keep_failed_workdirs = 1\nmax_failure_rate = 0.3\n"
                                           "max_recompiles_per_hour = 3\nmax_artifacts_per_model = 4\n"
                                           "max_compile_time_p95_s = 0.5"))
    t2 = thresholds(cfg)
    for name in ("compile_failure_rate", "recompiles_per_hour", "artifacts_per_model"):
        assert (t2[name]["value"], t2[name]["ok"]) == (t[name]["value"], True)
    assert (t2["compile_time_p95_s"]["value"], t2["compile_time_p95_s"]["ok"]) == (p95["value"], False)
    text = cli(cfg, "report").stdout
    assert "compile_time_p95_s" in text and "ALERT" in text and "not measured here" in text

    # the kept failure workdirs: the last of bad's 2 failures, with its request and worker log
    fl = json.loads(cli(cfg, "failures", "--json").stdout)["failures"]
    assert [f["target"] for f in fl] == [BAD] and {f["failure_stage"] for f in fl} == {"model"}
    folder = Path(fl[-1]["folder"])
    assert "factory exploded on purpose" in (folder / "worker.log").read_text()
    assert json.loads((folder / "request.json").read_text())["target"] == BAD
    assert "stage model" in cli(cfg, "failures").stdout

    # metrics: OpenMetrics the Prometheus client parses, with the report's figures
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    out = cli(cfg, "metrics").stdout
    assert out.rstrip().endswith("# EOF")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(out) for s in f.samples}
    assert samples[("neuron_build_signal_value", (("signal", "compile_failure_rate"),))] == round(2 / 9, 4)
    assert samples[("neuron_build_signal_ok", (("signal", "compile_time_p95_s"),))] == 0
    assert samples[("neuron_build_compiles", (("status", "ERROR"),))] == 2
    assert samples[("neuron_build_cache_lookups", (("event", "cached"),))] == 9
    assert samples[("neuron_build_artifacts", (("backend", "torchscript"), ("dtype", "fp32"), ("model", "four"),
                                               ("profile", "p1")))] == 4
    assert samples[("neuron_build_kept_failure_workdirs", ())] == 1

    # the HTML page in headless chromium: four charts drawn, no script error, nothing fetched
    page = tmp_path / "report.html"
    cli(cfg, "report", "--html", str(page))
    with Browser() as b:
        got = b.load(page)
        assert got["errors"] == []
        assert got["requests"] == [page.resolve().as_uri()]
        charts = b.evaluate("Object.fromEntries([...document.querySelectorAll('figure')].map(f => [f.id, {"
                            "width: f.querySelector('svg').getBoundingClientRect().width, "
                            "paths: f.querySelectorAll('svg path').length, text: f.querySelector('svg').textContent}]))")
        rows = b.evaluate("document.querySelectorAll('#checklist tr').length")
        verdicts = b.evaluate("[...document.querySelectorAll('#checklist td:nth-child(4)')].map(td => td.textContent)")
    assert set(charts) == {"chart-compile-time", "chart-op-count", "chart-artifact-size", "chart-failures"}
    assert all(c["width"] > 300 and c["paths"] > 5 for c in charts.values()), charts
    assert "four/b7/fp32/p1" in charts["chart-compile-time"]["text"] and BAD in charts["chart-compile-time"]["text"]
    assert "four/b7/fp32/p1" in charts["chart-op-count"]["text"] and "op count" in charts["chart-op-count"]["text"]
    assert "artifact size (MiB)" in charts["chart-artifact-size"]["text"]
    assert "model" in charts["chart-failures"]["text"] and "failed compiles" in charts["chart-failures"]["text"]
    nm = "not measured here"
    assert rows == 8 and verdicts == ["ok", "ALERT", "ok", "ok", nm, nm, nm]   # the raised limits, p95's tiny one

    # bad is fixed and passes: gc removes its kept workdirs
    edit(cfg, 'factory = "tinylib.tiny:broken"', 'factory = "tinylib.tiny:build"')
    cli(cfg, "build", "bad")
    gc = json.loads(cli(cfg, "gc", "--json").stdout)
    assert sorted(r["path"] for r in gc["removed"] if r["kind"] == "failure-workdir") == sorted(
        f["path"] for f in fl)
    assert json.loads(cli(cfg, "failures", "--json").stdout)["failures"] == []


def test_concurrent_builders_lose_no_record(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    cmd = [sys.executable, "-m", "neuron_build.cli", "build", "-c", str(cfg), "other"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    from neuron_build.store import LocalStore, ledger

    recs = ledger.read(LocalStore(cfg.parent / "artifacts"))
    events = sorted(r.event for r in recs)
    assert len(recs) == 3 and events.count("compile") == 1, events   # one compiled, two reused or hit
    assert {r.target for r in recs} == {"other/static/fp32/p1"} and len({r.key for r in recs}) == 1
    comp = next(r for r in recs if r.event == "compile")
    assert comp.status == "PASS" and comp.compile_time_s > 0 and comp.peak_rss_bytes > 0 and comp.op_count > 0
    assert comp.changed == ("new target",) and comp.executor == "LocalExecutor" and comp.host


@pytest.fixture
def neuron_proj(tmp_path) -> Path:
    cfg = write_tiny_project(tmp_path / "proj")
    return edit(cfg, 'backend = "torchscript"', 'backend = "neuron"')


def test_neuron_failure_keeps_the_compiler_workdir_with_pass_and_code(neuron_proj, tmp_path):
    env = neuron_env(log_format="verbose", fail="xcg815", fail_times=1, counter=tmp_path / "count")
    cli(neuron_proj, "build", "other", env=env, ok=(1,))
    (f,) = json.loads(cli(neuron_proj, "failures", "--json", env=env).stdout)["failures"]
    assert (f["failure_stage"], f["compiler_pass"], f["diagnostic_code"]) == ("neuronx-cc", "OperatorFusion", "XCG815")
    assert f["reason"].startswith("XCG815: Estimated peak HBM usage (22.84) exceeds 16GB")
    folder = Path(f["folder"])
    assert "XCG815" in (folder / "neuron" / "log-neuron-cc.txt").read_text()
    assert (folder / "neuron" / "command.txt").read_text().startswith("neuronx-cc compile model")
    assert any(ln.startswith("op ") for ln in (folder / "neuron" / "model" / "graph.hlo").read_text().splitlines())
    assert {"request.json", "worker.log", "error.json"} <= set(f["files"])
    t = thresholds(neuron_proj)
    assert (t["hbm_peak_fraction"]["value"], t["hbm_peak_fraction"]["ok"]) == (round(22.84 / 16, 4), False)
    assert t["hbm_peak_fraction"]["figures"]["source"] == "compiler log estimate"
