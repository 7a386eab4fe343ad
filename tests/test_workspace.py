"""The opened project (:class:`~neuron_build.workspace.Workspace`): its targets, keys and states against its store,
and the predictor the fleet makes once per workspace through its own factory."""

from __future__ import annotations

from neuron_build.project.config import load_project
from neuron_build.status import TargetState
from neuron_build.workspace import Workspace
from tests.helpers.projects import write_tiny_project


def test_a_workspace_plans_against_the_store_it_opened(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    ws = Workspace(load_project(cfg))
    assert [t.id for t in ws.targets] == list(ws.by_id) and "other/static/fp32/p1" in ws.by_id
    t = ws.by_id["other/static/fp32/p1"]
    assert ws.key(t) is ws.key(t) and len(ws.key(t).key) == 64  # computed once per workspace
    assert ws.state(t) == TargetState.MISSING and ws.location(t) is None
    assert ws.changed(t) == (["new target"], None)
    assert Workspace(load_project(cfg), store=ws.store).store is ws.store  # a Dask worker passes the shared one


def test_the_predictor_is_made_once_by_the_factory_given(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    ws = Workspace(load_project(cfg))
    calls = []

    def make(store, default_peak_bytes):
        calls.append((store, default_peak_bytes))
        return object()

    first = ws.predictor(make)
    assert ws.predictor(make) is first
    gb = float(ws.project.config.build.default_compile_memory_gb)
    assert calls == [(ws.store, int(gb * 1e9))]


def test_a_damaged_artifact_is_missing_and_said_damaged_in_plan_explain_and_show(tmp_path):
    """A truncated blob of the current key's artifact: ``plan`` and ``explain`` said ``missing`` with no reason
    (the last build was the same key) and ``show TARGET`` "not built"; each now names the file and the fix."""
    from neuron_build.cli.inspect import resolve_ref
    from neuron_build.errors import UserError
    from tests.helpers.store import publish

    cfg = write_tiny_project(tmp_path / "p")
    ws = Workspace(load_project(cfg))
    t = ws.by_id["other/static/fp32/p1"]
    key = ws.key(t).key
    publish(ws.store, key, {"model.pt": b"w" * 64}, target=t.id)
    assert Workspace(load_project(cfg)).state(t) == TargetState.CACHED
    blob = next(p for p in (ws.store.root / "cas").rglob("*") if p.is_file() and p.stat().st_size == 64)
    blob.chmod(0o644)
    blob.write_bytes(b"w" * 10)
    ws = Workspace(load_project(cfg))
    assert ws.state(t) == TargetState.MISSING
    (line,) = ws.stale(t)
    assert line.startswith("artifact damaged: model.pt: blob ") and "is 10 bytes, the manifest says 64" in line, line
    assert line.endswith("; a build makes it again")
    try:
        resolve_ref(ws, t.id)
    except UserError as e:
        assert str(e).startswith(f"{t.id}: the artifact of its current key {key[:12]} is damaged (model.pt: "), e
    else:
        raise AssertionError("show of a damaged artifact did not refuse")
    from neuron_build.store.remote_status import local_status

    (row,) = [r for r in local_status(ws.store, {t.id: key})["targets"]]
    assert not row["here"] and row["stale"] == [line], row  # status said "missing here", not why
