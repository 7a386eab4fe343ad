"""``neuron-build failures [--json]``, ``neuron-build report [--since 24h] [--json] [--html FILE]`` and
``neuron-build metrics [--since 24h] [--output FILE]``: the build ledger and the kept failure workdirs."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from neuron_build.cli.app import (
    command,
    display_note,
    display_text,
    mib,
    open_project_store,
    print_json,
    schema_id,
)
from neuron_build.errors import ExitCode, UserError
from neuron_build.util import plural

#: The version of ``failures --json``.
FAILURES_SCHEMA = "neuron-build/failures/v1"


def register(add) -> None:
    """Add the ``failures``, ``report`` and ``metrics`` sub-commands."""
    s = add("failures", "list the kept workdirs of failed compiles, with their failure stage")
    s.add_argument("target", nargs="?", help="only this target id")
    s.add_argument("--json", action="store_true")
    for name, help in (("report", "the compile monitoring checklist over the build ledger"),
                       ("metrics", "the report's figures as OpenMetrics text (Prometheus)")):
        s = add(name, help)
        s.add_argument("--since", default="24h", metavar="WINDOW",
                       help="only ledger records this recent: 24h (default), 90m, 7d, or 'all'")
        if name == "report":
            s.add_argument("--json", action="store_true")
            s.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with charts")
            s.add_argument("--traffic", nargs="+", metavar="TRAFFIC",
                           help="with --html: serving traffic files (BucketedModel.save_traffic); the page shows "
                                "the padding per bucket and the suggested buckets")
        else:
            s.add_argument("--output", "-o", metavar="FILE",
                           help="write to FILE (atomically, for a textfile collector) instead of stdout")


def _report(args):
    """(report, window seconds) for the project of ``args`` over ``--since``."""
    from neuron_build.evaluate.monitoring import evaluate
    from neuron_build.store import failures, ledger

    project, store = open_project_store(args)
    now = _dt.datetime.now(_dt.timezone.utc)
    since = None
    window_s = 0.0
    if args.since != "all":
        try:
            delta = ledger.parse_window(args.since)
        except ValueError as e:
            raise UserError(str(e)) from None
        since, window_s = now - delta, delta.total_seconds()
    skipped: list[str] = []
    records = ledger.read(store, since=since, skipped=skipped)
    from neuron_build.project.matrix import expand

    current = {t.id for t in expand(project)}
    rep = evaluate(records, project.config.monitoring, store=store, since=since, until=now, current=current)
    rep.location = store.location
    rep.unreadable_records = skipped
    rep.kept_failures = [e.to_json() for e in failures.kept(store)]
    return rep, window_s


@command("report")
def cmd_report(args) -> int:
    """Print the checklist (text or ``--json``); ``--html FILE`` also writes the page. Exit 0 (alerts are
    figures, not a failed command)."""
    from neuron_build.evaluate.monitoring import format_text

    if args.traffic and not args.html:
        raise UserError("--traffic adds a section to the HTML page; give --html FILE too")
    rep, _ = _report(args)
    registry = _registry(args)
    if args.html:
        try:
            from neuron_build.evaluate.report_html import render_html
            page = render_html(rep, _traffic_sections(args), registry)
        except ImportError as e:
            raise UserError(f"--html needs matplotlib ({e}); install it with pip install 'neuron-build[report]'") from None
        out = Path(args.html)
        _write_output(out, page.encode(), "--html")
        display_note(f"wrote {out} ({mib(len(page.encode()))}, self-contained)")
    skipped = rep.unreadable_records
    if args.json:
        print_json({**rep.to_json(), "schema": schema_id("report"), "registry": registry,
                    "unreadable_records": skipped})
    else:
        display_text(format_text(rep))
        if skipped:
            display_text(f"{plural(len(skipped), 'unreadable ledger record')} skipped: {', '.join(skipped)}; "
                         f"`neuron-build verify` reports them with the fix (the build that wrote them is not counted)")
    return ExitCode.OK


def _traffic_sections(args) -> list[str]:
    """The report page's traffic section for ``--traffic FILE...`` (none without)."""
    if not args.traffic:
        return []
    from neuron_build.cli.app import open_project
    from neuron_build.evaluate.traffic_html import traffic_section
    from neuron_build.traffic import load_traffic

    return [traffic_section(open_project(args), load_traffic(args.traffic))]


