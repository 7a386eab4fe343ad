"""Read-only commands: ``plan``, ``explain``, ``ls``, ``show``. They compile nothing and always exit 0
(2 for a user error: an unknown target, key or key prefix)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_build.cli.app import command, display_text, open_workspace, print_json
from neuron_build.errors import ExitCode, UserError
from neuron_build.status import TargetState
from neuron_build.util import plural

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace

__all__ = ["register", "plan_rows", "format_plan", "cmd_plan", "find_target", "format_explain", "explain_doc",
           "cmd_explain", "artifact_rows", "cmd_ls", "resolve_ref", "format_manifest", "cmd_show"]


def register(add) -> None:
    """Add the ``plan``, ``explain``, ``ls`` and ``show`` sub-commands."""
    s = add("plan", "list every target, its key and state, and what changed")
    s.add_argument("--json", action="store_true")
    s = add("explain", "show a target's key components and which changed since its last build")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("--json", action="store_true", help="per component: old and new value and hash")
    s = add("ls", "list the artifacts in the store")
    s.add_argument("--json", action="store_true")
    s = add("show", "show an artifact's manifest")
    s.add_argument("ref", metavar="KEY|TARGET")
    s.add_argument("--json", action="store_true")


# -- plan -----------------------------------------------------------------------------------------------
def plan_rows(ws: Workspace) -> list[dict[str, Any]]:
    """One row per target: ``{"target", "graph" (forward, prefill or decode), "key", "state", "changed": [component], "changed_detail": [line]}``,
    plus ``location`` for a cached target (``local``, or ``remote`` when only ``[build] remote`` holds it),
    ``compared_with`` (the target whose record the key was compared with, when not itself) and
    ``failure`` (for a failed target: status, reason, attempts_total, exit_code, time), and the predicted
    compile (:mod:`neuron_build.build.fleet.predict`): ``predicted_s`` (p50 seconds, null when nothing was ever
    recorded), ``predicted_peak_bytes`` (p90 peak memory, bytes) and ``predicted_from`` (key, target, bucket,
    prior or none)."""
    from neuron_build.build.fleet.predict import target_predictions

    rows = []
    predicted = target_predictions(ws, ws.targets)
    for t in ws.targets:
        ki = ws.key(t)
        state = ws.state(t)
        changed, since = ws.changed(t)
        row = {"target": t.id, "graph": t.graph_name, "key": ki.key, "state": state,
               "changed": [c.split(":")[0] for c in changed], "changed_detail": changed}
        p = predicted[t.id]
        row["predicted_s"] = None if p.seconds is None else round(p.seconds, 3)
        row["predicted_peak_bytes"] = p.peak_bytes
        row["predicted_from"] = p.source
        if state == TargetState.CACHED:
            row["location"] = ws.location(t) or "local"
        if since and since != t.id:
            row["compared_with"] = since
        if state == TargetState.FAILED:
            f = ws.store.failure(t.id)
            row["failure"] = {k: getattr(f, k, None) for k in ("status", "reason", "attempts_total", "exit_code", "time")}
        rows.append(row)
    return rows


def format_plan(rows: list[dict[str, Any]]) -> str:
    """The human-readable plan: one line per target, then the counts per state."""
    width = max(len(r["target"]) for r in rows)
    out = []
    for r in rows:
        why = "; ".join(r["changed_detail"]) if r["state"] != TargetState.CACHED else ""
        if r.get("failure"):
            f = r["failure"]
            why = f"{f['status']}: {f['reason']} (failed {f.get('attempts_total') or 1}x, {f.get('time')}; retried by the next build)"
        if r.get("compared_with"):
            why += f" (vs {r['compared_with']})"
        out.append(f"{r['state']:8} {r['target']:{width}}  {r['key'][:12]}  {why}".rstrip())
    counts = {s: sum(r["state"] == s for r in rows) for s in TargetState}
    out.append(f"{plural(len(rows), 'target')}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(out)


@command("plan")
def cmd_plan(args) -> int:
    """Every target with its key, state and what changed since its last build."""
    ws = open_workspace(args)
    rows = plan_rows(ws)
    ws.keys.save()
    if args.json:
        print_json(rows, "targets")
    else:
        display_text(format_plan(rows))
    return ExitCode.OK


# -- explain --------------------------------------------------------------------------------------------
def find_target(ws: Workspace, ref: str):
    """The target with id ``ref``. Raises UserError naming the model's targets, or pointing at ``plan``."""
    t = ws.by_id.get(ref)
    if t is None:
        ids = [x.id for x in ws.targets if x.model == ref]
        if ids:
            raise UserError(f"'{ref}' is a model; explain one of its targets: {', '.join(ids)}")
        raise UserError(f"unknown target '{ref}'; see `neuron-build plan` for target ids")
    return t


