"""The doit task loader of a build: :class:`BuildSession`, one ``build:<target id>`` task per target.

A task is up to date exactly when the store holds a complete artifact for the target's current key (see
:mod:`neuron_build.tasks` for the doit database this implies). A session carries one :class:`Builder` and
collects the :class:`Outcome` of every build it runs; it takes its settings in its constructor.
``neuron-build build`` makes one with its Builder and runs doit through it (:meth:`BuildSession.run`, with
:class:`~neuron_build.build.doit.run.BuildMain`); ``dodo.py``'s session (:func:`neuron_build.tasks.session`)
makes its Builder on first use from the configured ``buckets.toml``. A no-op build whose inputs are all
unchanged reads its tasks from the plan cache (:mod:`neuron_build.project.plan_cache`), without parsing the
config or computing a key.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from doit import get_var
from doit.cmd_base import NamespaceTaskLoader
from doit.exceptions import TaskFailed

from neuron_build.build.doit.noop import RECORDED_CACHE, Recorded, cached_plan, save_plan
from neuron_build.build.doit.report import BuildReporter
from neuron_build.build.jobs import default_jobs

if TYPE_CHECKING:  # the Builder, the config schema and validation load when a plan is computed, not on a no-op
    from neuron_build.build.attempt import Outcome
    from neuron_build.build.builder import Builder
    from neuron_build.project.plan_cache import Plan
    from neuron_build.store.contract import ArtifactStore

__all__ = ["BASE_DOIT_CONFIG", "BuildSession", "SessionExecutor", "config_path_setting", "retry_failed_setting"]

#: doit's settings of a build (``neuron_build.tasks.DOIT_CONFIG`` adds its reporter)
BASE_DOIT_CONFIG: dict[str, Any] = {
    "default_tasks": ["build"],
    "continue": True,          # one failed target never stops the others
    "backend": "sqlite3",
    "dep_file": ":memory:",    # per process: concurrent builds never share (or lock) a database
    "verbosity": 2,
    # compiles at once: one per CPU, bounded by physical memory over the default expected peak of a compile
    # ([build] max_host_memory_gb is enforced per compile by the memory budget); `doit -n 1 build` for serial
    "num_process": default_jobs(),
    "par_type": "thread",      # one Builder shared by the runners; each compile is its own worker process
}


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


def retry_failed_setting() -> bool:
    """The ``retry_failed=`` doit variable (default: retry)."""
    v = get_var("retry_failed", "1")
    return v is None or str(v).strip().lower() not in ("0", "false", "no", "off")


def config_path_setting() -> str:
    """The configured ``buckets.toml``: the ``config=`` doit variable, then ``NEURON_BUILD_CONFIG``, then
    ``buckets.toml`` (outside a doit run, doit's ``get_var`` answers None: the environment decides)."""
    return get_var("config") or os.environ.get("NEURON_BUILD_CONFIG", "buckets.toml")


def _load_builder(path: str) -> Builder:
    """A :class:`Builder` for the ``buckets.toml`` at ``path``. A config error (or a
    store that cannot be opened: a file, the old layout) prints one message and exits 2."""
    from neuron_build.build.builder import Builder
    from neuron_build.errors import ConfigError, UserError, exit_code
    from neuron_build.log import configure
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

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
        return Builder(Workspace(project))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exit_code(e))


def _push_failed(lines: list[str]) -> TaskFailed:
    """The action of the ``build:(push)`` task: fail with one line per artifact that is still not pushed."""
    return TaskFailed("\n".join(lines))


def _is_built(store: ArtifactStore, key: str, hits: list[str] | None = None, target_id: str = "",
              known: set[str] | None = None, fresh: Any = None) -> bool:
    """``uptodate`` of a ``build:`` task: the store holds a complete artifact for ``key`` here whose recorded
    inputs all still match (``fresh``, a :class:`~neuron_build.build.doit.noop.Recorded`). A hit on a read-through store's remote runs the
    task, which downloads the artifact and verifies every blob. A
    plain function, not a bound method: doit inspects every uptodate callable's signature on every no-op run.
    A hit is added to ``hits`` (the session writes them to the build ledger when the build ends). ``known``:
    keys this run's reporter found in the store just before (:meth:`BuildSession.to_build`), not asked twice."""
    done = (known is not None and key in known) or (store.is_cached(key) and (fresh is None or fresh(key)))
    if done and hits is not None:
        hits.append(target_id)
    return done


