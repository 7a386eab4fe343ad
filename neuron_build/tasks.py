"""The doit glue, nothing else: one ``build:<target id>`` and one ``validate:<target id>`` task per target.

``dodo.py`` is ``from neuron_build.tasks import *``. A task is up to date exactly when the store holds a
complete artifact for the target's current key, so doit's database holds nothing a build needs: it is
kept in memory, one per process (``dep_file = ":memory:"``). A database file shared by two ``doit build``
processes is not safe: doit's sqlite3 backend keeps a write transaction open from a task's first failure
until the end of the run, and a second process that finishes meanwhile dies with "database is locked"
(seen with doit 0.37; tests/faults/test_concurrency.py runs both). Without a file, ``doit forget`` and
``doit ignore`` have nothing to remember; every other command works as before.

``validate:<target id>`` depends on ``build:<target id>`` and is up to date when the store holds a
validation of the current key on the device kind the artifact runs on, made with the current tolerance
and reference model (by name and by content: its ``model`` key component), that need not be repeated (a pass, or "not validated" on a host that still cannot
run it; a failure is never up to date). Validation imports
torch inside its action only, so ``doit list`` and a no-op ``doit build`` stay torch-free.

The tasks are made by a :class:`BuildSession`, a doit task loader that carries one :class:`Builder` and
collects the :class:`Outcome` of every build it runs. ``neuron-build build`` makes one with its Builder and
runs doit through it (:meth:`BuildSession.run`); the module-level ``task_build``/``task_validate`` that
``dodo.py`` imports use one session per process, made on first use from the configured ``buckets.toml``:
``buckets.toml`` beside ``dodo.py``, or ``doit build config=PATH``, or the ``NEURON_BUILD_CONFIG``
environment variable. ``doit build retry_failed=0`` skips targets whose current key failed last time
(``neuron-build build --no-retry-failed``); by default every build retries them.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doit import create_after, get_var
from doit.cmd_base import NamespaceTaskLoader
from doit.exceptions import TaskFailed

from neuron_build.build.jobs import default_jobs
from neuron_build.build.report import BuildReporter

if TYPE_CHECKING:  # the Builder, the config schema and validation load when a plan is computed, not on a no-op
    from neuron_build.build.builder import Builder, Outcome
    from neuron_build.project.plan_cache import Plan
    from neuron_build.store.contract import ArtifactStore

__all__ = ["DOIT_CONFIG", "BuildSession", "session", "task_build", "task_validate"]


class DodoReporter(BuildReporter):
    """``DOIT_CONFIG``'s reporter: a :class:`~neuron_build.build.report.BuildReporter` over the ``dodo.py``
    session (:func:`session`) that prints the build's summary at the end."""

    def __init__(self, outstream: Any, options: dict):
        super().__init__(outstream, options, session=lambda: session(), summary=True)


DOIT_CONFIG = {
    "default_tasks": ["build"],
    "continue": True,          # one failed target never stops the others
    "backend": "sqlite3",
    "dep_file": ":memory:",    # per process: concurrent builds never share (or lock) a database
    "verbosity": 2,
    # compiles at once: one per CPU, bounded by physical memory over the default expected peak of a compile
    # ([build] max_host_memory_gb is enforced per compile by the memory budget); `doit -n 1 build` for serial
    "num_process": default_jobs(),
    "par_type": "thread",      # one Builder shared by the runners; each compile is its own worker process
    "reporter": DodoReporter,  # doit's report, plus the progress display and the build's summary
}


def _unmet_dependency_is_a_failure() -> None:
    """Make doit exit 1, not 2, when tasks failed and others were skipped because of them.

    ``doit build`` runs the group task ``build``, which depends on every ``build:<target>``; when one
    fails, doit records the group task's :class:`~doit.exceptions.UnmetDependency`, a ``TaskError``, and
    exits 2, the code the README reserves for user errors. A task not run because a task it depends on
    failed is part of that failure: this wraps ``Runner._handle_task_error`` (used by doit's serial,
    process and thread runners) so such a skip keeps the result at 1 unless a real error happened. Applied
    once, when this module is imported (only by ``dodo.py`` and ``neuron-build build``).
    """
    from doit.exceptions import UnmetDependency
    from doit.runner import ERROR, FAILURE, Runner

    orig = Runner._handle_task_error
    if getattr(orig, "_neuron_build", False):
        return

    def handle(self, node, base_fail):
        before = self.final_result
        orig(self, node, base_fail)
        if isinstance(base_fail, UnmetDependency) and before != ERROR:
            self.final_result = FAILURE

    handle._neuron_build = True  # type: ignore[attr-defined]
    Runner._handle_task_error = handle