def format_explain(ws: Workspace, t) -> str:
    """A target's id, key, state, last build, and each key component's hash (marking those that changed)."""
    from neuron_build.project.keys import COMPONENTS

    ki = ws.key(t)
    rec = ws.store.target(t.id)
    changed, since = ws.changed(t)
    state = ws.state(t)
    out = [f"target  {t.id}\nkey     {ki.key}\nstate   {state}"]
    m = ws.store.manifest(ki.key) if state == TargetState.CACHED else None
    if m is not None and m.logs:
        out.append(f"logs    {ws.store.log_file(ki.key, 'worker.log').parent} ({', '.join(m.logs)})")
    if m is not None and getattr(m, "relinked_from", None):
        out.append(f"graph   weights changed, graph unchanged: relinked from {m.relinked_from} "
                   f"(graph key {m.graph_key})")
    elif m is not None and m.reused_from:
        out.append(f"graph   source changed, graph unchanged: reused {m.reused_from} (graph key {m.graph_key})")
    elif m is not None and m.graph_key:
        out.append(f"graph   compiled; graph key {m.graph_key}")
    if m is not None and (m.compiler or {}).get("weights_inline_why"):
        out.append(f"weights inline, not apart: {m.compiler['weights_inline_why']}")
    if rec:
        out.append(f"last    {rec.key} ({rec.status}, {rec.time})")
    elif since:
        out.append(f"last    never built; compared with {since}")
    else:
        out.append("last    never built")
    old = rec.hashes if rec else {}
    for c in COMPONENTS:
        mark = "changed" if any(x.split(":")[0] == c for x in changed) else ""
        prev = f"  (was {old[c][:12]})" if mark and old.get(c) else ""
        out.append(f"  {c:10} {ki.hashes[c][:12]}  {mark}{prev}".rstrip())
    out.extend(f"  - {c}" for c in changed)
    return "\n".join(out)


def explain_doc(ws: Workspace, t) -> dict[str, Any]:
    """``explain --json``: ``target``, ``key``, ``state``, ``last`` (``{"key", "status", "time"}`` of the
    last build, or None), ``compared_with`` (the target id the key was compared with), ``changed`` (one
    line per changed component and sub-key), and ``components``: one per key component, in key order,
    ``{"name", "changed", "old", "new", "old_hash", "new_hash"}`` (``old``: its value in the last build's
    key details, None when there is none), and ``graph``: ``{"graph_key", "reused_from", "summary"}`` of
    the cached artifact (None when it has no graph key)."""
    from neuron_build.project.keys import COMPONENTS

    ki = ws.key(t)
    rec = ws.store.target(t.id)
    changed, since = ws.changed(t)
    if rec is None and since and since != t.id:
        rec = ws.store.target(since)
    old_details = (rec.details or {}) if rec else {}
    old_hashes = rec.hashes if rec else {}
    comps = []
    for c in COMPONENTS:
        comps.append({"name": c, "changed": any(x.split(":")[0] == c for x in changed),
                      "old": old_details.get(c), "new": ki.details.get(c),
                      "old_hash": old_hashes.get(c), "new_hash": ki.hashes[c]})
    state = ws.state(t)
    m = ws.store.manifest(ki.key) if state == TargetState.CACHED else None
    graph = None
    if m is not None and (m.graph_key or m.reused_from):
        graph = {"graph_key": m.graph_key, "reused_from": m.reused_from,
                 "summary": (f"weights changed, graph unchanged: relinked from {m.relinked_from}"
                             if getattr(m, "relinked_from", None) else
                             f"source changed, graph unchanged: reused {m.reused_from}" if m.reused_from
                             else "compiled")}
    return {"target": t.id, "key": ki.key, "state": str(state),
            "last": {"key": rec.key, "status": str(rec.status), "time": rec.time} if rec else None,
            "compared_with": since, "changed": changed, "components": comps, "graph": graph}


@command("explain")
def cmd_explain(args) -> int:
    """The key components of a target and which changed since it was last built."""
    ws = open_workspace(args)
    t = find_target(ws, args.target)
    if args.json:
        doc = explain_doc(ws, t)
        ws.keys.save()
        print_json(doc)
        return ExitCode.OK
    text = format_explain(ws, t)
    ws.keys.save()
    display_text(text)
    return ExitCode.OK


# -- ls -------------------------------------------------------------------------------------------------
def artifact_rows(store) -> list[dict[str, Any]]:
    """One row per artifact in the store: target, key, status, backend, compile_time_s, op_count,
    artifact_bytes, created; by target, then oldest first (the store lists them by key)."""
    rows = [{"target": m.target, "key": m.key, "status": m.metrics.status, "backend": m.backend,
             "compile_time_s": m.metrics.compile_time_s, "op_count": m.metrics.op_count,
             "artifact_bytes": m.metrics.artifact_bytes, "created": m.created} for m in store.manifests()]
    return sorted(rows, key=lambda r: (r["target"], r["created"] or "", r["key"]))


