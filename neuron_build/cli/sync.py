"""``neuron-build push [--json]`` and ``neuron-build fetch [PATTERN...] [--json]``: copy between the local
store and ``[build] remote`` explicitly (after an offline build; before an offline deploy).
``neuron-build status [--remote] [--json]`` shows what such a copy would do (:mod:`neuron_build.store.remote_status`).

Both copy artifacts blob by blob with every sha256 verified, the manifest last, so an interrupted copy
leaves no half-artifact and the next one finishes it. Exit status 1 when something could not be copied.
"""

from __future__ import annotations

from neuron_build.cli.app import command, display_text, mib, open_project, open_workspace, print_json
from neuron_build.errors import ExitCode, UserError
from neuron_build.util import plural

__all__ = ["register", "cmd_push", "cmd_fetch", "format_status", "cmd_status"]


def register(add) -> None:
    """Add the ``push`` and ``fetch`` sub-commands."""
    s = add("push", "upload the local store's artifacts, records and releases to [build] remote")
    s.add_argument("--all", action="store_true",
                   help="every artifact in the local store (default: the current targets' artifacts)")
    s.add_argument("--json", action="store_true")
    s = add("fetch", "download the current targets' artifacts, the releases and channels from [build] remote")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")
    s.add_argument("--json", action="store_true")
    s = add("status", "what is built here, pending pushes; with --remote: what push and fetch would copy, "
                      "and channels whose local and remote pointers differ")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names (default: all)")
    s.add_argument("--remote", action="store_true", help="also compare with [build] remote (reads it; copies nothing)")
    s.add_argument("--json", action="store_true")


def _pair(args):
    """(builder, local store, remote store) of the project; a user error when no remote is configured."""
    ws = open_workspace(args)
    local, remote = ws.store.local_tier, ws.store.remote_tier
    if remote is None:
        raise UserError(f"{ws.project.path}: no [build] remote to copy to or from; add e.g. "
                        "remote = \"s3://bucket/prefix\" under [build]")
    return ws, local, remote


def _print(verb: str, rep, where: str) -> None:
    for key, reason in rep.failed:
        display_text(f"FAILED {key[:16]}: {reason}")
    for line in rep.disagree:
        display_text(f"REFUSED {line}")
    display_text(f"{verb} {plural(len(rep.copied), 'artifact')} ({plural(rep.blobs, 'blob')}, {mib(rep.bytes)}) "
                 f"{'to' if verb == 'pushed' else 'from'} {where}; {len(rep.present)} there already, "
                 f"{plural(rep.records, 'record')} copied, {len(rep.failed)} failed")


@command("push")
def cmd_push(args) -> int:
    """Upload what the remote lacks: artifacts (blobs first, manifests last), then records; progress on
    stderr (:mod:`neuron_build.cli.transfer`)."""
    from neuron_build.cli.transfer import TransferDisplay
    from neuron_build.store import layout
    from neuron_build.store.sync import copy_channels, copy_keys, copy_records

    ws, local, remote = _pair(args)
    keys = local.keys() if args.all else [ws.key(t).key for t in ws.targets]
    keys = [k for k in keys if local.lookup(k).hit]
    rep = copy_keys(local, remote, keys, progress=TransferDisplay("push"))
    copy_records(local, remote, rep.copied + rep.present, rep)
    copy_channels(local, remote, rep)  # the local channels a project had before its remote, with history
    for key in rep.copied + rep.present:  # a push that succeeds settles what earlier builds left pending
        local.delete_object(layout.pending_path(key))
    if args.json:
        print_json({"remote": remote.location, **rep.to_json()})
    else:
        _print("pushed", rep, remote.location)
    return ExitCode.FAILED if rep.failed or rep.disagree else ExitCode.OK


@command("fetch")
def cmd_fetch(args) -> int:
    """Download the chosen targets' artifacts (and every release and channel pointer) from the remote;
    progress on stderr (:mod:`neuron_build.cli.transfer`)."""
    from neuron_build.cli.transfer import TransferDisplay
    from neuron_build.project.matrix import select
    from neuron_build.store.sync import copy_channels, copy_keys, copy_records

    ws, local, remote = _pair(args)
    chosen = select(ws.targets, args.patterns)
    keys = [k for k in (ws.key(t).key for t in chosen) if remote.lookup(k).hit]
    missing = len(chosen) - len(keys)
    releases = list(remote.releases())
    for _model, _rid, record in releases:  # what the releases pin, so that an offline pull works
        for art in (record or {}).get("artifacts") or []:
            if isinstance(art, dict) and isinstance(art.get("key"), str):
                keys.append(art["key"])
    rep = copy_keys(remote, local, keys, progress=TransferDisplay("fetch"))
    copy_records(remote, local, rep.copied + rep.present, rep)
    copy_channels(remote, local, rep)  # the local copy of a channel follows the remote's, history first
    if args.json:
        print_json({"remote": remote.location, "not_on_remote": missing, **rep.to_json()})
    else:
        _print("fetched", rep, remote.location)
        if missing:
            display_text(f"{plural(missing, 'target')} not on the remote (build them with `neuron-build build`)")
    return ExitCode.FAILED if rep.failed or rep.disagree else ExitCode.OK


