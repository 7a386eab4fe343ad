"""Release commands: ``release``, ``promote``, ``rollback``, ``channels``, ``history``, ``pull``.

No torch here; the domain logic is in :mod:`neuron_build.release`.
"""

from __future__ import annotations

from typing import get_args

from neuron_build.cli.app import (
    command,
    display_error,
    display_text,
    human_age,
    mib,
    open_project,
    open_project_store,
    open_workspace,
    print_json,
)
from neuron_build.errors import ExitCode, UserError
from neuron_build.project.config import Backend, DeviceKind
from neuron_build.runtime.pulled import RELEASE_FILE
from neuron_build.status import Verdict
from neuron_build.util import plural

#: ``--backend`` and ``--device-kind`` take what ``[build] backend`` and ``[release]`` device kinds take.
BACKENDS: tuple[str, ...] = get_args(Backend)
DEVICE_KINDS: tuple[str, ...] = get_args(DeviceKind)


def register(add) -> None:
    """Add the ``release``, ``promote``, ``rollback``, ``channels``, ``history`` and ``pull`` sub-commands."""
    s = add("release", "record an immutable release of a model's buckets for one dtype and profile")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--dtype", help="required when the model has several dtypes")
    s.add_argument("--profile", help="required when the model has several profiles")
    s.add_argument("--backend", choices=BACKENDS, help="release the keys of this backend (default: [build])")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print the release record")
    g.add_argument("-q", "--quiet", action="store_true", help="print only the release id")

    s = add("promote", "check the gates and move a channel to a release (compare-and-swap)")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("release", metavar="RELEASE", nargs="?", help="release id (or a unique prefix)")
    s.add_argument("--from", dest="from_channel", metavar="CHANNEL", help="promote the release this channel holds")
    s.add_argument("--to", required=True, metavar="CHANNEL")
    s.add_argument("--reason", default="", help="recorded in the channel's history; needed to waive a gate or to "
                   "promote a release that was rolled back")
    s.add_argument("--waive", action="append", default=[], metavar="GATE",
                   help="let this gate pass if it fails (needs --reason; recorded); repeatable")
    s.add_argument("--allow-unvalidated", action="store_true",
                   help="let the validation gate pass without validation results (needs --reason; recorded)")
    s.add_argument("--device-kind", choices=DEVICE_KINDS,
                   help="serving device kind for the gates (default: [release] in buckets.toml)")
    s.add_argument("--json", action="store_true")

    s = add("rollback", "move a channel back to the release it held before the current one")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--channel", required=True, metavar="CHANNEL")
    s.add_argument("--reason", default="")
    s.add_argument("--json", action="store_true")

    s = add("releases", "list a model's releases, the channels holding each, and which were rolled back; "
                        "`releases diff A B` compares two releases bucket by bucket")
    s.add_argument("model", metavar="MODEL", help="a model, or `diff` followed by two releases")
    s.add_argument("refs", nargs="*", metavar="A B",
                   help="with diff: two releases, each a release id (or a prefix of 8+ characters), "
                        "MODEL@CHANNEL or MODEL@RELEASE")
    s.add_argument("--json", action="store_true")

    s = add("channels", "show each channel's release and age")
    s.add_argument("model", metavar="MODEL", nargs="?")
    s.add_argument("--json", action="store_true")

    s = add("history", "show a channel's promotions, refusals and rollbacks")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--channel", required=True, metavar="CHANNEL")
    s.add_argument("--json", action="store_true")

    s = add("pull", "write the release a channel holds into a folder, checksums verified")
    s.add_argument("model", metavar="MODEL")
    s.add_argument("--channel", required=True, metavar="CHANNEL")
    s.add_argument("--dest", required=True, metavar="DIR")
    s.add_argument("--store", metavar="URL",
                   help="pull from this store (a folder or a URL such as s3://bucket/prefix) without a "
                        "project: no buckets.toml needed")
    s.add_argument("--json", action="store_true", help=f"print {RELEASE_FILE}")


