"""The JSON contract: every command with ``--json`` prints one document whose first field is ``schema``,
``neuron-build/<command>/v1``, and which validates against ``docs/schemas/<command>.json`` (JSON Schema,
draft 2020-12). One flow runs each of them on a tiny project, as a user does.

``NEURON_BUILD_WRITE_SAMPLES=DIR`` also writes each output to ``DIR/<command>.json`` (to see what a
schema has to describe when a field is added)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import jsonschema

from neuron_build.cli import parser
from neuron_build.traffic import TrafficRecorder
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import write_tiny_project

SCHEMAS = REPO / "docs" / "schemas"
#: commands whose --json this flow cannot run on a tiny torchscript project (their schema is still checked
#: to be a valid JSON Schema): warmup needs a compile-cache release; tests/compilers/test_compile_cache.py validates it
NOT_RUN_HERE = {"warmup"}


def json_commands() -> set[str]:
    """The commands of the CLI that take ``--json`` (``buckets suggest`` as ``buckets-suggest``), plus
    ``releases diff``, a positional form of ``releases``, and ``verify --fresh``, another report of ``verify``."""
    def walk(p: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[str]:
        out = []
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    out += walk(sp, (*prefix, name))
        if prefix and any("--json" in a.option_strings for a in p._actions):
            out.append("-".join(prefix))
        return out
    return {*walk(parser()), "releases-diff", "verify-fresh"}


def schema_of(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.json").read_text())


def test_every_json_command_has_a_schema_file_and_each_is_a_valid_json_schema():
    names = json_commands()
    assert {p.stem for p in SCHEMAS.glob("*.json")} == names
    for name in names:
        s = schema_of(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["properties"]["schema"] == {"const": f"neuron-build/{name}/v1"}, name
        assert "schema" in s["required"], name


def test_every_json_output_starts_with_its_schema_and_validates(tmp_path):
    root = tmp_path / "proj"
    cfg = write_tiny_project(root)
    cfg.write_text(cfg.read_text().replace("[build]\n", f'[build]\nremote = "file://{tmp_path}/shared"\n', 1))
    c = ("-c", str(cfg))
    samples = os.environ.get("NEURON_BUILD_WRITE_SAMPLES")
    seen: dict[str, dict] = {}

    def run(name: str, *args: str, ok: tuple[int, ...] = (0,), cwd: Path | None = None) -> dict:
        r = run_cli(*args, "--json", cwd=cwd)
        assert r.returncode in ok, f"{args}: {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        doc = json.loads(r.stdout)
        assert next(iter(doc)) == "schema" and doc["schema"] == f"neuron-build/{name}/v1", (name, doc.get("schema"))
        jsonschema.validate(doc, schema_of(name), cls=jsonschema.Draft202012Validator)
        if samples:
            Path(samples).mkdir(parents=True, exist_ok=True)
            (Path(samples) / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        seen[name] = doc
        return doc

    run("init", "init", str(tmp_path / "fresh"))
    p1 = ("tiny/b1/fp32/p1", "tiny/b4/fp32/p1")
    doc = run("build", "build", *c, *p1, "tiny/b1/fp32/p2", "tiny/b4/fp32/p2")
    assert [t["target"] for t in doc["targets"]] == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1", "tiny/b1/fp32/p2",
                                                     "tiny/b4/fp32/p2"]  # matrix order
    run("plan", "plan", *c)
    run("explain", "explain", *c, "tiny/b1/fp32/p1")
    run("ls", "ls", *c)
    run("show", "show", *c, "tiny/b1/fp32/p1")
    run("parse-log", "parse-log", str(REPO / "tests" / "fixtures" / "neuronx_logs" / "ncc_eoom001.log"))
    run("doctor", "doctor", *c)
    run("validate", "validate", *c, *p1)
    run("bench", "bench", *c, *p1, "--threads", "1", "--warmup", "1", "--iters", "3")
    r1 = run("release", "release", *c, "tiny", "--dtype", "fp32", "--profile", "p1")["id"]
    r2 = run("release", "release", *c, "tiny", "--dtype", "fp32", "--profile", "p2")["id"]
    run("promote", "promote", *c, "tiny", r1, "--to", "dev", "--allow-unvalidated", "--reason", "schema test")
    run("promote", "promote", *c, "tiny", r2, "--to", "dev", "--allow-unvalidated", "--reason", "schema test")
    run("rollback", "rollback", *c, "tiny", "--channel", "dev", "--reason", "schema test")
    run("channels", "channels", *c)
    run("history", "history", *c, "tiny", "--channel", "dev")
    run("releases", "releases", *c, "tiny")
    run("releases-diff", "releases", *c, "diff", r1, r2)
    run("pull", "pull", *c, "tiny", "--channel", "dev", "--dest", str(tmp_path / "serve"))
    run("verify", "verify", *c, ok=(0, 1))  # its verdict is not what this test checks (see the report)
    fresh = run("verify-fresh", "verify", *c, "--fresh", "tiny/*/fp32/p1")
    assert [(t["target"], t["verdict"]) for t in fresh["targets"]] == [(t, "fresh") for t in p1]
    run("gc", "gc", *c, "--dry-run")
    run("failures", "failures", *c)
    run("report", "report", *c)
    run("status", "status", *c)
    run("push", "push", *c)
    run("fetch", "fetch", *c)
    rec = TrafficRecorder("tiny", r1, ["batch"])
    for b in (1, 1, 2, 3, 4):
        rec.record({"batch": b}, None)
    traffic = rec.save(tmp_path / "traffic.jsonl")
    run("buckets-suggest", "buckets", "suggest", *c, "tiny", "--traffic", str(traffic), "--max-buckets", "1")
    assert set(seen) == json_commands() - NOT_RUN_HERE