def _short(rows: list[dict]) -> str:
    return ", ".join(f"{r['target'] or '(no target)'} {r['key'][:12]}" for r in rows)


def format_status(doc: dict) -> str:
    """``status``'s document as text for people."""
    n = len(doc["targets"])
    lines = [f"{doc['local']}: {len(doc['built_here'])} of {plural(n, 'target')} built here"
             + (f"; missing here: {', '.join(doc['missing_here'])}" if doc["missing_here"] else "")]
    lines += [f"  {r['target']} is stale: {'; '.join(r['stale'])}" for r in doc["targets"] if r.get("stale")]
    if doc["pending_pushes"]:
        lines.append(f"pending pushes ({len(doc['pending_pushes'])}, retried by the next build or `neuron-build push`):")
        lines += [f"  {p['target'] or '(no target)'} {p['key'][:12]}: {p['reason'] or 'unknown reason'}"
                  for p in doc["pending_pushes"]]
    else:
        lines.append("no pending pushes")
    if "remote" not in doc:
        return "\n".join(lines)
    r = doc["remote"]
    lines.append(f"remote {r}:")
    if doc["not_pushed"]:
        lines.append(f"  not pushed: {plural(len(doc['not_pushed']), 'artifact')} ({_short(doc['not_pushed'])}); "
                     f"upload with `neuron-build push`")
    if doc["remote_only"]:
        lines.append(f"  on the remote, not here: {plural(len(doc['remote_only']), 'artifact')} "
                     f"({_short(doc['remote_only'])}); download with `neuron-build fetch`")
    rel = doc["releases"]
    if rel["not_pushed"]:
        lines.append(f"  releases only here: {', '.join(rel['not_pushed'])}")
    if rel["remote_only"]:
        lines.append(f"  releases only on the remote: {', '.join(rel['remote_only'])}")
    differ = [c for c in doc["channels"] if c["state"] != "same"]

    def ptr(p):
        return f"{p['release']} v{p['version']}" if p else "(none)"

    for c in differ:
        lines.append(f"  channel {c['model']}/{c['channel']} {c['state']}: here {ptr(c['local'])}, "
                     f"remote {ptr(c['remote'])}")
    if not (doc["not_pushed"] or doc["remote_only"] or rel["not_pushed"] or rel["remote_only"] or differ):
        lines.append("  in sync: nothing to push or fetch, every channel pointer the same")
    return "\n".join(lines)


@command("status")
def cmd_status(args) -> int:
    """What this host holds; with ``--remote`` against ``[build] remote``. Reads only; exit 0."""
    from neuron_build.project.matrix import select
    from neuron_build.store.remote_status import local_status, remote_status

    if args.remote:
        ws, local, remote = _pair(args)
    else:  # this host only: not one request to the remote
        from neuron_build.log import configure
        from neuron_build.store import open_store
        from neuron_build.workspace import Workspace

        project = open_project(args)
        configure(project.make_state_dir() / "build.log", quiet=args.json)
        local, remote = open_store(project.store_url()), None
        ws = Workspace(project, store=local)
    targets = {t.id: ws.key(t).key for t in select(ws.targets, args.patterns)}
    # recorded inputs changed since, an incomplete record (with its fix), or an always_rebuild model
    stale = lambda m: ws.keys.rebuild_reasons(str(m.target or "").split("/")[0], m.recorded_inputs)  # noqa: E731
    if remote is None:
        doc = local_status(local, targets, stale)
    else:
        try:
            doc = remote_status(local, remote, targets, stale)
        except UserError:
            raise
        except Exception as e:  # a store error, an OSError, botocore's: one line naming the URL
            text = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"remote store {remote.location} cannot be read ({text}); check [build] remote and "
                            f"the credentials, or run `neuron-build status` without --remote") from None
    if args.json:
        print_json(doc)
    else:
        display_text(format_status(doc))
    return ExitCode.OK