# doit reads the signature of every uptodate callable on every status check (for its magic ``task`` and
# ``values`` arguments); computed once here instead of 1,000 times on a no-op build of 1,000 targets
_is_built.__signature__ = inspect.signature(_is_built)  # type: ignore[attr-defined]


class BuildSession(NamespaceTaskLoader):
    """A doit task loader (doit's ``TaskLoader2`` API) over one :class:`Builder`.

    Its namespace holds ``DOIT_CONFIG`` and its own ``task_build`` (:class:`neuron_build.tasks.DodoSession`
    adds ``task_validate``), so doit gets the same build tasks as from ``dodo.py``; every ``build:`` action
    it runs records its :class:`Outcome` in :attr:`outcomes`.

    Args:
        builder: the Builder to use; None makes one on first use from the configured ``buckets.toml``
            (as ``dodo.py`` does; a config error then exits 2).
        retry_failed: whether a target whose current key failed last time is compiled again; None reads
            doit's ``retry_failed=`` variable (default: retry).
        config_path: the ``buckets.toml`` a Builder is made from when none was given; None: the ``config=``
            doit variable, then ``NEURON_BUILD_CONFIG``, then ``buckets.toml`` (:func:`config_path_setting`,
            read when needed).
        jobs: compiles at once (the progress display's slots).
        pending: target id -> expected compile time (seconds; None when never recorded) of the targets known
            to be built; None: found out as doit checks the tasks.
        doit_config: doit's settings (default :data:`BASE_DOIT_CONFIG`).

    Attributes:
        outcomes: target id -> the Outcome of its build in this session (threads of one process only:
            a ``doit -P process`` runner records into its own copy).
    """

    def __init__(self, builder: Builder | None = None, retry_failed: bool | None = None, *,
                 config_path: str | None = None, jobs: int = 1, pending: dict[str, float | None] | None = None,
                 doit_config: dict[str, Any] | None = None):
        super().__init__()
        self._builder = builder
        self.retry_failed = retry_failed
        self.config_path = config_path
        self.doit_config = BASE_DOIT_CONFIG if doit_config is None else doit_config
        self.outcomes: dict[str, Outcome] = {}
        #: the progress display of the running build (made by the reporter when doit starts), the
        #: compiles at once, and the expected compile times (seconds) of the targets known to be built
        self.display: Any = None
        self._reporter: BuildReporter | None = None
        self.jobs = jobs
        self.pending = pending
        #: target ids doit found up to date in this session (written to the ledger by :meth:`flush_hits`)
        self.hits: list[str] = []
        self.namespace = self._namespace()
        self._own_builder = builder is None
        #: keys :meth:`to_build` found in the store this run (their tasks' checks do not ask again)
        self._known: set[str] = set()
        self._lock = threading.Lock()
        #: the plan cache's (plan, local store) when this session's build tasks came from it
        self._plan: tuple[Plan, Any] | None = None
        #: the check of the artifacts' recorded inputs (:class:`~neuron_build.build.doit.noop.Recorded`), made with the tasks
        self._fresh: Recorded | None = None

    @property
    def builder(self) -> Builder:
        """The session's Builder (made on first use when none was given, once for every runner thread)."""
        if self._builder is None:
            with self._lock:
                if self._builder is None:
                    self._builder = _load_builder(self._config_path())
        return self._builder

    def _namespace(self) -> dict[str, Any]:
        """doit's namespace of this loader: ``DOIT_CONFIG`` and the task creators."""
        return {"DOIT_CONFIG": self.doit_config, "task_build": self.task_build}

    def _config_path(self) -> str:
        return self.config_path if self.config_path is not None else config_path_setting()

    def load_doit_config(self) -> dict[str, Any]:
        """doit's configuration: :attr:`doit_config`, with a reporter of this session during :meth:`run`."""
        cfg = self.doit_config
        return {**cfg, "reporter": self._reporter} if self._reporter is not None else cfg

    def run(self, target_ids: Sequence[str] | None = None, jobs: int = 1, outstream: Any = None) -> int:
        """Run ``doit run`` over this session: the ``build:`` tasks of ``target_ids`` (None: every target),
        ``jobs`` at once (threads of this process). Outcomes land in :attr:`outcomes` (cleared first).
        ``outstream``: where doit's own report goes (default stdout; ``build --json`` sends it to stderr).

        Returns doit's exit status (0 ok, 1 a task failed, 2 a usage error or a task error, 3 an
        unexpected doit error).
        """
        from neuron_build.build.doit.run import BuildMain

        b = self.builder
        # for the processes this run starts (doit -P process runners); put back afterwards, so a caller that
        # runs builds in-process (tests, a notebook) does not point later subprocesses at this project
        config_before = os.environ.get("NEURON_BUILD_CONFIG")
        os.environ["NEURON_BUILD_CONFIG"] = str(b.ws.project.path)
        doit_args = ["run", "--db-file", ":memory:"]  # see the module docstring: one db per process
        # always explicit: DOIT_CONFIG's parallel default must not override jobs=1 (-n 0: doit's serial runner)
        doit_args += ["-n", str(jobs) if jobs > 1 else "0", "-P", "thread"]
        doit_args += [f"build:{t}" for t in target_ids] if target_ids is not None else ["build"]
        b.ws.project.state_dir.mkdir(parents=True, exist_ok=True)
        self.outcomes.clear()
        extra = {"run": {"outfile": outstream}} if outstream is not None else None
        self.hits.clear()
        self._known.clear()
        # DOIT_CONFIG's reporter would report to the dodo.py session: this run's reports to this session
        self._reporter = BuildReporter(outstream if outstream is not None else sys.stdout, session=self)
        self.display = None  # the reporter makes this run's
        try:
            rc = BuildMain(self, extra_config=extra).run(doit_args)
            if rc == 130:  # Ctrl-C, which BuildRun returns: the caller's again
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
            from neuron_build.build.fleet.predict import predicted_seconds

            ws = self.builder.ws
            return predicted_seconds(ws, ws.by_id[target_id])

        total = len(self.pending) if self.pending is not None else total
        return BuildDisplay(total, slots=self.jobs, expect=expect, pending=self.pending)

    def target_ids(self) -> list[str]:
        """Every target id of the matrix, in matrix order (a no-op from the plan cache reads them there)."""
        if self._builder is None and self._plan is not None:
            return [t for t, _ in self._plan[0].targets]
        return list(self.builder.ws.by_id)

    def to_build(self, target_ids: Sequence[str]) -> dict[str, float | None] | None:
        """Which of ``target_ids`` the store does not hold: target id -> the expected compile time (seconds,
        predicted from the ledger by :mod:`neuron_build.build.fleet.predict`; None when nothing was ever recorded), so progress counts N of
        M exactly from the start. None when that is not cheap to tell (a store with a remote, whose hits
        only the tasks' checks find). Asks the store's lookup index, as the tasks' checks do."""
        if self._builder is None and self._plan is not None:
            plan, store = self._plan
            keys = plan.keys()
        else:
            ws = self.builder.ws
            if ws.store.remote_location:
                return None
            store, keys = ws.store, {t: ws.key(ws.by_id[t]).key for t in target_ids if t in ws.by_id}
        missing = []
        for t in target_ids:
            if t not in keys:
                continue
            if store.is_cached(keys[t]) and (self._fresh is None or self._fresh(keys[t])):
                self._known.add(keys[t])  # the task's own check need not ask again
            else:
                missing.append(t)
        if not missing:
            return {}
        from neuron_build.build.fleet.predict import predicted_seconds

        ws = self.builder.ws  # something compiles: the Builder is made now anyway
        return {t: predicted_seconds(ws, ws.by_id[t]) for t in missing if t in ws.by_id}

    def up_to_date(self, target_ids: Sequence[str]) -> list[str]:
        """Which of ``target_ids`` the store holds complete now, as a ``build:`` task's ``uptodate`` check
        tells it (:func:`_is_built`: the local store; an artifact only on the remote is downloaded by the
        task, so it is not up to date), in the order given. For the summary of a build Ctrl-C stopped
        before doit checked every task: nothing is added to :attr:`hits` (doit did not find them).
        Never raises: a store or a key that cannot be read leaves that target out."""
        try:
            if self._builder is None and self._plan is not None:
                plan, store = self._plan
                keys = plan.keys()
            else:
                ws = self.builder.ws
                store, keys = ws.store, {t: ws.key(ws.by_id[t]).key for t in target_ids if t in ws.by_id}
        except Exception:  # called while a Ctrl-C is on its way up: the summary must still print
            return []
        out = []
        for t in target_ids:
            try:
                if t in keys and _is_built(store, keys[t], None, t, self._known, self._fresh):
                    out.append(t)
            except Exception:
                continue
        return out

    def flush_hits(self) -> None:
        """Write the cache hits collected so far to the build ledger (one object), then forget them (and
        save the digests the recorded-input checks computed)."""
        if self._fresh is not None:
            try:
                self._fresh.save()
            except OSError:
                pass  # only an accelerator
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
            self._plan = cached_plan(self._config_path())
            if self._plan is not None:  # nothing the keys read changed: no config parse, no key computed
                self._fresh = Recorded.of_plan(*self._plan)
                yield from self._tasks_from_plan(*self._plan)
                return
        b = self.builder
        ws = b.ws
        self._fresh = Recorded(ws.store, ws.keys.checker(), ws.keys.save, ws.project.state_dir / RECORDED_CACHE)
        ws.store.clean_staging()
        unpushed = b.push_pending()
        if unpushed:  # built earlier, still not on the remote: the build says so until a push succeeds
            yield {"name": "(push)", "doc": "push what earlier builds could not", "uptodate": [False],
                   "actions": [(_push_failed, [unpushed])]}
        for t in ws.targets:
            key = ws.key(t).key
            yield {
                "name": t.id,
                "doc": f"compile {t.id} ({ws.keys.backend}, {ws.keys.hardware_target})",
                "actions": [(self._build, [t.id])],
                "uptodate": [(_is_built, [ws.store, key, self.hits, t.id, self._known, self._fresh])],
            }
        ws.keys.save()
        if self._own_builder:
            save_plan(ws, interp)

    def _tasks_from_plan(self, plan: Plan, store: Any) -> Iterator[dict[str, Any]]:
        """The ``build:`` tasks of a cached plan, checked against its local store (the same tasks as the
        planned ones: an action that runs makes the Builder, which plans again)."""
        store.clean_staging()
        for tid, key in plan.targets:
            yield {
                "name": tid,
                "doc": f"compile {tid} ({plan.backend}, {plan.hardware_target})",
                "actions": [(self._build, [tid])],
                "uptodate": [(_is_built, [store, key, self.hits, tid, self._known, self._fresh])],
            }

    def _build(self, target_id: str):
        b = self.builder
        ws = b.ws
        if target_id not in ws.by_id:  # the plan cache was stale after all (an input changed meanwhile)
            return TaskFailed(f"{target_id}: no longer in the matrix of {ws.project.path}; run the build again")
        _die_with_parent()
        b.announce_backend()  # once per process, on the first compile it runs
        retry = self.retry_failed if self.retry_failed is not None else retry_failed_setting()
        display = self.display
        if display is not None:
            display.started(target_id)
        try:
            out = b.build(ws.by_id[target_id], retry_failed=retry,
                          no_retry_option="--no-retry-failed" if self.retry_failed is not None
                          else "retry_failed=0")
        except Exception as e:  # a bug or an unforeseen OSError: the summary names it (doit shows the traceback)
            from neuron_build.build.attempt import Outcome
            from neuron_build.status import Status
            text = str(e).strip().splitlines()
            self.outcomes[target_id] = Outcome(target_id, ws.key(ws.by_id[target_id]).key, Status.ERROR,
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


class SessionExecutor:
    """The build on this host: doit over a :class:`~neuron_build.build.doit.session.BuildSession`.

    Args:
        builder: the build's Builder (one target at a time; the session runs it under doit).
        jobs: compiles at once (doit's runner threads).
        retry_failed: compile targets whose current key failed last time.
        pending: target id -> predicted compile seconds of each target to compile (the progress display's).
        select: build only the targets given to :meth:`run` (False: doit's whole task list, as a bare
            ``neuron-build build`` does).
        outstream: where doit's own report goes (None: stdout; ``build --json`` sends it to stderr).

    Attributes after :meth:`run`: ``status``, doit's exit status (0 ok, 1 a task failed, 2 or 3 an error).
    """

    def __init__(self, builder: Builder, jobs: int, retry_failed: bool = True, pending: Mapping[str, Any] | None = None,
                 select: bool = True, outstream: Any = None):
        self.b, self.jobs, self.retry_failed = builder, jobs, retry_failed
        self.pending, self.select, self.outstream = dict(pending or {}), select, outstream
        self.status = 0

    def run(self, targets: Sequence[Any]) -> Mapping[str, Any]:
        """Run doit over the targets; return the session's outcomes (a target doit found up to date has none)."""
        from neuron_build.build.doit.session import BuildSession

        session = BuildSession(self.b, retry_failed=self.retry_failed, jobs=self.jobs, pending=self.pending)
        self.status = session.run([t.id for t in targets] if self.select else None, jobs=self.jobs,
                                  outstream=self.outstream)
        return session.outcomes
