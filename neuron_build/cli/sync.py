"""``neuron-build push [--json]`` and ``neuron-build fetch [PATTERN...] [--json]``: copy between the local
store and ``[build] remote`` explicitly (after an offline build; before an offline deploy).

Both copy artifacts blob by blob with every sha256 verified, the manifest last, so an interrupted copy
leaves no half-artifact and the next one finishes it. Exit status 1 when something could not be copied.
"""

from __future__ import annotations

from neuron_build.cli.app import command, mib, open_builder, plural, print_json
from neuron_build.errors import ExitCode, UserError


def register(add) -> None:
    """Add the ``push`` and ``fetch`` sub-commands."""
    s = add("push", "upload the local store's artifacts, records and releases to [build] remote")
    s.add_argument("--all", action="store_true",
                   help="every artifact in the local store (default: the current targets' artifacts)")
    s.add_argument("--json", action="store_true")
    s = add("fetch", "download the current targets' artifacts, the releases and channels from [build] remote")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")
    s.add_argument("--json", action="store_true")


def _pair(args):
    """(builder, local store, remote store) of the project; a user error when no remote is configured."""
    b = open_builder(args)
    local, remote = b.store.local_tier, b.store.remote_tier
    if remote is None:
        raise UserError(f"{b.project.path}: no [build] remote to copy to or from; add e.g. "
                        "remote = \"s3://bucket/prefix\" under [build]")
    return b, local, remote


def _print(verb: str, rep, where: str) -> None:
    for key, reason in rep.failed:
        print(f"FAILED {key[:16]}: {reason}")
    for line in rep.disagree:
        print(f"REFUSED {line}")
    print(f"{verb} {plural(len(rep.copied), 'artifact')} ({plural(rep.blobs, 'blob')}, {mib(rep.bytes)}) "
          f"{'to' if verb == 'pushed' else 'from'} {where}; {len(rep.present)} there already, "
          f"{plural(rep.records, 'record')} copied, {len(rep.failed)} failed")


@command("push")
def cmd_push(args) -> int:
    """Upload what the remote lacks: artifacts (blobs first, manifests last), then records."""
    from neuron_build.store.sync import copy_channels, copy_keys, copy_records

    b, local, remote = _pair(args)
    keys = local.keys() if args.all else [b.key(t).key for t in b.targets]
    keys = [k for k in keys if local.lookup(k).hit]
    rep = copy_keys(local, remote, keys)
    copy_records(local, remote, rep.copied + rep.present, rep)
    copy_channels(local, remote, rep)  # the local channels a project had before its remote, with history
    for key in rep.copied + rep.present:  # a push that succeeds settles what earlier builds left pending
        local.delete_object(f"pending-push/{key}")
    if args.json:
        print_json({"remote": remote.location, **rep.to_json()})
    else:
        _print("pushed", rep, remote.location)
    return ExitCode.FAILED if rep.failed or rep.disagree else ExitCode.OK


@command("fetch")
def cmd_fetch(args) -> int:
    """Download the chosen targets' artifacts (and every release and channel pointer) from the remote."""
    from neuron_build.project.matrix import select
    from neuron_build.store.sync import copy_channels, copy_keys, copy_records

    b, local, remote = _pair(args)
    chosen = select(b.targets, args.patterns)
    keys = [k for k in (b.key(t).key for t in chosen) if remote.lookup(k).hit]
    missing = len(chosen) - len(keys)
    releases = list(remote.releases())
    for _model, _rid, record in releases:  # what the releases pin, so that an offline pull works
        for art in (record or {}).get("artifacts") or []:
            if isinstance(art, dict) and isinstance(art.get("key"), str):
                keys.append(art["key"])
    rep = copy_keys(remote, local, keys)
    copy_records(remote, local, rep.copied + rep.present, rep)
    copy_channels(remote, local, rep)  # the local copy of a channel follows the remote's, history first
    if args.json:
        print_json({"remote": remote.location, "not_on_remote": missing, **rep.to_json()})
    else:
        _print("fetched", rep, remote.location)
        if missing:
            print(f"{plural(missing, 'target')} not on the remote (build them with `neuron-build build`)")
    return ExitCode.FAILED if rep.failed or rep.disagree else ExitCode.OK
