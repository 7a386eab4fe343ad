"""Recorded inputs you can trust (issue 37): the worker records what the model's own code reads while it is
traced and compiled, not only while its factory runs; a file that changes between the read and the publish
makes the record incomplete (never a hit, one warning); what no recorder sees is declared
(``inputs_from``, ``env``) or escaped (``always_rebuild``), and ``plan``/``explain`` say why in one line
with the fix. Real torchscript compiles of tiny models, one per behaviour."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.status import BuildResult
from neuron_build.workspace import Workspace
from tests.helpers.projects import faults_of, manifest_file

HEAD = '[build]\nbackend = "torchscript"\ntimeout_s = 600\n\n[profiles.p1]\ncompiler_args = []\n'
PRELUDE = '''
import json
import os
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
'''
#: reads a variable and a data file while it is traced (after the factory returned)
TRACE = PRELUDE + '''

class M(torch.nn.Module):
    def forward(self, x):
        scale = float(os.environ["SCALE"])
        with open(os.path.join(ROOT, "data", "bias.json")) as f:
            bias = json.load(f)["bias"]
        return x * scale + bias


def build():
    return M()
'''
#: the factory reads w.txt; the trace then rewrites it, as a user's edit while the target compiles would
RACE = PRELUDE + '''
PATH = os.path.join(ROOT, "data", "w.txt")


class M(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, x):
        with open(PATH, "w") as f:
            f.write("2")
        return x * self.w


def build():
    with open(PATH) as f:
        return M(float(f.read()))
'''
PLAIN = PRELUDE + '''

def build():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4)
'''


def project(root: Path, source: str, options: str = "") -> Path:
    """A project of one model ``m`` (``mods/m.py`` holding ``source``), one fp32 target."""
    (root / "mods").mkdir(parents=True)
    (root / "mods" / "__init__.py").write_text("")
    (root / "mods" / "m.py").write_text(source)
    (root / "data").mkdir()
    cfg = root / "buckets.toml"
    cfg.write_text(HEAD + '\n[models.m]\nfactory = "mods.m:build"\ndtypes = ["fp32"]\nprofiles = ["p1"]\n'
                   'inputs = [{ name = "x", shape = [2, 4] }]\n' + options)
    return cfg


def state(cfg: Path) -> tuple[str, list[str]]:
    b = Builder(Workspace(load_project(cfg)))
    (t,) = b.ws.targets
    out = (str(b.ws.state(t)), b.ws.changed(t)[0])
    b.ws.keys.save()
    return out


def build_once(cfg: Path):
    b = Builder(Workspace(load_project(cfg)))
    (t,) = b.ws.targets
    out = b.build(t)
    b.ws.keys.save()
    assert out.ok, (out.status, out.reason)
    return b, t, out


def test_reads_while_the_model_is_traced_are_recorded(tmp_path, monkeypatch):
    """A variable and a file read by ``forward`` at trace time (the factory reads neither): changing either
    makes the target missing, instead of the old artifact staying ``cached``."""
    monkeypatch.setenv("SCALE", "2")
    cfg = project(tmp_path / "proj", TRACE)
    bias = cfg.parent / "data" / "bias.json"
    bias.write_text('{"bias": 1}')
    build_once(cfg)
    assert state(cfg) == ("cached", [])
    monkeypatch.setenv("SCALE", "3")  # the artifact computes x * 2 + 1
    assert state(cfg) == ("missing", ["recorded variable SCALE changed"])
    monkeypatch.setenv("SCALE", "2")
    assert state(cfg) == ("cached", [])
    bias.write_text('{"bias": 5}')
    assert state(cfg) == ("missing", ["recorded read data/bias.json changed"])


def test_the_graph_probe_records_reads_while_the_model_is_traced(tmp_path, monkeypatch):
    """A comment in the factory: the graph probe proves the graph unchanged and the target is reused; the
    reused artifact's record still holds the variable ``forward`` reads at trace time, so changing it
    later makes the target missing (a probe that recorded the factory call only would leave it cached)."""
    monkeypatch.setenv("SCALE", "2")
    cfg = project(tmp_path / "proj", TRACE)
    (cfg.parent / "data" / "bias.json").write_text('{"bias": 1}')
    build_once(cfg)
    src = cfg.parent / "mods" / "m.py"
    src.write_text(src.read_text() + "# a comment: the graph is unchanged\n")
    b, t, out = build_once(cfg)
    assert (out.compiled, out.reason.startswith("graph unchanged: reused")) == (False, True), out.reason
    recorded = json.loads(manifest_file(b.ws.store, b.ws.key(t).key).read_text())["recorded_inputs"]
    assert (recorded["env"], list(recorded["files"])) == ({"SCALE": "2"}, ["data/bias.json"])
    monkeypatch.setenv("SCALE", "3")
    assert state(cfg) == ("missing", ["recorded variable SCALE changed"])


def test_a_file_changed_while_the_target_compiles_is_never_a_hit(tmp_path, capfd):
    """The factory read ``w.txt`` = 1 (the artifact computes x * 1); it holds 2 by the time the artifact is
    published: the record is incomplete (warning naming the file), so the target is missing, not cached
    with the new content recorded against the old artifact."""
    from neuron_build.cli.inspect import format_explain, format_plan, plan_rows

    cfg = project(tmp_path / "proj", RACE)
    (cfg.parent / "data" / "w.txt").write_text("1")
    b, t, _ = build_once(cfg)
    err = capfd.readouterr()
    assert "data/w.txt changed while the target compiled: this artifact is rebuilt by the next build" \
        in err.out + err.err
    recorded = json.loads(manifest_file(b.ws.store, b.ws.key(t).key).read_text())["recorded_inputs"]
    assert recorded["incomplete"] == "data/w.txt changed while the target compiled"
    why = "its build's reads were not fully recorded (data/w.txt changed while the target compiled)"
    assert state(cfg) == ("missing", [why])
    b2 = Builder(Workspace(load_project(cfg)))
    assert format_plan(plan_rows(b2.ws)).splitlines()[0] == f"missing  {t.id}  {b2.ws.key(t).key[:12]}  {why}"
    assert format_explain(b2.ws, t).splitlines()[-1] == f"  - {why}"


def test_always_rebuild_is_never_cached(tmp_path):
    cfg = project(tmp_path / "proj", PLAIN, "always_rebuild = true\n")
    b, t, first = build_once(cfg)
    assert first.compiled
    recorded = json.loads(manifest_file(b.ws.store, b.ws.key(t).key).read_text())["recorded_inputs"]
    assert recorded["incomplete"] == "always_rebuild = true in [models.m]"
    why = "always_rebuild = true in [models.m]: never served from the cache"
    assert state(cfg) == ("missing", [why])
    from tests.helpers.cli import run_cli
    status = run_cli("status", "--json", "-c", str(cfg))
    rows = json.loads(status.stdout)["targets"]
    assert [(r["target"], r["here"], r.get("stale")) for r in rows] == [(t.id, False, [why])], status.stderr
    _, _, again = build_once(cfg)
    assert again.status != BuildResult.CACHED  # compiled again (or the same graph reused), never cached


def test_declared_inputs_and_variables_are_in_the_key(tmp_path, monkeypatch):
    """``inputs_from`` globs (under ``~``, in the project, matching nothing) key their files' content,
    ``env`` its variables' values; a model without them keeps its key. No compile."""
    home = tmp_path / "home"
    (home / ".cache" / "x").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("MY_VAR", raising=False)
    (home / ".cache" / "x" / "a.bin").write_bytes(b"a")
    cfg = project(tmp_path / "proj", PLAIN)
    (cfg.parent / "data" / "d.json").write_text("{}")
    plain = Workspace(load_project(cfg)).key(Workspace(load_project(cfg)).targets[0])
    cfg.write_text(cfg.read_text() + 'inputs_from = ["~/.cache/x/*.bin", "data/*.json", "none/*.x"]\n'
                                     'env = ["MY_VAR"]\n')

    def key():
        b = Builder(Workspace(load_project(cfg)))
        return b.ws.key(b.ws.targets[0])

    k0 = key()
    from neuron_build.util import sha256_hex
    assert k0.details["model"]["inputs_from"] == {"~/.cache/x/*.bin": {"a.bin": sha256_hex(b"a")},
                                                  "data/*.json": {"data/d.json": sha256_hex(b"{}")},
                                                  "none/*.x": {}}
    assert k0.details["env"]["MY_VAR"] is None
    assert {c: k0.hashes[c] == plain.hashes[c] for c in ("model", "env")} == {"model": False, "env": False}
    from neuron_build.project.keys import diff_components
    (home / ".cache" / "x" / "a.bin").write_bytes(b"A")
    assert diff_components(k0.details, key().details) == ["model: inputs_from.~/.cache/x/*.bin.a.bin"]
    (cfg.parent / "none").mkdir()
    (cfg.parent / "none" / "n.x").write_text("n")
    monkeypatch.setenv("MY_VAR", "1")
    k1 = key()
    assert diff_components(k0.details, k1.details) == [
        "model: inputs_from.none/*.x.none/n.x, inputs_from.~/.cache/x/*.bin.a.bin", "env: MY_VAR"]