@command("ls")
def cmd_ls(args) -> int:
    """The artifacts in the store."""
    ws = open_workspace(args)
    rows = artifact_rows(ws.store)
    if args.json:
        print_json(rows, "artifacts")
        return ExitCode.OK
    for r in rows:
        display_text(f"{r['key'][:12]}  {r['target']:36} {r['backend']:11} {r['compile_time_s']:8.1f} s "
                     f"{r['op_count'] or 0:6} ops {r['artifact_bytes'] / 2**20:9.1f} MiB  {r['created']}")
    display_text(f"{plural(len(rows), 'artifact')} in {ws.store.location}")
    return ExitCode.OK


# -- show -----------------------------------------------------------------------------------------------
def resolve_ref(ws: Workspace, ref: str):
    """``(key, failure)`` for a target id, a key or a key prefix: the key to show, or the target's failure
    record when its current key failed. Raises UserError for an unbuilt target, a malformed, unknown or
    ambiguous key."""
    if ref in ws.by_id:
        t = ws.by_id[ref]
        key = ws.key(t).key
        found = ws.store.lookup(key)
        if not found.hit:
            failure = ws.store.failure(ref)
            if (failure is None or failure.key != key) and found.damage is not None:
                raise UserError(f"{ref}: the artifact of its current key {key[:12]} is damaged ({found.damage}); "
                                f"run `neuron-build build {ref}` to make it again")
            if failure is None or failure.key != key:
                raise UserError(f"{ref} is not built for its current key {key[:12]}; run `neuron-build build {ref}`")
            return key, failure
        return key, None
    if len(ref) < 6 or any(c not in "0123456789abcdef" for c in ref):
        raise UserError(f"'{ref}' is neither a target id nor a key (64 hex chars, or a prefix of 6 or more)")
    hits = ws.store.find_keys(ref)
    if not hits:
        raise UserError(f"no artifact with key {ref} in {ws.store.location}")
    if len(hits) > 1:
        raise UserError(f"key prefix {ref} is ambiguous: {', '.join(h[:16] for h in hits)}")
    return hits[0], None


def format_manifest(m, log_dir=None) -> str:
    """The human-readable form of a manifest: target, key, backend, metrics (a relinked artifact's compile
    time is the compile's of the artifact it was relinked from, then a ``relinked from <key>`` line with the
    relink's seconds; a graph reuse's likewise, ``reused <key>``), then one line per file and one per build log (with the folder the logs are in,
    ``log_dir``, when given)."""
    mt = m.metrics
    head = (f"target   {m.target}\nkey      {m.key}\nbackend  {m.backend} ({m.hardware_target})\n"
            f"status   {mt.status}\ncompile  {mt.compile_time_s:.1f} s, peak {(mt.peak_rss_bytes or 0) / 2**20:.0f} MiB\n"
            f"ops      {mt.op_count} ({mt.op_count_source})\nbytes    {mt.artifact_bytes}\n"
            f"created  {m.created} on {m.host}")
    out = [head]
    if getattr(m, "relinked_from", None) or m.reused_from:  # (as explain says; the compile time above is the source's)
        relinked = getattr(m, "relinked_from", None)
        took = getattr(mt, "relink_time_s" if relinked else "reuse_time_s", None)
        out.append("graph    " + (f"weights changed, graph unchanged: relinked from {relinked}" if relinked else
                                  f"source changed, graph unchanged: reused {m.reused_from}")
                   + (f" in {took:.1f} s" if isinstance(took, (int, float)) else ""))
    out.extend(f"  {name:20} {f.size:>12}  {f.sha256[:16]}" for name, f in m.files.items())
    if m.logs:
        out.append("logs" + (f"     {log_dir}" if log_dir else ""))
        out.extend(f"  {name:20} {f.size:>12}" for name, f in m.logs.items())
    return "\n".join(out)


@command("show")
def cmd_show(args) -> int:
    """The manifest of an artifact (by key, key prefix or target id), or the target's last failure."""
    ws = open_workspace(args)
    key, failure = resolve_ref(ws, args.ref)
    if failure is not None:
        if args.json:
            print_json(failure.to_json())
        else:
            display_text(f"{failure.target}: {failure.status}: {failure.reason}\n"
                         f"log: {ws.store.failure_log(failure.target)}")
        return ExitCode.OK
    found = ws.store.lookup(key)
    m = found.manifest
    if m is None:
        why = f" ({found.damage})" if found.damage else ""
        raise UserError(f"artifact {key[:12]} is incomplete or damaged{why}; `neuron-build build` rebuilds it")
    if args.json:
        print_json(m.model_dump(mode="json"))
    else:
        log_dir = ws.store.log_file(key, "worker.log").parent
        display_text(format_manifest(m, log_dir))
    return ExitCode.OK