@command("release")
def cmd_release(args) -> int:
    """Record a release and print its id (``--json``: the record)."""
    from neuron_build.release import create_release

    ws = open_workspace(args, backend=args.backend, quiet=True)
    rec = create_release(ws, args.model, args.dtype, args.profile).to_json()
    ws.keys.save()
    if args.json:
        print_json(rec)
    elif args.quiet:
        display_text(rec["id"])
    else:
        m = rec["metrics"]
        display_text(f"release {rec['id']}: {rec['model']} {rec['dtype']}/{rec['profile']} ({rec['backend']}, "
                     f"{rec['hardware_target']}), {len(rec['artifacts'])} bucket(s), created {rec['created']} by "
                     f"{rec['creator']}" + (f", git {rec['git_commit'][:12]}" if rec.get("git_commit") else ""))
        for a in rec["artifacts"]:
            am = m["artifacts"][a["target"]]
            val = ", ".join(f"{k} {v}" for k, v in am["validation"].items()) or "not validated"
            display_text(f"  {a['target']:32} {a['key'][:12]}  {am['op_count'] or 0:5} ops "
                         f"{am['compile_time_s']:7.1f} s  {val}")
    return ExitCode.OK


@command("promote")
def cmd_promote(args) -> int:
    """Promote a release into a channel; a refusal exits 3 with every gate's figures (``--json``: the
    refusal's history entry on stdout)."""
    from neuron_build.release import PromotionRefused, format_gates, promote, require_model

    project, store = open_project_store(args)
    require_model(project, args.model)
    try:
        entry = promote(store, project.config.release, args.model, args.to, release=args.release,
                        from_channel=args.from_channel, reason=args.reason, allow_unvalidated=args.allow_unvalidated,
                        device_kind=args.device_kind, waive=args.waive,
                        factory_root=project.root, fresh=fresh_checker(args)).to_json()
    except PromotionRefused as e:
        if not args.json:
            raise
        print_json({**e.entry, "verdict": Verdict.FAIL})
        display_error(str(e).splitlines()[0])
        return ExitCode.REFUSED
    if args.json:
        entry = {**entry, "verdict": Verdict.PASS}
        print_json(entry)
        return ExitCode.OK
    display_text(f"promoted {entry['to']} into {args.model}/{args.to} (version {entry['version']}; "
                 f"was {entry['from'] or 'empty'})")
    display_text(format_gates(entry["gates"]))
    return ExitCode.OK


def fresh_checker(args):
    """The ``fresh`` gate's check for ``promote`` (:data:`neuron_build.release.gates.FreshCheck`): the
    release's targets captured again from today's source (:func:`neuron_build.build.graph.fresh.fresh_check`,
    one probe per model build, with the release's backend) against the release's artifacts; a released
    target no longer in ``buckets.toml`` is ``unchecked``. Answers once per release (a promotion checks its
    gates again when its compare-and-swap loses a race)."""
    answers: dict[str, dict] = {}

    def check(release) -> dict:
        if release.id not in answers:
            from neuron_build.build.graph.fresh import fresh_check

            ws = open_workspace(args, backend=release.backend, quiet=True)
            given = {a.target: a.key for a in release.artifacts}
            rep = fresh_check(ws, [ws.by_id[t] for t in given if t in ws.by_id], given).to_json()
            gone = [t for t in given if t not in ws.by_id]
            rep["targets"] += [{"target": t, "verdict": "unchecked", "key": given[t], "component": None,
                                "reason": "no longer a target of buckets.toml: nothing to capture it from"}
                               for t in gone]
            answers[release.id] = {**rep, "clean": rep["clean"] and not gone}
        return answers[release.id]

    return check


@command("rollback")
def cmd_rollback(args) -> int:
    """Roll a channel back to its previous release."""
    from neuron_build.release import require_model, rollback

    project, store = open_project_store(args)
    require_model(project, args.model)
    entry = rollback(store, project.config.release, args.model, args.channel, reason=args.reason)
    if args.json:
        print_json(entry)
        return ExitCode.OK
    display_text(f"rolled {args.model}/{args.channel} back from {entry['from']} to {entry['to']} "
                 f"(version {entry['version']})")
    return ExitCode.OK