def test_a_declared_input_invalidates_the_plan_cache(tmp_path, monkeypatch):
    """A no-op build's plan cache is not reused once a declared file, a new match of a declared glob or a
    declared variable changed (else the no-op would serve the old key)."""
    from neuron_build.build.doit.noop import save_plan
    from neuron_build.project import plan_cache

    monkeypatch.setenv("MY_VAR", "1")
    cfg = project(tmp_path / "proj", PLAIN, 'inputs_from = ["data/*.json"]\nenv = ["MY_VAR"]\n')
    (cfg.parent / "data" / "d.json").write_text("{}")
    past = 1_000_000_000
    for dirpath, _, files in os.walk(cfg.parent):
        for f in files:
            os.utime(os.path.join(dirpath, f), (past, past))
    p = load_project(cfg)

    def saved() -> tuple[object, str]:
        save_plan(Workspace(load_project(cfg)), plan_cache.interpreter())
        return plan_cache.load(p.state_dir, p.path, cfg.read_bytes())

    assert saved()[1] == "hit"
    monkeypatch.setenv("MY_VAR", "2")
    assert plan_cache.load(p.state_dir, p.path, cfg.read_bytes())[1] == "a key environment variable changed"
    assert saved()[1] == "hit"
    (cfg.parent / "data" / "e.json").write_text("{}")
    assert plan_cache.load(p.state_dir, p.path, cfg.read_bytes())[1] == "a sources glob matches other files"


