"""The graph probe: proving a graph unchanged costs one worker per model build, not one per target.

On a first-level (source key) miss of a target whose model changed since its last build (or whose recorded
inputs did: ``BuildContext.changed`` / ``stale``; a new target or new shapes, flags or toolchain mean a new
graph, and its worker still asks the index), a target whose backend keys its graph before compiling
(:data:`~neuron_build.compilers.graph_key.BEFORE_COMPILE`) used to start its own compile worker just to learn
that its graph is in the graph index: a torch import, a model build and an export per target (~5 s each on
CPU). Before starting that worker, :func:`probe_hit` asks for the target's **probe result** instead: one
``python -m neuron_build.worker --graphs`` subprocess (:func:`neuron_build.worker.probe`) builds the model
once and computes the graph key and document digest of every target of the same model build whose first-level
key misses (one export or trace per target, nothing compiled), and the factory's reads and imported project
files once (every target of that build gets them: they are the same build). When the target's graph key is
in the index (its artifact complete), :func:`probe_hit` returns a :class:`ProbeHit`, and the builder hands it
by name to its graph reuse (``GraphReuse.reuse``: the candidate's manifest checked, the blobs linked, the new
key published), as it does the compile worker's own graph hit, without a compile worker. Otherwise (or when
the reuse finds the index entry stale) the target compiles as before (its worker makes its graph key again
and takes the graph key's lock).

A model build is one group: targets differing in anything the build or the backend sees (factory or hf
source, kwargs, dtype, backend, hardware target, task) never share one. Results are kept in the state folder
(``<state>/graph-probe/<first-level key>.json``), written and read under the group's file lock
(:mod:`filelock`), so threads and ``doit -n 2`` processes run one probe per group: the first asks for every
target of the group that misses, the others find their results. A result is used once (removed when its
target consumes it), only by the build that asked for it (each result is stamped with the Builder's
``build_id``, made once per Builder: its threads and the runner processes doit forks from it share it; a
result of any other build, such as one left by ``build 'm/b1/*'`` for targets it did not build, is ignored
and removed: the environment may have changed since), and only while the recorded inputs it carries are
unchanged. Each probe runs in a fresh temporary working folder, removed when it ends, as a compile worker
does (its own work folder): a factory's cwd-relative cache never carries a graph from one probe to the
next.

Fails closed: a probe that cannot be started, crashes, times out (``[build] timeout_s``) or cannot key a
target means the target compiles as before (one warning per probe). No-op builds never get here (a
first-level hit returns before any compile). ``NEURON_BUILD_GRAPH_PROBE=0`` turns the probe off (benchmarks:
the per-target workers of before).

Not for the Neuron backends: ``neuron``'s key is made inside ``torch_neuronx.trace`` (its ``generate_neff``
hook: the HLO lowering is the trace), ``torchneuron`` has none; their targets' workers key as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import BuildContext
from neuron_build.build.executor import compile_request
from neuron_build.build.graph.reuse import GraphHit
from neuron_build.compilers import graph_key
from neuron_build.compilers.base import CompileRequest
from neuron_build.store import graph_index
from neuron_build.util import canonical_json, write_json_atomic
from neuron_build.workspace import Workspace

#: Set to 0 (or false, no, off) to turn the probe off (each target's worker keys its own graph, as before).
PROBE_ENV = "NEURON_BUILD_GRAPH_PROBE"
#: The folder under the state folder holding the probe's results, requests, logs and locks.
PROBE_DIR = "graph-probe"
#: One line per probe run (time, group, targets, seconds, exit status): what the tests and benchmarks count.
PROBE_LOG = "probes.log"


def probe_on() -> bool:
    """Is the probe on (``NEURON_BUILD_GRAPH_PROBE`` is not 0, false, no or off)?"""
    return os.environ.get(PROBE_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def group_of(req: Any) -> str:
    """The model build a request belongs to (sha256 hex): what the worker builds the model from and the
    backend it runs (see the module docstring)."""
    return hashlib.sha256(canonical_json({
        "root": req.root, "factory": req.factory, "kwargs": req.kwargs, "dtype": req.dtype, "hf": req.hf,
        "backend": req.backend, "hardware_target": req.hardware_target, "task": (req.options or {}).get("task"),
        "never_read": req.never_read})).hexdigest()


@dataclass(frozen=True)
class ProbeHit(GraphHit):
    """The graph probe's answer for one target: its graph key is in the graph index with a complete artifact,
    so no compile worker starts. The builder hands it as it is (a :class:`~neuron_build.build.graph.reuse.GraphHit`)
    to ``GraphReuse.reuse``, which checks the index entry and the candidate's manifest (a stale entry: the
    target compiles); it is never classified as a worker's run.

    Attributes (those of :class:`~neuron_build.build.graph.reuse.GraphHit`, from the probe's result):
        graph_key: the target's graph key (sha256 hex) the probe made, in the index.
        graph_document: the sha256 hex of its canonical document (None: the probe reported none).
        imported: the project files the model's build imported in the probe (each target of the build gets
            them: project-relative POSIX paths, or outside names).
        reads: the factory's recorded reads in the probe (:class:`~neuron_build.worker.WorkerReads`), or None.
        seconds: the probe's wall time divided among the targets it keyed, seconds.
        log: the probe's log (its last 20,000 characters) and a line naming the graph key, UTF-8 bytes: the
            new artifact's ``worker.log``.
        peak_rss_bytes, exit_code: 0 (the probe's memory is not measured; no compile worker ran).
    """


def probe_hit(ws: Workspace, build: str, ctx: BuildContext, req: CompileRequest) -> ProbeHit | None:
    """The probe's graph hit of ``ctx``'s target, or None (start the compile worker).

    Args:
        ws: the opened project (its store, keys and targets).
        build: this build's id (the Builder's ``build_id``: a random id made once per Builder; see the module
            docstring): the probe results of this build are its own.
        ctx: the target's build context (target, first-level key, logger).
        req: the target's compile request, with the graph key option (absent: None, as for a backend
            outside :data:`~neuron_build.compilers.graph_key.BEFORE_COMPILE`, an option ``no_reuse`` or
            the probe turned off).

    Returns:
        A :class:`ProbeHit` when the probe's graph key of the target is in the index with a complete
        artifact; else None (no graph key option, external weights, nothing changed in the model, the
        probe failed or made no graph key, the key not in the index or its artifact incomplete).
    """
    opts = (req.options or {}).get(graph_key.OPTION)
    if not opts or opts.get("no_reuse") or req.backend not in graph_key.BEFORE_COMPILE or not probe_on():
        return None
    if not req.inline_weights_to_neff:  # external weights: the worker stages the new weights (build/graph/relink.py)
        return None
    if not (ctx.stale or any(c.split(":")[0] == "model" for c in ctx.changed)):
        return None  # a new target, or new shapes, flags or toolchain: its graph is new (its worker still asks)
    try:
        found = _result(ws, build, ctx, req)
    except Exception as e:  # fail closed: the target compiles in its own worker
        ctx.log.warning("graph probe failed; compiling", error=f"{type(e).__name__}: {e}"[:300])
        return None
    if found is None:
        return None
    result, log = found
    gk = result.get("graph_key")
    if not gk or not isinstance(gk, str):
        ctx.log.debug("graph probe: no graph key", reason=result.get("reason"))
        return None
    entry = graph_index.lookup(ws.store, gk)
    if entry is None or not ws.store.is_complete(entry.key):
        return None
    log = (log + f"graph probe: graph key {gk[:12]} is in the graph index: not compiling\n").encode()
    seconds = result.get("seconds")
    return ProbeHit.from_result(result, seconds if isinstance(seconds, (int, float)) else 0.0, log)


def _folder(ws: Workspace) -> Path:
    folder = ws.project.make_state_dir() / PROBE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _mine(build: str, path: Path) -> bool:
    """Does the result at ``path`` exist and belong to this build? A result of another build is removed."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if isinstance(raw, dict) and raw.get("build") and raw.get("build") == build:
        return True
    path.unlink(missing_ok=True)
    return False