_unmet_dependency_is_a_failure()


def _usage_errors_exit_2() -> None:
    """Make doit exit 2, not 3, on a usage error found once ``dodo.py`` is loaded: an unknown task
    (``doit build:nosuch``), a task option it does not take (``doit build --no-retry``), an invalid task;
    and exit 130 on Ctrl-C, 141 when the reader of stdout went away (a closed pipe), without a traceback
    (as ``neuron-build build``).

    doit's ``DoitMain.run`` prints ``ERROR: <message>`` and returns 3 for those, the code the README
    reserves for gate refusals. It catches them around the command, which runs before this module is
    imported (by ``dodo.py``), so this wraps ``Run._execute``, called after the import, where doit's
    task selection raises them: the same ``ERROR:`` line goes to stderr and the command returns 2.
    Applied once, when this module is imported.
    """
    from doit.cmd_run import Run
    from doit.cmdparse import CmdParseError
    from doit.exceptions import InvalidCommand, InvalidDodoFile, InvalidTask

    orig = Run._execute
    if getattr(orig, "_neuron_build", False):
        return

    @functools.wraps(orig)
    def execute(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except (CmdParseError, InvalidDodoFile, InvalidCommand, InvalidTask) as err:
            if isinstance(err, InvalidCommand):  # as DoitMain.run words it: was `run` named?
                err.bin_name = getattr(self, "bin_name", "doit")
                f = sys._getframe(1)
                while f is not None and not ("cmd_name" in f.f_locals and "specified_run" in f.f_locals):
                    f = f.f_back
                if f is not None:
                    err.cmd_used = f.f_locals["cmd_name"] if f.f_locals["specified_run"] else None
            sys.stderr.write(f"ERROR: {err}\n")
            return 2
        except KeyboardInterrupt:  # Ctrl-C: the reporter's summary names the interrupted targets
            return 130
        except BrokenPipeError:  # the reader went away (`doit build | head -1`): 141, as a shell's SIGPIPE
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
            return 141

    execute._neuron_build = True  # type: ignore[attr-defined]
    Run._execute = execute


_usage_errors_exit_2()

_MAIN_PID = os.getpid()
_pdeathsig_set = False


def _die_with_parent() -> None:
    """In a runner process forked by ``doit -P process``, ask Linux to SIGKILL it when doit dies, so a
    killed build leaves no orphan builder behind (its compile workers die with it the same way)."""
    global _pdeathsig_set
    if _pdeathsig_set or os.getpid() == _MAIN_PID:
        return
    from neuron_build.build.local import die_with_parent
    die_with_parent()
    _pdeathsig_set = True


def _retry_failed_var() -> bool:
    """The ``retry_failed=`` doit variable (default: retry)."""
    v = get_var("retry_failed", "1")
    return v is None or str(v).strip().lower() not in ("0", "false", "no", "off")


def _config_path() -> str:
    """The configured ``buckets.toml``: the ``config=`` doit variable, then ``NEURON_BUILD_CONFIG``, then
    ``buckets.toml`` (outside a doit run, doit's ``get_var`` answers None: the environment decides)."""
    return get_var("config") or os.environ.get("NEURON_BUILD_CONFIG", "buckets.toml")


def _load_builder() -> Builder:
    """A :class:`Builder` for the configured ``buckets.toml`` (:func:`_config_path`). A config error (or a
    store that cannot be opened: a file, the old layout) prints one message and exits 2."""
    from neuron_build.build.builder import Builder
    from neuron_build.errors import ConfigError, UserError, exit_code
    from neuron_build.log import configure
    from neuron_build.project.config import load_project

    path = _config_path()
    try:
        project = load_project(path)
        project.make_state_dir()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exit_code(e))
    configure(project.state_dir / "build.log")
    if project.config.build.executor == "dask":
        from neuron_build.log import get_logger
        get_logger().warning("doit build compiles on this host; `neuron-build build` sends compiles to the Dask "
                             "cluster ([build] executor = \"dask\")")
    try:
        return Builder(project)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exit_code(e))