def _registry(args) -> dict:
    """The registry of the project's models (:func:`neuron_build.release.registry.registry_doc`)."""
    from neuron_build.project.matrix import expand
    from neuron_build.release.registry import registry_doc

    project, store = open_project_store(args)
    return registry_doc(store, project.config.release, project.config.models, (t.id for t in expand(project)))


def _write_output(out: Path, data: bytes, option: str) -> None:
    """Write a command's output file atomically; a folder, a missing or unwritable parent is one line.

    Raises:
        UserError: ``out`` cannot be written (names the file, the option and the fix).
    """
    from neuron_build.util import write_atomic

    if out.is_dir():
        raise UserError(f"{option} {out}: is a folder; give a file name, e.g. {out / 'report.html'}"
                        if option == "--html" else f"{option} {out}: is a folder; give a file name")
    try:
        write_atomic(out, data)
    except OSError as e:
        raise UserError(f"{option} {out}: cannot be written ({e.strerror or e}); give a path in a folder you "
                        f"can write") from None


@command("metrics")
def cmd_metrics(args) -> int:
    """Print (or write) the OpenMetrics exposition of the report's figures."""
    from neuron_build.evaluate.openmetrics import openmetrics_text

    rep, window_s = _report(args)
    text = openmetrics_text(rep, window_s)
    if args.output:
        _write_output(Path(args.output), text, "--output")
    else:
        display_text(text.decode(), end="")
    return ExitCode.OK


@command("failures")
def cmd_failures(args) -> int:
    """List the kept failure workdirs, newest last, with stage, compiler pass, diagnostic code and files."""
    from neuron_build.store import failures

    parts = (args.target or "x").rstrip("/").split("/")
    if args.target and (args.target.startswith("/") or any(p in ("", ".", "..") for p in parts)):
        raise UserError(f"failures: {args.target!r} is not a target id; give one as `neuron-build plan` lists "
                        f"them (MODEL/BUCKET/DTYPE/PROFILE), or none for every kept failure")
    _, store = open_project_store(args)
    entries = failures.kept(store, args.target)
    root = Path(store.location)
    if args.json:
        rows = []
        for e in entries:
            row = e.to_json()
            row["folder"] = str(root / e.path / "files") if root.is_dir() else None
            rows.append(row)
        print_json({"schema": FAILURES_SCHEMA, "store": store.location, "failures": rows})
        return ExitCode.OK
    if not entries:
        display_text(f"no kept failure workdirs in {store.location}" + (f" for {args.target}" if args.target else ""))
        return ExitCode.OK
    for e in entries:
        where = ", ".join(x for x in (e.failure_stage and f"stage {e.failure_stage}",
                                      e.compiler_pass and f"last pass {e.compiler_pass}",
                                      e.diagnostic_code and f"code {e.diagnostic_code}") if x) or "stage unknown"
        display_text(f"{e.time}  {e.target}  {e.status} ({where}): {e.reason}")
        display_text(f"    {root / e.path / 'files'}  ({plural(len(e.files), 'file')}, {mib(e.bytes)}"
                     + (f"; left out over the size cap: {', '.join(e.omitted)}" if e.omitted else "") + ")")
    display_text(f"{plural(len(entries), 'kept failure workdir')}; bounded by keep_failed_workdirs and "
                 f"failed_workdirs_max_mb under [monitoring]; gc removes a target's once it passes again")
    return ExitCode.OK


__all__ = ["FAILURES_SCHEMA", "register"]