def _take(ws: Workspace, build: str, path: Path, key: str) -> tuple[dict, str] | None:
    """The result for first-level key ``key`` at ``path`` when it is usable (removed: used once), else None.
    A result another build left (its ``build`` stamp is not this Builder's) is removed, never used."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("key") != key or not raw.get("build") \
            or raw.get("build") != build:
        path.unlink(missing_ok=True)
        return None
    if raw.get("graph_key") and ws.keys.stale_inputs(raw.get("recorded") or {}):
        path.unlink(missing_ok=True)  # the factory's reads changed since: probe again
        return None
    path.unlink(missing_ok=True)
    return raw, str(raw.get("log") or "")


def _result(ws: Workspace, build: str, ctx: BuildContext, req: CompileRequest) -> tuple[dict, str] | None:
    """The probe result of ``ctx``'s target: kept by an earlier probe of its group, else from a probe run now
    (under the group's lock) for every target of the group whose first-level key misses."""
    from filelock import FileLock, Timeout

    folder, key = _folder(ws), ctx.ki.key
    mine = folder / f"{key}.json"
    group = group_of(req)
    timeout = float(ws.project.config.build.timeout_s)
    try:
        with FileLock(str(folder / f"{group[:32]}.lock"), timeout=timeout):
            got = _take(ws, build, mine, key)
            if got is not None:
                return got
            _probe(ws, build, ctx, req, group, folder)
            return _take(ws, build, mine, key)
    except Timeout:
        ctx.log.warning("graph probe: another build held the model's probe lock too long; compiling")
        return None


def _requests(ws: Workspace, build: str, ctx: BuildContext, req: CompileRequest, group: str, folder: Path
              ) -> list[CompileRequest]:
    """The probe's requests: ``ctx``'s target first, then every other target of the same model build whose
    first-level key misses and that has no result kept. Their work folders are under the group's scratch
    folder (``work/<group>``), which the probe removes when it ends."""
    scratch = folder / "work" / group[:32]
    reqs = [req]
    for t in ws.targets:
        if t.model != ctx.target.model or t.id == ctx.target.id:
            continue
        ki = ws.key(t)
        if ws.store.is_complete(ki.key) or _mine(build, folder / f"{ki.key}.json"):
            continue
        other = compile_request(ws, t, ki, scratch / "out", scratch / ki.key[:16])
        other.options[graph_key.OPTION] = {"base": graph_key.base_of(ki.details)}
        if group_of(other) == group:
            reqs.append(other)
    out = []
    for r in reqs:
        r = type(r)(**{**r.to_json(), "out_dir": str(scratch / "out"), "work_dir": str(scratch / r.key[:16])})
        r.options[graph_key.OPTION] = {"base": r.options[graph_key.OPTION]["base"], "probe": True}
        Path(r.work_dir).mkdir(parents=True, exist_ok=True)
        out.append(r)
    return out


def run_probe(reqs: list[Any], folder: Path, name: str, timeout: float) -> tuple[dict, str, int | None, float]:
    """Run one ``python -m neuron_build.worker --graphs`` subprocess on ``reqs`` (one model build, each with
    the graph key option's ``probe`` set; their work folders exist) in a fresh temporary working folder
    (removed when it ends, as a compile worker's own work folder), with its request, results and log in
    ``folder`` under ``name``; killed (its process group) past ``timeout`` seconds.

    Returns:
        ``(results, log, exit status, seconds)``: the worker's results (``{"reads", "imported",
        "targets"}``, or ``{"error"}``; {} when it wrote none), the last 20,000 characters of its log, its
        exit status (None: timed out) and its wall time.
    """
    import tempfile

    from neuron_build.build.local import kill_group, spawn_worker

    spec, results, logf = folder / f"{name}.request.json", folder / f"{name}.result.json", folder / f"{name}.log"
    results.unlink(missing_ok=True)
    write_json_atomic(spec, {"requests": [r.to_json() for r in reqs], "results": str(results)})
    t0, status = time.monotonic(), None
    cwd = Path(tempfile.mkdtemp(prefix="neuron-build-probe-"))  # fresh per run: no state from an earlier probe
    try:
        with open(logf, "wb") as out:
            try:
                proc = spawn_worker(["--graphs", str(spec)], cwd, out)
            except OSError as e:  # fail closed: its targets are not keyed
                return {"error": f"the probe could not be started: {e}"}, "", None, time.monotonic() - t0
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
            except BaseException:
                kill_group(proc.pid)
                proc.wait()
                raise
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    seconds = time.monotonic() - t0
    try:
        raw = json.loads(results.read_text())
    except (OSError, ValueError):
        raw = {}
    return (raw if isinstance(raw, dict) else {}), logf.read_text(errors="replace")[-20000:], status, seconds


def _probe(ws: Workspace, build: str, ctx: BuildContext, req: CompileRequest, group: str, folder: Path) -> None:
    """Run one probe for ``ctx``'s target and the rest of its group; write one result per target, stamped
    with this build (a failure: a result without a graph key, so no other target of the group probes
    again in this build)."""
    shutil.rmtree(folder / "work" / group[:32], ignore_errors=True)
    reqs = _requests(ws, build, ctx, req, group, folder)
    ctx.log.info("graph probe", targets=len(reqs))
    try:
        raw, log, status, seconds = run_probe(reqs, folder, group[:32], float(ws.project.config.build.timeout_s))
    finally:
        shutil.rmtree(folder / "work" / group[:32], ignore_errors=True)
    with open(folder / PROBE_LOG, "a") as f:
        f.write(f"{time.time():.3f} {group[:12]} {ctx.target.model} targets={len(reqs)} seconds={seconds:.2f} "
                f"exit={status}\n")
    why = raw.get("error") or ("" if raw.get("targets") else
                               f"the probe {'timed out' if status is None else f'exited with status {status}'}")
    if why:
        ctx.log.warning("graph probe failed; its targets compile", reason=why, log=str(folder / f"{group[:32]}.log"))
    per = seconds / len(reqs)
    targets = raw.get("targets") or {}
    imported, reads = raw.get("imported") or [], raw.get("reads")
    recorded = ws.keys.recorded_inputs(ctx.target.model, imported, reads) if targets else {}
    for r in reqs:
        got = targets.get(r.key) if isinstance(targets.get(r.key), dict) else {}
        write_json_atomic(folder / f"{r.key}.json", {
            "key": r.key, "target": r.target, "build": build, "graph_key": got.get("graph_key"),
            "graph_document": got.get("graph_document"), "reason": got.get("reason") or why or None,
            "imported": imported, "reads": reads, "recorded": recorded, "seconds": round(per, 3), "log": log})


__all__ = ["PROBE_DIR", "PROBE_ENV", "PROBE_LOG", "ProbeHit", "group_of", "probe_hit", "probe_on", "run_probe"]
