"""The doit glue, nothing else: one ``build:<target id>`` and one ``validate:<target id>`` task per target.

``dodo.py`` is ``from neuron_build.tasks import *``. A task is up to date exactly when the store holds a
complete artifact for the target's current key, so doit's database holds nothing a build needs: it is
kept in memory, one per process (``dep_file = ":memory:"``). A database file shared by two ``doit build``
processes is not safe: doit's sqlite3 backend keeps a write transaction open from a task's first failure
until the end of the run, and a second process that finishes meanwhile dies with "database is locked"
(seen with doit 0.37; tests/flows/faults/test_concurrency.py runs both). Without a file, ``doit forget`` and
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

``doit`` exits with the project's codes (0 ok, 1 a build failed, 2 a usage or config error; 130 on Ctrl-C,
141 on a closed pipe) through doit's extension points: :class:`~neuron_build.build.doit.run.BuildRun` is
doit's ``run`` command plugin (the package's ``doit.COMMAND`` entry point, or
``[tool.doit.plugins.command]`` in ``pyproject.toml``); ``neuron-build build`` runs it through
:class:`~neuron_build.build.doit.run.BuildMain`. Nothing of doit is patched.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from typing import Any

try:
    from doit import create_after
    from doit.exceptions import TaskFailed
except ModuleNotFoundError as e:  # the dodo.py glue needs doit; say how to get it rather than a bare import error
    raise ModuleNotFoundError(f"neuron_build.tasks (the dodo.py glue) needs doit, a dependency of neuron-build that "
                              f"is not installed here ({e}); install the package: pip install -e .", name="doit") from e

from neuron_build.build.doit.noop import cached_plan
from neuron_build.build.doit.report import BuildReporter
from neuron_build.build.doit.run import BuildMain, BuildRun
from neuron_build.build.doit.session import BASE_DOIT_CONFIG, BuildSession, config_path_setting

__all__ = ["DOIT_CONFIG", "BuildMain", "BuildRun", "BuildSession", "DodoSession", "session", "task_build",
           "task_validate"]


class DodoReporter(BuildReporter):
    """``DOIT_CONFIG``'s reporter: a :class:`~neuron_build.build.doit.report.BuildReporter` over the ``dodo.py``
    session (:func:`session`) that prints the build's summary at the end."""

    def __init__(self, outstream: Any, options: dict):
        super().__init__(outstream, options, session=lambda: session(), summary=True)


DOIT_CONFIG = {
    **BASE_DOIT_CONFIG,
    "reporter": DodoReporter,  # doit's report, plus the progress display and the build's summary
}


def _cached_plan() -> Any:
    """The plan cache's (plan, local store) for the configured ``buckets.toml`` (see
    :func:`neuron_build.build.doit.noop.cached_plan`); None when an input changed."""
    return cached_plan(config_path_setting())


class DodoSession(BuildSession):
    """The :class:`~neuron_build.build.doit.session.BuildSession` of ``dodo.py``: its build tasks, and one
    ``validate:<target id>`` task per target (validation sits above the build layer)."""

    def _namespace(self) -> dict[str, Any]:
        return {**super()._namespace(), "task_validate": self.task_validate}

    # -- validate -------------------------------------------------------------------------------------
    @create_after()  # made only when a validate task is selected: `doit build` never builds these 1,000s
    def task_validate(self) -> Iterator[dict[str, Any]]:
        """Check every target's artifact against the eager fp32 CPU reference (builds it first)."""
        from neuron_build.evaluate.textgen_validate import partners
        from neuron_build.evaluate.validate import is_validated, reference_model_hash, tolerance_for
        from neuron_build.evaluate.validate_setup import artifact_device_kind

        ws = self.builder.ws
        _SESSIONS[id(self)] = self  # found again by _validate_action, in this process or a forked runner
        kind = artifact_device_kind(ws.keys.backend, ws.keys.hardware_target)
        ref_hash: dict[str, str] = {}  # reference model -> reference_model_hash (one per model, not target)
        for t in ws.targets:
            key = ws.key(t).key
            spec = ws.project.config.models[t.model]
            tol, _ = tolerance_for(spec, t.model, t.dtype)
            ref = spec.reference or t.model
            if ref not in ref_hash:
                ref_hash[ref] = reference_model_hash(ws.keys, ref)
            yield {
                "name": t.id,
                "doc": f"validate {t.id} on {kind} against the fp32 CPU reference",
                # a module-level function and plain arguments: doit's process runner pickles a task made
                # after the others (create_after) whole, and a session (its Builder's locks) does not pickle
                "actions": [(_validate_action, [id(self), t.id])],
                # a text-generation graph is validated with its partner graphs: build them all first
                "task_dep": [f"build:{x.id}" for x in (partners(ws.targets, t) if t.graph else [t])],
                # the reference by name and by content (its kwargs, factory, sources, weights)
                "uptodate": [(is_validated, [ws.store, key, kind, tol, ref, ref_hash[ref]])],
                "verbosity": 2,
            }

    def _validate(self, target_id: str):
        from neuron_build.errors import UserError
        from neuron_build.evaluate.validate import summary_line, validate_target
        from neuron_build.status import Verdict

        ws = self.builder.ws
        t = ws.by_id[target_id]
        try:
            rec = validate_target(ws.project, ws.store, t, ws.key(t).key, keys=ws.keys)
        except UserError as e:
            return TaskFailed(str(e))
        print(summary_line(rec))
        for note in rec.get("diagnosis", []):
            print(f"    {note}")
        if rec["verdict"] in (Verdict.FAIL, Verdict.ERROR):  # an error is no verdict, and never up to date
            return TaskFailed(rec["reason"])
        return {"key": rec["key"], "verdict": rec["verdict"]}


#: The sessions whose validate tasks were made, by ``id()``: a validate task names its session by this number,
#: so that doit's process runner (which forks, then receives the task pickled) finds it in the child too.
_SESSIONS: dict[int, DodoSession] = {}


def _validate_action(session_id: int, target_id: str):
    """The action of ``validate:<target id>``: :meth:`DodoSession._validate` of the session that made it."""
    return (_SESSIONS.get(session_id) or session())._validate(target_id)


# -- dodo.py ----------------------------------------------------------------------------------------------
_session: DodoSession | None = None


def session() -> DodoSession:
    """The process's :class:`DodoSession` for ``dodo.py``, made on first use (its Builder too)."""
    global _session
    if _session is None:
        _session = DodoSession(doit_config=DOIT_CONFIG)  # the config and retry_failed= as doit says
        atexit.register(_session.flush_hits)  # plain `doit build`: the hits go to the ledger as doit exits
    return _session


def task_build():
    """Compile every target of the matrix that the store does not hold yet."""
    yield from session().task_build()


@create_after()
def task_validate():
    """Check every target's artifact against the eager fp32 CPU reference (builds it first)."""
    yield from session().task_validate()