@command("channels")
def cmd_channels(args) -> int:
    """Each channel's release, version and age."""
    from neuron_build.release import channel_rows, require_model

    project, store = open_project_store(args)
    if args.model:
        require_model(project, args.model)
        models = [args.model]
    else:
        models = list(project.config.models)
    rows = channel_rows(store, project.config.release, models)
    rc = ExitCode.FAILED if any(r["corrupt"] for r in rows) else ExitCode.OK
    if args.json:
        print_json(rows, "channels")
        return rc
    for r in rows:
        if r["corrupt"]:
            display_text(f"{r['model']:16} {r['channel']:10} CORRUPT {r['corrupt']}")
            continue
        if not args.model and r["release"] is None:
            continue
        what = (f"{r['release']}  v{r['version']}  {r['dtype']}/{r['profile']}  {human_age(r['age_s'])} ago  "
                f"{r['action']} by {r['who']}" + ("  [rolled back before]" if r["rolled_back"] else "")
                if r["release"] else "-")
        display_text(f"{r['model']:16} {r['channel']:10} {what}")
    if not args.model and all(r["release"] is None and not r["corrupt"] for r in rows):
        display_text("no channel holds a release yet")
    return rc


def release_rows(store, settings, model: str) -> list[dict]:
    """One row per release of ``model``, oldest first: ``id``, ``dtype``, ``profile``, ``backend``,
    ``created``, ``age_s``, ``creator``, ``buckets``, ``channels`` (those holding it now), ``rolled_back``
    (``[{"channel", "time", "who", "reason"}]``: the rollbacks away from it)."""
    from neuron_build.release import channel_pointer, list_releases
    from neuron_build.release.channels import rollbacks_of
    from neuron_build.util import seconds_since

    holding: dict[str, list[str]] = {}
    for c in settings.channels:
        ptr = channel_pointer(store, model, c)
        if ptr:
            holding.setdefault(ptr["release"], []).append(c)
    return [{"id": r["id"], "dtype": r["dtype"], "profile": r["profile"], "backend": r["backend"],
             "created": r.get("created"), "age_s": seconds_since(r.get("created")), "creator": r.get("creator"),
             "buckets": len(r["artifacts"]), "channels": holding.get(r["id"], []),
             "rolled_back": rollbacks_of(store, settings, model, r["id"])} for r in list_releases(store, model)]


@command("releases")
def cmd_releases(args) -> int:
    """A model's releases, oldest first, with the channels that hold each and its rollbacks (or, as
    ``releases diff A B``, :func:`cmd_releases_diff`)."""
    from neuron_build.release import require_model

    if args.model == "diff" and (args.refs or "diff" not in open_project(args).config.models):
        return cmd_releases_diff(args)
    if args.refs:
        raise UserError(f"releases {args.model}: unexpected {' '.join(args.refs)}; list with `releases MODEL`, "
                        f"compare with `releases diff A B`")
    project, store = open_project_store(args)
    require_model(project, args.model)
    rows = release_rows(store, project.config.release, args.model)
    if args.json:
        print_json(rows, "releases")
        return ExitCode.OK
    for r in rows:
        mark = ""
        if r["rolled_back"]:
            rb = r["rolled_back"][-1]
            mark = f"  ROLLED BACK from {rb['channel']} {human_age(seconds_since_iso(rb['time']))} ago" + (
                f" (\"{rb['reason']}\")" if rb["reason"] else "")
        display_text(f"{r['id']}  {r['dtype']}/{r['profile']}  {r['backend']:11} {r['buckets']} bucket(s)  "
                     f"{human_age(r['age_s'])} ago by {r['creator']}  channels: {', '.join(r['channels']) or '-'}{mark}")
    if not rows:
        display_text(f"model '{args.model}' has no releases yet; make one with `neuron-build release {args.model}`")
    return ExitCode.OK


def cmd_releases_diff(args) -> int:
    """``releases diff A B [--json]``: two releases bucket by bucket (:mod:`neuron_build.release.diff`)."""
    from neuron_build.release.diff import diff_releases, format_diff, resolve_release

    if len(args.refs) != 2:
        raise UserError(f"releases diff needs two releases (got {len(args.refs)}): "
                        f"`neuron-build releases diff A B`, each a release id, a prefix or MODEL@CHANNEL")
    project, store = open_project_store(args)
    models = list(project.config.models)
    a, b = (resolve_release(store, ref, models) for ref in args.refs)
    doc = diff_releases(store, a, b, list(project.config.release.channels))
    if args.json:
        print_json(doc)
    else:
        display_text(format_diff(doc))
    return ExitCode.OK


def seconds_since_iso(iso: str | None) -> float | None:
    from neuron_build.util import seconds_since
    return seconds_since(iso)