def test_an_incomplete_record_says_why_with_the_fix(tmp_path):
    cfg = project(tmp_path / "proj", PLAIN)
    b = Builder(Workspace(load_project(cfg)))
    assert b.ws.keys.rebuild_reasons("m", {"incomplete": "a child process ran: sh -c true"}) == [
        "its build's reads were not fully recorded (a child process ran: sh -c true); declare the input with "
        "inputs_from = [...] or env = [...] in [models.m], or set always_rebuild = true"]


@pytest.mark.parametrize("option,fault", [
    ('inputs_from = "data/*.json"', "models.m.inputs_from: 'data/*.json' is not allowed; it must be a list"),
    ('inputs_from = ["data/*.json", "data/*.json"]', "models.m.inputs_from: lists data/*.json more than once"),
    ('env = ["1X"]', "models.m.env: '1X' is not an environment variable name (e.g. \"MY_VAR\")"),
    ("always_rebuild = 1", "models.m.always_rebuild: 1 is not allowed; it must be true or false"),
])
def test_declared_options_are_checked(tmp_path, option, fault):
    cfg = project(tmp_path / "proj", PLAIN, option + "\n")
    assert faults_of(cfg) == [fault]


def test_the_read_time_check_compares_digests_and_stat_signatures(tmp_path):
    """What the worker digested when it read (sha256, or the stat signature of a large file) against the
    file at publish; no digests (an older worker) checks nothing, a file it did not digest fails closed."""
    from neuron_build.project.declared import changed_since_read, stat_digest
    from neuron_build.util import sha256_hex

    (tmp_path / "a.bin").write_bytes(b"a")
    (tmp_path / "big.bin").write_bytes(b"b")
    now = {"a.bin": sha256_hex(b"a"), "big.bin": sha256_hex(b"b")}
    read = {"a.bin": sha256_hex(b"a"), "big.bin": stat_digest(tmp_path / "big.bin")}
    assert changed_since_read(now, read, tmp_path) == []
    assert changed_since_read(now, None, tmp_path) == []
    assert changed_since_read(now, {"a.bin": read["a.bin"]}, tmp_path) == ["big.bin"]
    os.utime(tmp_path / "big.bin", ns=(1, 1))
    assert changed_since_read(now, {**read, "a.bin": sha256_hex(b"old")}, tmp_path) == ["a.bin", "big.bin"]