def _push_failed(lines: list[str]) -> TaskFailed:
    """The action of the ``build:(push)`` task: fail with one line per artifact that is still not pushed."""
    return TaskFailed("\n".join(lines))


def _cached_plan() -> tuple[Plan, Any] | None:
    """The plan cache's targets and keys for the configured ``buckets.toml`` and the local store they are
    checked against, when every input of the cached plan is unchanged (see
    :mod:`neuron_build.project.plan_cache`); None otherwise (then the build plans as usual)."""
    from neuron_build.project import plan_cache
    from neuron_build.store.local import LocalStore

    p = Path(_config_path())
    try:
        data = p.read_bytes()
        resolved = p.resolve()
    except OSError:
        return None  # the planning path says what is wrong
    state = ".neuron-build"
    if b"state_dir" in data:  # only then is the TOML parsed here (the cache checks the bytes anyway)
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib
        try:
            build = tomllib.loads(data.decode("utf-8")).get("build")
        except ValueError:
            return None
        state = build.get("state_dir", state) if isinstance(build, dict) else state
        if not isinstance(state, str):
            return None
    plan, _ = plan_cache.load(resolved.parent / state, resolved, data)
    if plan is None:
        return None
    try:
        store = LocalStore(Path(plan.store))
        recorded = {m: store.recorded_imports(m) for m in plan.recorded}
        if not plan_cache.recorded_match(plan, recorded):
            return None
        from neuron_build.store.reads import recorded_reads
        reads = {m: recorded_reads(store, m) for m in plan.recorded}
    except (OSError, ValueError):
        return None
    return (plan, store) if plan_cache.reads_match(plan, reads) else None


def _save_plan(b: Builder, interp: dict[str, Any]) -> None:
    """Write the plan cache of ``b``'s plan (best effort) when a later no-op may use it: a local store
    without a remote, the local executor (else the no-op path has more to do than check the store)."""
    from neuron_build.project import plan_cache
    from neuron_build.project.keys import KEY_ENV
    p = b.project
    if (b.store.folder is None or b.store.remote_location is not None or p.remote_url() is not None or p.config.build.executor != "local"
            or not p.config_sha256):
        return
    plan_cache.write(p.state_dir, config_path=p.path, config_sha256=p.config_sha256, log=b.keys.inputs,
                     env_names=[n for names in KEY_ENV.values() for n in names], recorded=b.keys.recorded,
                     store=str(b.store.folder), backend=b.keys.backend, hardware_target=b.keys.hardware_target,
                     targets=[(t.id, b.key(t).key) for t in b.targets], interp=interp, reads=b.keys.reads)


def _is_built(store: ArtifactStore, key: str, hits: list[str] | None = None, target_id: str = "",
              known: set[str] | None = None) -> bool:
    """``uptodate`` of a ``build:`` task: the store holds a complete artifact for ``key`` here. A hit on a
    read-through store's remote runs the task, which downloads the artifact and verifies every blob. A
    plain function, not a bound method: doit inspects every uptodate callable's signature on every no-op run.
    A hit is added to ``hits`` (the session writes them to the build ledger when the build ends). ``known``:
    keys this run's reporter found in the store just before (:meth:`BuildSession.to_build`), not asked twice."""
    done = (known is not None and key in known) or store.is_cached(key)
    if done and hits is not None:
        hits.append(target_id)
    return done


# doit reads the signature of every uptodate callable on every status check (for its magic ``task`` and
# ``values`` arguments); computed once here instead of 1,000 times on a no-op build of 1,000 targets
_is_built.__signature__ = inspect.signature(_is_built)  # type: ignore[attr-defined]


