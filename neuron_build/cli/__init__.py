"""The ``neuron-build`` command.

User errors print one message and exit 2; build failures exit 1; no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from neuron_build.errors import BuildFailed, UserError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


def _builder(args):
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.log import configure

    project = load_project(args.config)
    configure(project.state_dir / "build.log", quiet=getattr(args, "json", False))
    return Builder(project)


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------------------------------
@command("build")
def cmd_build(args) -> int:
    """Compile the targets matching PATTERNs (default: all) through doit."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from neuron_build import tasks
    from neuron_build.project.matrix import select

    b = _builder(args)
    chosen = select(b.targets, args.patterns)
    before = {t.id: b.state(t) for t in chosen}
    b.keys.save()
    os.environ["NEURON_BUILD_CONFIG"] = str(b.project.path)
    tasks._builder = b
    doit_args = ["run", "--db-file", ":memory:"]  # see tasks.py: one db per process
    if args.jobs > 1:
        doit_args += ["-n", str(args.jobs), "-P", "thread"]  # (-n 1 would fork one runner process)
    doit_args += [f"build:{t.id}" for t in chosen] if args.patterns else ["build"]
    if args.no_retry_failed:
        doit_args.append("retry_failed=0")
    b.project.state_dir.mkdir(parents=True, exist_ok=True)
    tasks.OUTCOMES.clear()
    rc = DoitMain(ModuleTaskLoader(tasks)).run(doit_args)
    after = {t.id: b.state(t) for t in chosen}
    outs = tasks.OUTCOMES
    built = [t for t in chosen if after[t.id] == "cached" and before[t.id] != "cached"
             and (t.id not in outs or outs[t.id].compiled)]
    reused = [t for t in chosen if t.id in outs and outs[t.id].reason.startswith("reused")]
    failed = [t for t in chosen if after[t.id] != "cached"]
    n = len(chosen)
    print(f"\n{n} target{'s' if n != 1 else ''}: {len(built)} built, {n - len(built) - len(failed)} cached"
          + (f" ({len(reused)} built by another builder meanwhile)" if reused else "") + f", {len(failed)} failed")
    for t in failed:
        f = b.store.failure(t.id)
        o = outs.get(t.id)
        if o is not None and not o.ok:
            print(f"  FAILED {t.id}: {o.status}: {o.reason}")
        else:
            print(f"  FAILED {t.id}: {f.status if f else 'not built'}: {f.reason if f else ''}")
    if failed or rc not in (0,):
        raise BuildFailed(f"{len(failed)} target(s) failed")
    return 0


