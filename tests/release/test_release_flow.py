"""The release flow through the CLI, end to end: release, promote, rollback, history and pull."""

from __future__ import annotations

import json

from neuron_build.project.config import load_project
from neuron_build.release import (
    load_release,
)
from neuron_build.store.local import LocalStore
from tests.helpers.cli import run_cli
from tests.helpers.releases import ACTOR, validate_all


def test_cli_release_flow_and_history(proj, tmp_path):
    c = ["-c", str(proj)]
    r = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q", *c)
    assert r.returncode == 0, r.stderr
    r1 = r.stdout.strip()
    r2 = run_cli("release", "tiny", "--dtype", "bf16", "--profile", "p1", "-q", *c).stdout.strip()
    assert r1.startswith("r-") and r2.startswith("r-") and r1 != r2
    rec = json.loads(run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "--json", *c).stdout)
    assert rec["id"] == r1

    r = run_cli("promote", "tiny", r1, "--to", "dev", *c)
    assert r.returncode == 3 and "FAIL validated: not validated on cpu" in r.stderr and "Traceback" not in r.stderr
    assert "validate on cpu with `neuron-build validate tiny`, or pass --allow-unvalidated --reason TEXT" in r.stderr
    r = run_cli("promote", "tiny", r1, "--to", "dev", "--allow-unvalidated", *c)
    assert r.returncode == 2 and "--allow-unvalidated needs --reason TEXT" in r.stderr
    store = LocalStore(load_project(proj).store_url())
    for rid in (r1, r2):
        validate_all(store, load_release(store, "tiny", rid))
    r = run_cli("promote", "tiny", r1, "--to", "dev", "--reason", "first cut", *c)
    assert r.returncode == 0, r.stderr
    assert f"promoted {r1} into tiny/dev (version 1; was empty)" in r.stdout
    assert "PASS validated: 2 artifact(s) passed validation on cpu" in r.stdout
    assert run_cli("promote", "tiny", "--from", "dev", "--to", "staging", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c).returncode == 0
    # bf16 follows the same way
    assert run_cli("promote", "tiny", r2, "--to", "dev", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "dev", "--to", "staging", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c).returncode == 0

    doc = json.loads(run_cli("channels", "tiny", "--json", *c).stdout)
    assert doc["schema"] == "neuron-build/channels/v1"
    rows = doc["channels"]
    assert all(isinstance(x["age_s"], float) and 0 <= x["age_s"] < 600 for x in rows)
    assert [(x["channel"], x["release"], x["version"], x["dtype"]) for x in rows] == [
        ("dev", r2, 2, "bf16"), ("staging", r2, 2, "bf16"), ("prod", r2, 2, "bf16")]
    text = run_cli("channels", *c).stdout
    assert f"tiny             prod       {r2}  v2  bf16/p1" in text

    r = run_cli("rollback", "tiny", "--channel", "prod", "--reason", "regression", *c)
    assert r.returncode == 0 and f"rolled tiny/prod back from {r2} to {r1} (version 3)" in r.stdout
    dest = tmp_path / "prod"
    r = run_cli("pull", "tiny", "--channel", "prod", "--dest", str(dest), *c)
    assert r.returncode == 0, r.stderr
    assert json.loads((dest / "release.json").read_text())["release"] == r1
    from neuron_build.runtime import warmup  # a release of compiled models warms up too: nothing compiles

    rep = warmup(dest)
    assert (rep["backend"], rep["zero_compiles"], rep["compiles_total"]) == ("torchscript", True, 0)
    assert [b["compiles"] for b in rep["buckets"]] == [0] * len(rep["buckets"]) and rep["buckets"]

    hist = json.loads(run_cli("history", "tiny", "--channel", "prod", "--json", *c).stdout)["history"]
    assert [(h["action"], h["from"], h["to"], h["who"]) for h in hist] == [
        ("promote", None, r1, ACTOR), ("promote", r1, r2, ACTOR), ("rollback", r2, r1, ACTOR)]
    assert hist[0]["source"] == {"channel": "staging", "version": 1}
    dev = json.loads(run_cli("history", "tiny", "--channel", "dev", "--json", *c).stdout)["history"]
    assert [h["action"] for h in dev] == ["refuse", "promote", "promote"]
    assert dev[1]["reason"] == "first cut" and dev[0]["gates"][1]["passed"] is False
    text = run_cli("history", "tiny", "--channel", "dev", *c).stdout
    assert "refuse   - -> " + r1 in text and "FAIL validated: not validated on cpu" in text
    assert store.channel("tiny", "prod")["release"] == r1

    r = run_cli("rollback", "tiny", "--channel", "nope", *c)
    assert r.returncode == 2 and "unknown channel 'nope' (--channel)" in r.stderr

    # the rolled-back release is marked, and promoting it again needs a reason
    rels = json.loads(run_cli("releases", "tiny", "--json", *c).stdout)
    assert rels["schema"] == "neuron-build/releases/v1"
    by_id = {x["id"]: x for x in rels["releases"]}
    assert by_id[r2]["channels"] == ["dev", "staging"] and by_id[r1]["channels"] == ["prod"]
    assert [(x["channel"], x["reason"]) for x in by_id[r2]["rolled_back"]] == [("prod", "regression")]
    assert by_id[r1]["rolled_back"] == []
    text = run_cli("releases", "tiny", *c).stdout
    assert f'{r2}  bf16/p1' in text and 'ROLLED BACK from prod' in text and '("regression")' in text
    r = run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c)
    assert r.returncode == 3
    assert (f"release {r2} was rolled back from tiny/prod at " in r.stderr
            and "; promoting it again needs --reason TEXT (recorded in the history)" in r.stderr)
    r = run_cli("promote", "tiny", "--from", "staging", "--to", "prod", "--reason", "fixed upstream", "--json", *c)
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)
    assert e["verdict"] == "pass" and e["rolled_back"][0]["channel"] == "prod" and e["reason"] == "fixed upstream"