class BuildSession(NamespaceTaskLoader):
    """A doit task loader (doit's ``TaskLoader2`` API) over one :class:`Builder`.

    Its namespace holds ``DOIT_CONFIG`` and its own ``task_build``/``task_validate``, so doit gets the
    same tasks as from ``dodo.py``; every ``build:`` action it runs records its :class:`Outcome` in
    :attr:`outcomes`.

    Args:
        builder: the Builder to use; None makes one on first use from the configured ``buckets.toml``
            (as ``dodo.py`` does; a config error then exits 2).
        retry_failed: whether a target whose current key failed last time is compiled again; None reads
            doit's ``retry_failed=`` variable (default: retry).

    Attributes:
        outcomes: target id -> the Outcome of its build in this session (threads of one process only:
            a ``doit -P process`` runner records into its own copy).
    """

    def __init__(self, builder: Builder | None = None, retry_failed: bool | None = None):
        super().__init__()
        self._builder = builder
        self.retry_failed = retry_failed
        self.outcomes: dict[str, Outcome] = {}
        #: the progress display of the running build (made by the reporter when doit starts), the
        #: compiles at once, and the expected compile times (seconds) of the targets known to be built
        self.display: Any = None
        self._reporter: BuildReporter | None = None
        self.jobs = 1
        self.pending: dict[str, float | None] | None = None  # None: found out as doit checks the tasks
        #: target ids doit found up to date in this session (written to the ledger by :meth:`flush_hits`)
        self.hits: list[str] = []
        self.namespace = {"DOIT_CONFIG": DOIT_CONFIG, "task_build": self.task_build,
                          "task_validate": self.task_validate}
        self._own_builder = builder is None
        #: keys :meth:`to_build` found in the store this run (their tasks' checks do not ask again)
        self._known: set[str] = set()
        self._lock = threading.Lock()
        #: the plan cache's (plan, local store) when this session's build tasks came from it
        self._plan: tuple[Plan, Any] | None = None

    @property
    def builder(self) -> Builder:
        """The session's Builder (made on first use when none was given, once for every runner thread)."""
        if self._builder is None:
            with self._lock:
                if self._builder is None:
                    self._builder = _load_builder()
        return self._builder

    def load_doit_config(self) -> dict[str, Any]:
        """doit's configuration: :data:`DOIT_CONFIG`, with a reporter of this session during :meth:`run`."""
        return {**DOIT_CONFIG, "reporter": self._reporter} if self._reporter is not None else DOIT_CONFIG

    def run(self, target_ids: Sequence[str] | None = None, jobs: int = 1, outstream: Any = None) -> int:
        """Run ``doit run`` over this session: the ``build:`` tasks of ``target_ids`` (None: every target),
        ``jobs`` at once (threads of this process). Outcomes land in :attr:`outcomes` (cleared first).
        ``outstream``: where doit's own report goes (default stdout; ``build --json`` sends it to stderr).

        Returns doit's exit status (0 ok, 1 a task failed, 2 a usage error or a task error, 3 an
        unexpected doit error).
        """
        from doit.doit_cmd import DoitMain

        b = self.builder
        # for the processes this run starts (doit -P process runners); put back afterwards, so a caller that
        # runs builds in-process (tests, a notebook) does not point later subprocesses at this project
        config_before = os.environ.get("NEURON_BUILD_CONFIG")
        os.environ["NEURON_BUILD_CONFIG"] = str(b.project.path)
        doit_args = ["run", "--db-file", ":memory:"]  # see the module docstring: one db per process
        # always explicit: DOIT_CONFIG's parallel default must not override jobs=1 (-n 0: doit's serial runner)
        doit_args += ["-n", str(jobs) if jobs > 1 else "0", "-P", "thread"]
        doit_args += [f"build:{t}" for t in target_ids] if target_ids is not None else ["build"]
        b.project.state_dir.mkdir(parents=True, exist_ok=True)
        self.outcomes.clear()
        extra = {"run": {"outfile": outstream}} if outstream is not None else None
        self.hits.clear()
        self._known.clear()
        # DOIT_CONFIG's reporter would report to the dodo.py session: this run's reports to this session
        self._reporter = BuildReporter(outstream if outstream is not None else sys.stdout, session=self)
        self.display = None  # the reporter makes this run's
        try:
            rc = DoitMain(self, extra_config=extra).run(doit_args)
            if rc == 130:  # Ctrl-C, which doit's run now returns (see _usage_errors_exit_2): the caller's again
                raise KeyboardInterrupt
            if rc == 141:  # the same for a closed pipe
                raise BrokenPipeError(32, "Broken pipe")
            return rc
        finally:
            if config_before is None:
                os.environ.pop("NEURON_BUILD_CONFIG", None)
            else:
                os.environ["NEURON_BUILD_CONFIG"] = config_before
            self._reporter = None
            if self.display is not None:
                self.display.stop()  # the reporter did, unless doit failed before it ran
            self.flush_hits()

    def make_display(self, total: int) -> Any:
        """The :class:`~neuron_build.build.display.BuildDisplay` of a run that builds up to ``total`` targets
        (exactly those of :attr:`pending` when set), :attr:`jobs` at once, with an ETA from the recorded
        compile times (:attr:`pending`'s, and each target's last recorded one when it starts)."""
        from neuron_build.build.display import BuildDisplay

        def expect(target_id: str) -> float | None:  # asked when a target starts: a no-op makes no Builder
            from neuron_build.build.peaks import expected_compile_time

            b = self.builder
            t = b.by_id[target_id]
            return expected_compile_time(b.store, t.model, t.bucket_id)

        total = len(self.pending) if self.pending is not None else total
        return BuildDisplay(total, slots=self.jobs, expect=expect, pending=self.pending)

    def target_ids(self) -> list[str]:
        """Every target id of the matrix, in matrix order (a no-op from the plan cache reads them there)."""
        if self._builder is None and self._plan is not None:
            return [t for t, _ in self._plan[0].targets]
        return list(self.builder.by_id)

    def to_build(self, target_ids: Sequence[str]) -> dict[str, float | None] | None:
        """Which of ``target_ids`` the store does not hold: target id -> the expected compile time (seconds,
        the last recorded one of its model and bucket; None when never recorded), so progress counts N of
        M exactly from the start. None when that is not cheap to tell (a store with a remote, whose hits
        only the tasks' checks find). Asks the store's lookup index, as the tasks' checks do."""
        if self._builder is None and self._plan is not None:
            plan, store = self._plan
            keys = plan.keys()
        else:
            b = self.builder
            if b.store.remote_location:
                return None
            store, keys = b.store, {t: b.key(b.by_id[t]).key for t in target_ids if t in b.by_id}
        missing = []
        for t in target_ids:
            if t not in keys:
                continue
            if store.is_cached(keys[t]):
                self._known.add(keys[t])  # the task's own check need not ask again
            else:
                missing.append(t)
        if not missing:
            return {}
        from neuron_build.build.peaks import expected_compile_time

        b = self.builder  # something compiles: the Builder is made now anyway
        return {t: expected_compile_time(b.store, b.by_id[t].model, b.by_id[t].bucket_id)
                for t in missing if t in b.by_id}

    def flush_hits(self) -> None:
        """Write the cache hits collected so far to the build ledger (one object), then forget them."""
        if not self.hits:
            return
        hits, self.hits[:] = list(self.hits), []
        if self._builder is not None:
            self._builder.record_cache_hits(hits)
        elif self._plan is not None:  # a no-op from the plan cache: its keys, its store
            from neuron_build.store import ledger

            plan, store = self._plan
            keys = plan.keys()
            try:
                ledger.append_cache_hits(store, [(t, keys[t]) for t in hits if t in keys], "LocalExecutor",
                                         plan.backend)
            except OSError:
                pass  # best effort, like every ledger write

    # -- build ----------------------------------------------------------------------------------------
    def task_build(self) -> Iterator[dict[str, Any]]:
        """Compile every target of the matrix that the store does not hold yet."""
        from neuron_build.project.plan_cache import interpreter

        interp = interpreter()  # as a later no-op will see it, before planning imports anything
        if self._own_builder and self._builder is None:
            self._plan = _cached_plan()
            if self._plan is not None:  # nothing the keys read changed: no config parse, no key computed
                yield from self._tasks_from_plan(*self._plan)
                return
        b = self.builder
        b.store.clean_staging()
        unpushed = b.push_pending()
        if unpushed:  # built earlier, still not on the remote: the build says so until a push succeeds
            yield {"name": "(push)", "doc": "push what earlier builds could not", "uptodate": [False],
                   "actions": [(_push_failed, [unpushed])]}
        for t in b.targets:
            key = b.key(t).key
            yield {
                "name": t.id,
                "doc": f"compile {t.id} ({b.keys.backend}, {b.keys.hardware_target})",
                "actions": [(self._build, [t.id])],
                "uptodate": [(_is_built, [b.store, key, self.hits, t.id, self._known])],
            }
        b.keys.save()
        if self._own_builder:
            _save_plan(b, interp)

    def _tasks_from_plan(self, plan: Plan, store: Any) -> Iterator[dict[str, Any]]:
        """The ``build:`` tasks of a cached plan, checked against its local store (the same tasks as the
        planned ones: an action that runs makes the Builder, which plans again)."""
        store.clean_staging()
        for tid, key in plan.targets:
            yield {
                "name": tid,
                "doc": f"compile {tid} ({plan.backend}, {plan.hardware_target})",
                "actions": [(self._build, [tid])],
                "uptodate": [(_is_built, [store, key, self.hits, tid, self._known])],
            }

    def _build(self, target_id: str):
        b = self.builder
        if target_id not in b.by_id:  # the plan cache was stale after all (an input changed meanwhile)
            return TaskFailed(f"{target_id}: no longer in the matrix of {b.project.path}; run the build again")
        _die_with_parent()
        b.announce_backend()  # once per process, on the first compile it runs
        retry = self.retry_failed if self.retry_failed is not None else _retry_failed_var()
        display = self.display
        if display is not None:
            display.started(target_id)
        try:
            out = b.build(b.by_id[target_id], retry_failed=retry,
                          no_retry_option="--no-retry-failed" if self.retry_failed is not None
                          else "retry_failed=0")
        except Exception as e:  # a bug or an unforeseen OSError: the summary names it (doit shows the traceback)
            from neuron_build.build.attempt import Outcome
            from neuron_build.status import Status
            text = str(e).strip().splitlines()
            self.outcomes[target_id] = Outcome(target_id, b.key(b.by_id[target_id]).key, Status.ERROR,
                                               type(e).__name__ + (f": {text[0]}" if text else ""))
            raise
        self.outcomes[target_id] = out
        if display is not None:
            display.finished(out)
        if not out.ok:
            return TaskFailed(f"{target_id}: {out.status}: {out.reason}")
        unpushed = b.push_failure(out.key)
        if unpushed:
            return TaskFailed(f"{target_id}: built, but {unpushed}")
        return {"key": out.key, "status": out.status}

    # -- validate -------------------------------------------------------------------------------------
    @create_after()  # made only when a validate task is selected: `doit build` never builds these 1,000s
    def task_validate(self) -> Iterator[dict[str, Any]]:
        """Check every target's artifact against the eager fp32 CPU reference (builds it first)."""
        from neuron_build.evaluate.textgen_validate import partners
        from neuron_build.evaluate.validate import (
            artifact_device_kind,
            is_validated,
            reference_model_hash,
            tolerance_for,
        )

        b = self.builder
        kind = artifact_device_kind(b.keys.backend, b.keys.hardware_target)
        ref_hash: dict[str, str] = {}  # reference model -> reference_model_hash (one per model, not target)
        for t in b.targets:
            key = b.key(t).key
            spec = b.project.config.models[t.model]
            tol, _ = tolerance_for(spec, t.model, t.dtype)
            ref = spec.reference or t.model
            if ref not in ref_hash:
                ref_hash[ref] = reference_model_hash(b.keys, ref)
            yield {
                "name": t.id,
                "doc": f"validate {t.id} on {kind} against the fp32 CPU reference",
                "actions": [(self._validate, [t.id])],
                # a text-generation graph is validated with its partner graphs: build them all first
                "task_dep": [f"build:{x.id}" for x in (partners(b.targets, t) if t.graph else [t])],
                # the reference by name and by content (its kwargs, factory, sources, weights)
                "uptodate": [(is_validated, [b.store, key, kind, tol, ref, ref_hash[ref]])],
                "verbosity": 2,
            }

    def _validate(self, target_id: str):
        from neuron_build.errors import UserError
        from neuron_build.evaluate.validate import summary_line, validate_target
        from neuron_build.status import Verdict

        b = self.builder
        t = b.by_id[target_id]
        try:
            rec = validate_target(b.project, b.store, t, b.key(t).key, keys=b.keys)
        except UserError as e:
            return TaskFailed(str(e))
        print(summary_line(rec))
        for note in rec.get("diagnosis", []):
            print(f"    {note}")
        if rec["verdict"] == Verdict.FAIL:
            return TaskFailed(rec["reason"])
        return {"key": rec["key"], "verdict": rec["verdict"]}


# -- dodo.py ----------------------------------------------------------------------------------------------
_session: BuildSession | None = None


def session() -> BuildSession:
    """The process's :class:`BuildSession` for ``dodo.py``, made on first use (its Builder too)."""
    global _session
    if _session is None:
        _session = BuildSession()
        atexit.register(_session.flush_hits)  # plain `doit build`: the hits go to the ledger as doit exits
    return _session


def task_build():
    """Compile every target of the matrix that the store does not hold yet."""
    yield from session().task_build()


@create_after()
def task_validate():
    """Check every target's artifact against the eager fp32 CPU reference (builds it first)."""
    yield from session().task_validate()
