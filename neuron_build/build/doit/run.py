"""doit's ``run`` command with the project's exit codes, through doit's extension points.

:class:`BuildRun` is a :class:`doit.cmd_run.Run` whose :meth:`~BuildRun.execute` maps doit's outcomes to the
exit-code table (0 ok, 1 a build failed, 2 a usage or config error, 3 a gate refused: never doit's 3 for a
usage error), 130 on Ctrl-C and 141 when the reader of stdout went away. :class:`BuildMain` is the
:class:`doit.doit_cmd.DoitMain` that ``neuron-build build`` runs. For ``doit`` with a ``dodo.py`` that imports
:mod:`neuron_build.tasks`, :class:`BuildRun` is doit's command plugin named ``run``: the ``doit.COMMAND``
entry point of the installed package, or ``[tool.doit.plugins.command] run =
"neuron_build.build.doit.run:BuildRun"`` in ``pyproject.toml`` (``[COMMAND]`` in ``doit.cfg``). With any
other ``dodo.py`` it is doit's own ``run``, exit codes included.

``doit build`` in a subfolder of a neuron-build project, or beside a ``buckets.toml`` without ``dodo.py``:
one line and exit 2, not doit's exit 3. doit looks for ``dodo.py`` in the current folder only
(``--seek-file`` searches the parents); without it, doit says "Could not find dodo file" and exits 3, which in
neuron-build's table means a gate refused a promotion. :class:`Run` is doit's own ``run`` command that, only
when a parent folder holds a neuron-build project (``dodo.py`` beside ``buckets.toml``), or this folder or a
parent holds ``buckets.toml`` without ``dodo.py``, says where it is and what to run instead, and exits 2
(:class:`~neuron_build.errors.ExitCode`). Everywhere else it is doit's ``run`` unchanged; :class:`BuildRun`
is a ``Run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from doit.cmd_run import Run as _DoitRun
from doit.cmdparse import CmdOption, CmdParse, CmdParseError
from doit.doit_cmd import DoitMain
from doit.exceptions import InvalidCommand, InvalidDodoFile, InvalidTask, TaskFailed, UnmetDependency

from neuron_build.errors import ExitCode

__all__ = ["BuildMain", "BuildRun", "Run", "is_neuron_build", "project_above", "seek_hint"]

_USAGE = (CmdParseError, InvalidDodoFile, InvalidCommand, InvalidTask)


def project_above(folder: Path) -> Path | None:
    """The nearest parent of ``folder`` that holds a neuron-build project (``dodo.py`` and ``buckets.toml``)."""
    for p in folder.resolve().parents:
        if (p / "dodo.py").is_file() and (p / "buckets.toml").is_file():
            return p
    return None


def seek_hint(folder: Path) -> str | None:
    """The one line for ``doit`` run in ``folder`` below a neuron-build project, or in (or below) a folder
    holding ``buckets.toml`` but no ``dodo.py``; None elsewhere (doit's own error stays)."""
    root = project_above(folder)
    if root is None:
        here = folder.resolve()
        config = next((p for p in (here, *here.parents) if (p / "buckets.toml").is_file()), None)
        if config is None:
            return None
        return (f"no dodo.py in {config} beside buckets.toml: run `neuron-build build`, or write a dodo.py holding "
                f"`from neuron_build.tasks import *` (what `neuron-build init` writes) to build with doit")
    return (f"no dodo.py in {folder.resolve()}; the project is {root}: run `doit --seek-file build` (doit "
            f"searches the parent folders) or `neuron-build build` (it finds buckets.toml the same way)")


class Run(_DoitRun):
    """doit's ``run`` command; a missing ``dodo.py`` below a neuron-build project is a usage error (exit 2)."""

    name = "run"

    def execute(self, params: Any, args: list[str]) -> int:
        """doit's ``run``; returns 2 with one line on stderr when ``dodo.py`` is in a parent folder."""
        try:
            return super().execute(params, args)
        except InvalidDodoFile as e:
            hint = seek_hint(Path.cwd()) if str(e).startswith("Could not find dodo file") else None
            if hint is None:
                raise
            print(f"ERROR: {hint}", file=sys.stderr)
            return int(ExitCode.USAGE)


def is_neuron_build(namespace: dict[str, Any] | None) -> bool:
    """Whether a doit namespace (a loaded ``dodo.py``) is neuron-build's: its ``DOIT_CONFIG`` reports through
    a :class:`~neuron_build.build.doit.report.BuildReporter`."""
    from neuron_build.build.doit.report import BuildReporter  # here: another dodo.py's doit never imports it

    cfg = (namespace or {}).get("DOIT_CONFIG")
    rep = cfg.get("reporter") if isinstance(cfg, dict) else None
    return isinstance(rep, BuildReporter) or (isinstance(rep, type) and issubclass(rep, BuildReporter))


class _Failures:
    """A reporter that passes everything to the one it wraps and remembers whether a real error (not a task
    failure, not a task skipped because a task it depends on failed) happened."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.errors = 0
        self.unmet = 0

    def add_failure(self, task: Any, fail: Any) -> None:
        if isinstance(fail, UnmetDependency):
            self.unmet += 1
        elif not isinstance(fail, TaskFailed):
            self.errors += 1
        self._inner.add_failure(task, fail)

    def runtime_error(self, msg: str) -> None:
        self.errors += 1
        self._inner.runtime_error(msg)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def _forward(name: str) -> Any:
    def method(self: _Failures, *args: Any) -> Any:
        return getattr(self._inner, name)(*args)
    method.__name__ = name
    return method


# doit's reporter interface, as methods of the class: doit's process runner asks the class which it has
for _name in ("initialize", "get_status", "execute_task", "add_success", "skip_uptodate", "skip_ignore",
              "cleanup_error", "teardown_task", "complete_run"):
    setattr(_Failures, _name, _forward(_name))


class BuildRun(Run):
    """doit's ``run`` with the project's exit codes (see the module docstring).

    * A usage error found once ``dodo.py`` is loaded (an unknown task, a task option it does not take, an
      invalid task): doit's ``ERROR: <message>`` line on stderr, exit 2 (doit's ``DoitMain`` says 3, the
      gate-refusal code).
    * Tasks failed and others were skipped because of them (doit's ``UnmetDependency`` of the group task
      ``build``, a task *error* to doit: exit 2): exit 1 unless a real error happened.
    * A negative ``-n/--process`` (doit would fail every task and exit 0): one ``ERROR:`` line, exit 2.
    * Ctrl-C: 130 (the reporter's summary names the interrupted targets); a closed pipe: 141, as a shell's
      SIGPIPE; no traceback.

    Only for a neuron-build ``dodo.py`` (:func:`is_neuron_build`) or when :attr:`always` is set
    (:class:`BuildMain`); otherwise exactly doit's ``run``.
    """

    name = "run"
    #: apply the exit-code table whatever the loaded namespace (``neuron-build build``'s own loader)
    always = False
    #: how the command was named (doit's ``InvalidCommand`` words it): True ``run`` was named, False it was
    #: doit's default command, None: read doit's own command line (``sys.argv``) as ``DoitMain.run`` does
    named: bool | None = None

    def _ours(self) -> bool:
        return self.always or is_neuron_build(getattr(self.loader, "namespace", None))

    def _named(self) -> bool:
        """Whether ``run`` was named on doit's command line (doit's own parse: loader options, then
        ``name=value`` variables, then the command name)."""
        if self.named is not None:
            return self.named
        try:
            _, args = CmdParse([CmdOption(o) for o in self.loader.cmd_options]).parse_only(sys.argv[1:])
        except CmdParseError:
            args = sys.argv[1:]
        args = [a for a in args if "=" not in a or a.startswith("-")]
        return bool(args) and args[0] == self.get_name()

    def execute(self, params, args):
        """doit's ``Run.execute``, its outcome mapped to the exit-code table (see the class docstring)."""
        self._failures: _Failures | None = None
        try:
            rc = super().execute(params, args)
        except _USAGE as err:
            if not self._ours():
                raise
            if isinstance(err, InvalidCommand):  # as DoitMain.run words it: was `run` named?
                err.bin_name = self.bin_name
                err.cmd_used = self.get_name() if self._named() else None
            sys.stderr.write(f"ERROR: {err}\n")
            return 2
        except KeyboardInterrupt:
            if not self._ours():
                raise
            return 130
        except BrokenPipeError:
            if not self._ours():
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
            return 141
        f = self._failures
        if rc == 2 and f is not None and f.unmet and not f.errors and self._ours():
            return 1
        return rc

    def _execute(self, outfile, verbosity=None, always=False, continue_=False, reporter="console",
                 num_process=0, par_type="process", single=False, auto_delayed_regex=False,
                 force_verbosity=False, failure_verbosity=0, pdb=False):
        """doit's ``Run._execute`` with its reporter wrapped to tell task failures from errors; a negative
        ``num_process`` (doit's ``-n``) is a usage error (exit 2), not every task failed and exit 0."""
        if isinstance(num_process, int) and num_process < 0 and self._ours():
            sys.stderr.write(f"ERROR: -n/--process {num_process}: not a number of processes; give 0 (compile in "
                             f"this process) or a positive count, e.g. -n 2\n")
            return 2
        rep = self.reporters[reporter] if isinstance(reporter, str) else reporter
        if isinstance(rep, type):  # doit makes it with the outstream it opens: wrap what it makes
            run, cls = self, rep

            class Wrapped(_Failures):
                def __init__(self, outstream: Any, options: dict):
                    super().__init__(cls(outstream, options))
                    run._failures = self
            wrapped: Any = Wrapped
        else:
            wrapped = self._failures = _Failures(rep)
        return super()._execute(outfile, verbosity=verbosity, always=always, continue_=continue_,
                                reporter=wrapped, num_process=num_process, par_type=par_type, single=single,
                                auto_delayed_regex=auto_delayed_regex, force_verbosity=force_verbosity,
                                failure_verbosity=failure_verbosity, pdb=pdb)


class _NamedRun(BuildRun):
    always = True
    named = True


class BuildMain(DoitMain):
    """doit's ``DoitMain`` with :class:`BuildRun` as its ``run`` (always the exit-code table), for
    ``neuron-build build``, which names ``run`` on the command line it passes."""

    DOIT_CMDS = tuple(_NamedRun if c is Run else c for c in DoitMain.DOIT_CMDS)

    def get_cmds(self):
        """doit's commands and command plugins, ``run`` always this one's."""
        cmds = super().get_cmds()
        cmds["run"] = _NamedRun
        return cmds