@command("plan")
def cmd_plan(args) -> int:
    """Every target with its key, state and what changed since its last build."""
    b = _builder(args)
    rows = []
    for t in b.targets:
        ki = b.key(t)
        state = b.state(t)
        changed, since = b.changed(t)
        row = {"target": t.id, "key": ki.key, "state": state,
               "changed": [c.split(":")[0] for c in changed], "changed_detail": changed}
        if since and since != t.id:
            row["compared_with"] = since
        if state == "failed":
            f = b.store.failure(t.id)
            row["failure"] = {k: getattr(f, k, None) for k in ("status", "reason", "attempts_total", "exit_code", "time")}
        rows.append(row)
    b.keys.save()
    if args.json:
        _print_json(rows)
        return 0
    width = max(len(r["target"]) for r in rows)
    for r in rows:
        why = "; ".join(r["changed_detail"]) if r["state"] != "cached" else ""
        if r.get("failure"):
            f = r["failure"]
            why = f"{f['status']}: {f['reason']} (failed {f.get('attempts_total') or 1}x, {f.get('time')}; retried by the next build)"
        if r.get("compared_with"):
            why += f" (vs {r['compared_with']})"
        print(f"{r['state']:8} {r['target']:{width}}  {r['key'][:12]}  {why}".rstrip())
    counts = {s: sum(r["state"] == s for r in rows) for s in ("cached", "missing", "failed")}
    print(f"{len(rows)} targets: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


@command("explain")
def cmd_explain(args) -> int:
    """The key components of a target and which changed since it was last built."""
    from neuron_build.project.keys import COMPONENTS

    b = _builder(args)
    t = b.by_id.get(args.target)
    if t is None:
        ids = [x.id for x in b.targets if x.model == args.target]
        if ids:
            raise UserError(f"'{args.target}' is a model; explain one of its targets: {', '.join(ids)}")
        raise UserError(f"unknown target '{args.target}'; see `neuron-build plan` for target ids")
    ki = b.key(t)
    rec = b.store.target(t.id)
    changed, since = b.changed(t)
    b.keys.save()
    print(f"target  {t.id}\nkey     {ki.key}\nstate   {b.state(t)}")
    if rec:
        print(f"last    {rec.key} ({rec.status}, {rec.time})")
    elif since:
        print(f"last    never built; compared with {since}")
    else:
        print("last    never built")
    old = rec.hashes if rec else {}
    for c in COMPONENTS:
        mark = "changed" if any(x.split(":")[0] == c for x in changed) else ""
        prev = f"  (was {old[c][:12]})" if mark and old.get(c) else ""
        print(f"  {c:10} {ki.hashes[c][:12]}  {mark}{prev}")
    for c in changed:
        print(f"  - {c}")
    return 0


@command("ls")
def cmd_ls(args) -> int:
    """The artifacts in the store."""
    b = _builder(args)
    rows = [{"target": m.target, "key": m.key, "status": m.metrics.status, "backend": m.backend,
             "compile_time_s": m.metrics.compile_time_s, "op_count": m.metrics.op_count,
             "artifact_bytes": m.metrics.artifact_bytes, "created": m.created} for m in b.store.manifests()]
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        print(f"{r['key'][:12]}  {r['target']:36} {r['backend']:11} {r['compile_time_s']:8.1f} s "
              f"{r['op_count'] or 0:6} ops {r['artifact_bytes'] / 2**20:9.1f} MiB  {r['created']}")
    print(f"{len(rows)} artifacts in {b.store.location}")
    return 0


@command("show")
def cmd_show(args) -> int:
    """The manifest of an artifact (by key, key prefix or target id), or the target's last failure."""
    b = _builder(args)
    ref = args.ref
    key, failure = None, None
    if ref in b.by_id:
        t = b.by_id[ref]
        key = b.key(t).key
        if not b.store.repair(key).hit:
            failure = b.store.failure(ref)
            if failure is None or failure.key != key:
                raise UserError(f"{ref} is not built for its current key {key[:12]}; run `neuron-build build {ref}`")
    else:
        if len(ref) < 6 or any(c not in "0123456789abcdef" for c in ref):
            raise UserError(f"'{ref}' is neither a target id nor a key (64 hex chars, or a prefix of 6 or more)")
        hits = b.store.find_keys(ref)
        if not hits:
            raise UserError(f"no artifact with key {ref} in {b.store.location}")
        if len(hits) > 1:
            raise UserError(f"key prefix {ref} is ambiguous: {', '.join(h[:16] for h in hits)}")
        key = hits[0]
    if failure is not None:
        if args.json:
            _print_json(failure.to_json())
        else:
            print(f"{failure.target}: {failure.status}: {failure.reason}\n"
                  f"log: {b.store.failure_log(failure.target)}")
        return 0
    m = b.store.repair(key).manifest
    if m is None:
        raise UserError(f"artifact {key[:12]} is incomplete or failed; `neuron-build build` rebuilds it")
    if args.json:
        _print_json(m.model_dump(mode="json"))
        return 0
    mt = m.metrics
    print(f"target   {m.target}\nkey      {m.key}\nbackend  {m.backend} ({m.hardware_target})\n"
          f"status   {mt.status}\ncompile  {mt.compile_time_s:.1f} s, peak {(mt.peak_rss_bytes or 0) / 2**20:.0f} MiB\n"
          f"ops      {mt.op_count} ({mt.op_count_source})\nbytes    {mt.artifact_bytes}\n"
          f"created  {m.created} on {m.host}")
    for name, f in m.files.items():
        print(f"  {name:20} {f.size:>12}  {f.sha256[:16]}")
    return 0


@command("parse-log")
def cmd_parse_log(args) -> int:
    """What neuron-build reads from a neuronx-cc log."""
    from neuron_build.cli.parse_log import parse_log_main

    p = Path(args.file)
    if p.is_dir():
        raise UserError(f"{args.file} is a folder; pass the path of a neuronx-cc log file")
    if not p.is_file():
        raise UserError(f"{args.file}: no such file; pass the path of a neuronx-cc log")
    try:
        with open(p, "rb") as f:
            head = f.read(8192)
    except OSError as e:
        raise UserError(f"{args.file}: cannot read it ({e.strerror})") from None
    bad = len(head) - len(head.decode("utf-8", "ignore").encode()) if head else 0
    if b"\0" in head or (head and bad > len(head) // 4):
        raise UserError(f"{args.file} is binary data, not a neuronx-cc log (a text file, e.g. log-neuron-cc.txt)")
    try:
        return parse_log_main(str(p), args.json)
    except OSError as e:  # unreadable: parse_log_main's message names the file
        raise UserError(str(e)) from None


#: Modules that add commands: each defines ``register(add)``, where ``add(name, help)`` returns an
#: argparse sub-parser, and decorates its handlers with :func:`command`. Keep them free of torch imports.
PLUGINS: tuple[str, ...] = (
    "neuron_build.cli.doctor",
    "neuron_build.cli.validate",
    "neuron_build.cli.bench",
    "neuron_build.cli.release",
    "neuron_build.cli.store",
)


# ---------------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 or more")
    return value


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", default=argparse.SUPPRESS, help="path of buckets.toml")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    p = argparse.ArgumentParser(prog="neuron-build", parents=[common],
                                description="Compile-artifact build system for AWS Neuron.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str):
        return sub.add_parser(name, parents=[common], help=help, description=help)

    s = add("build", "compile the targets that are not in the store")
    s.add_argument("-n", "--jobs", type=_positive_int, default=1, help="compiles to run at once")
    s.add_argument("--no-retry-failed", action="store_true",
                   help="skip targets whose current key failed last time (default: retry them)")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")
    s = add("plan", "list every target, its key and state, and what changed")
    s.add_argument("--json", action="store_true")
    s = add("explain", "show a target's key components and which changed since its last build")
    s.add_argument("target", metavar="TARGET")
    s = add("ls", "list the artifacts in the store")
    s.add_argument("--json", action="store_true")
    s = add("show", "show an artifact's manifest")
    s.add_argument("ref", metavar="KEY|TARGET")
    s.add_argument("--json", action="store_true")
    s = add("parse-log", "print what neuron-build extracts from a neuronx-cc log")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--json", action="store_true")
    import importlib
    for mod in PLUGINS:
        importlib.import_module(mod).register(add)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.config = getattr(args, "config", None) or os.environ.get("NEURON_BUILD_CONFIG") or None
    args.debug = getattr(args, "debug", False)
    try:
        return COMMANDS[args.command](args)
    except UserError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BuildFailed as e:
        if args.debug:
            raise
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

