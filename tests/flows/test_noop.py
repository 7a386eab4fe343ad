"""The no-op path never imports torch (nor rich); doit works in parallel; plans name what changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import REPO, compiles_in_log, run_cli
from tests.helpers.projects import edit, write_tiny_project

PROBE = r'''
import sys
from doit.doit_cmd import DoitMain
from doit.cmd_base import DodoTaskLoader
rc = DoitMain(DodoTaskLoader()).run(sys.argv[1:])
print("TORCH", "torch" in sys.modules, rc, "rich" in sys.modules, file=sys.stderr)
'''


def probe(cwd: Path, *args: str) -> tuple[bool, int, str]:
    """Run doit with ``args`` in ``cwd``: (torch imported, exit status, stdout). It fails if rich was
    imported (the progress display loads it only when a compile starts)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True)
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("TORCH")][-1].split()
    assert line[3] == "False", f"doit {' '.join(args)} imported rich"
    return line[1] == "True", int(line[2]), p.stdout


def test_import_does_not_import_torch():
    code = ("import sys, neuron_build, neuron_build.tasks, neuron_build.cli, neuron_build.build.display; "
            "print('torch' in sys.modules, 'rich' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False False", out.stderr


def test_doit_list_and_noop_build_do_not_import_torch(tiny):
    (tiny.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    torch_loaded, rc, out = probe(tiny.parent, "list")
    assert (torch_loaded, rc) == (False, 0)
    assert [ln.split()[0] for ln in out.splitlines()] == ["build", "validate"]
    torch_loaded, rc, out = probe(tiny.parent, "list", "--all")
    assert "build:tiny/b1/fp32/p1" in out and "build:other/static/fp32/p1" in out

    r = subprocess.run([sys.executable, "-m", "doit", "-n", "2", "build"], cwd=tiny.parent,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count(".  build:") == 9
    assert len(compiles_in_log(tiny.parent / ".neuron-build")) == 9
    torch_loaded, rc, out = probe(tiny.parent, "build")
    assert (torch_loaded, rc) == (False, 0)
    assert out.count("-- build:") == 9 and ".  build:" not in out
    assert out.endswith("\n9 targets: 0 built, 9 cached, 0 failed\n")  # the summary, also of a no-op


def test_changed_bucket_named_in_plan(tiny):
    r = run_cli("build", "-c", str(tiny), "tiny/*/fp32/p1")
    assert r.returncode == 0, r.stderr
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 5] }")
    plan = {row["target"]: row for row in json.loads(run_cli("plan", "--json", "-c", str(tiny)).stdout)["targets"]}
    row = plan["tiny/b5/fp32/p1"]
    assert row["state"] == "missing"
    assert row["changed"] == ["inputs"]
    assert row["changed_detail"] == ["inputs: inputs"]
    assert row["compared_with"] == "tiny/b4/fp32/p1"
    assert plan["tiny/b1/fp32/p1"]["state"] == "cached"
    assert plan["tiny/b1/fp32/p1"]["changed"] == []


def test_doit_build_with_a_failed_target_exits_1(tmp_path):

    cfg = write_tiny_project(tmp_path / "p", extra='''
    [models.bad]
    factory = "tinylib.tiny:broken"
    dtypes = ["fp32"]
    profiles = ["p1"]
    inputs = [{ name = "x", shape = [2, 16] }]
    ''')
    text = cfg.read_text().replace('buckets = { batch = [1, 4] }', 'buckets = { batch = [1] }')
    text = text.replace('profiles = ["p1", "p2"]', 'profiles = ["p1"]')
    cfg.write_text(text.replace('dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]'))
    (cfg.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    r = subprocess.run([sys.executable, "-m", "doit", "build"], cwd=cfg.parent,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "bad/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose" in r.stdout + r.stderr
    assert r.stdout.count(".  build:") == 3  # the others were built all the same


def test_parallel_compiles_by_default():
    from neuron_build.build.jobs import default_jobs
    from neuron_build.tasks import DOIT_CONFIG

    GB = 10**9
    assert default_jobs(cpus=8, host_memory_bytes=64 * GB) == 8
    assert default_jobs(cpus=8, host_memory_bytes=16 * GB) == 3             # 12.8 GB usable / 4 GB a compile
    assert default_jobs(48 * GB, 16 * GB, cpus=8) == 3                      # [build] max_host_memory_gb = 48
    assert default_jobs(2 * GB, 16 * GB, cpus=8) == 1
    assert DOIT_CONFIG["num_process"] == default_jobs() and DOIT_CONFIG["par_type"] == "thread"


def test_a_changed_recorded_read_is_noticed_by_the_noop_path(tiny):
    """The key holds the declared inputs only; what the factory read lives in the manifest and is checked by
    every task, on the plan cache's no-op path too (torch-free): a changed data file compiles again."""
    root = tiny.parent
    (root / "dodo.py").write_text("from neuron_build.tasks import *\n")
    (root / "data").mkdir()
    (root / "data" / "scale.txt").write_text("2.0")
    (root / "tinylib" / "other.py").write_text(
        "import os\nimport torch\n\ndef build():\n"
        "    with open(os.path.join(os.path.dirname(__file__), '..', 'data', 'scale.txt')) as f:\n"
        "        float(f.read())\n"
        "    torch.manual_seed(1)\n    return torch.nn.Linear(16, 3)\n")
    target = "build:other/static/fp32/p1"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "doit", target], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(compiles_in_log(root / ".neuron-build")) == 1
    torch_loaded, rc, out = probe(root, target)
    assert (torch_loaded, rc) == (False, 0) and f"-- {target}" in out
    assert (root / ".neuron-build" / "plan-cache.json").is_file()  # the no-op came from the plan cache
    (root / "data" / "scale.txt").write_text("3.0")
    r = subprocess.run([sys.executable, "-m", "doit", target], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f".  {target}" in r.stdout and len(compiles_in_log(root / ".neuron-build")) == 2
    torch_loaded, rc, out = probe(root, target)
    assert (torch_loaded, rc) == (False, 0) and f"-- {target}" in out