@command("history")
def cmd_history(args) -> int:
    """A channel's history, oldest first."""
    from neuron_build.release import channel_history, check_channel, require_model

    project, store = open_project_store(args)
    require_model(project, args.model)
    check_channel(project.config.release, args.channel, "--channel")
    hist = channel_history(store, args.model, args.channel)
    if args.json:
        print_json(hist, "history")
        return ExitCode.OK
    for e in hist:
        line = (f"{e.get('time')}  {e.get('action'):8} {e.get('from') or '-'} -> {e.get('to')}  "
                f"v{e.get('version')}  {e.get('who')}")
        if e.get("reason"):
            line += f"  \"{e['reason']}\""
        if e.get("allow_unvalidated"):
            line += "  [--allow-unvalidated]"
        if e.get("waivers"):
            line += "  [waived: " + ", ".join(w["gate"] for w in e["waivers"]) + "]"
        display_text(line)
        if e.get("action") == "refuse":
            display_text("    " + e.get("refused", "").splitlines()[0])
            for g in e.get("gates", []):
                if not g["passed"]:
                    display_text(f"    FAIL {g['name']}: {g['message']}")
    if not hist:
        display_text(f"{args.model}/{args.channel} has no history yet")
    return ExitCode.OK


def given_store(location: str) -> str:
    """``--store LOCATION`` as given, once checked: a local path (or ``file://`` URL) must be a folder holding
    a store (one of the areas of :data:`neuron_build.store.layout.SHARED_AREAS`, or its ``store-id.json``).

    Raises:
        UserError: the path does not exist, is a file, or is a folder that holds no store (exit 2).
    """
    from pathlib import Path

    from neuron_build.store import is_url, layout

    if is_url(location) and not location.startswith("file://"):
        return location
    root = Path(location.removeprefix("file://"))
    if not root.exists():
        why = "no such folder"
    elif not root.is_dir():
        why = "a file, not a folder"
    elif not any((root / a).is_dir() for a in layout.SHARED_AREAS) and not (root / layout.STORE_ID_PATH).is_file():
        why = "the folder holds none of ac/, cas/, releases/, channels/"
    else:
        return location
    raise UserError(f"--store {location}: no store there ({why}); give the folder or URL of the store the "
                    f"releases were promoted in")


def typed_name(value: str, argument: str, kind: str) -> str:
    """``value`` when it is a model or channel name a user may type (the rule of ``buckets.toml``'s names,
    :data:`~neuron_build.project.config_terms.NAME`), else raise :class:`UserError` (exit 2) naming the argument:
    such a value names no record, and is refused before any store is read."""
    from neuron_build.project.config_terms import NAME, NAME_RULE, long_name_fault

    too_long = long_name_fault(kind, value)
    if too_long:
        raise UserError(f"{argument}: {too_long}")
    if not NAME.fullmatch(value):
        raise UserError(f"{argument}: {kind} name {value!r} {NAME_RULE}")
    return value


@command("pull")
def cmd_pull(args) -> int:
    """Materialise a channel's release in a folder for a serving host; progress on stderr
    (:mod:`neuron_build.cli.transfer`)."""
    from neuron_build.cli.transfer import TransferDisplay
    from neuron_build.release import pull, require_model

    typed_name(args.model, "MODEL", "model")
    typed_name(args.channel, "--channel", "channel")
    if args.store:  # a deploy host with only the URL: no project, any channel the store holds
        from neuron_build.errors import StoreNotOpened
        from neuron_build.store import open_store
        try:
            store, settings = open_store(given_store(args.store)), None
        except StoreNotOpened as e:
            raise e.labelled("--store") from e
    else:
        project, store = open_project_store(args)
        require_model(project, args.model)
        settings = project.config.release
    doc = pull(store, args.model, args.channel, args.dest, settings,
               warn=lambda line: display_error(line, prefix="warning"), progress=TransferDisplay("pull")).to_json()
    if args.json:
        print_json(doc)
        return ExitCode.OK
    files = {p: f for b in doc["buckets"] for p, f in b["files"].items()}  # a blob several buckets pin: once
    nfiles, size = len(files), sum(f["size"] for f in files.values())
    display_text(f"pulled {doc['release']} ({args.model}/{args.channel} v{doc['channel_version']}) into {args.dest}: "
                 f"{plural(len(doc['buckets']), 'bucket')}, {plural(nfiles, 'file')}, {mib(size)}, sha256 verified")
    return ExitCode.OK


__all__ = ["fresh_checker", "given_store", "register", "release_rows", "seconds_since_iso", "typed_name"]
