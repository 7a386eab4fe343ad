"""doit's reporter for builds: doit's console report, plus the build's progress display and its summary.

:class:`BuildReporter` is the reporter of ``doit build`` through ``dodo.py`` (``DOIT_CONFIG["reporter"]``,
over the ``dodo.py`` session) and of ``neuron-build build``. Beside what doit's :class:`~doit.reporter.ConsoleReporter` does, it

- makes the session's :class:`~neuron_build.build.display.BuildDisplay` when the run starts (M of "N of
  M": the ``build:`` tasks selected, less those found up to date) and stops it when the run ends, Ctrl-C
  and failures included (doit calls ``complete_run`` from a ``finally``);
- leaves out doit's ``.  build:<target>`` line while the live display shows (it shows the target);
- prints a failed ``build:`` task's error once: in the summary, not also as doit's ``TaskFailed`` report;
- for ``doit build``, prints the build's summary at the end (``neuron-build build`` prints its own, from
  the same :class:`~neuron_build.build.summary.BuildSummary`).
"""

from __future__ import annotations

import sys
from typing import Any

from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

PREFIX = "build:"


def _target_of(task: Any) -> str | None:
    name = getattr(task, "name", "")
    return name[len(PREFIX):] if name.startswith(PREFIX) and name != PREFIX + "(push)" else None


class BuildReporter(ConsoleReporter):
    """doit's console reporter over a :class:`~neuron_build.tasks.BuildSession` (see the module docstring).

    Args:
        outstream: where doit's report and the summary go (doit passes its ``outfile``).
        options: doit's reporter options (``failure_verbosity``).
        session: the session whose builds it reports, or a function that returns it when first needed
            (``dodo.py``'s: :func:`neuron_build.tasks.session`).
        summary: print the summary at the end (``doit build``; ``neuron-build build`` prints its own).
    """

    desc = "console output with build progress and one summary"

    def __init__(self, outstream: Any, options: dict | None = None, session: Any = None, summary: bool = False):
        super().__init__(outstream, options or {})
        self._session = session
        self.summary = summary
        self.selected: list[str] = []               # target ids of the build: tasks selected, matrix order
        self.reported: dict[str, str | None] = {}    # target id -> None (passed) or doit's failure message

    @property
    def session(self) -> Any:
        """The :class:`~neuron_build.tasks.BuildSession` reported on."""
        if callable(self._session) and not hasattr(self._session, "outcomes"):
            self._session = self._session()
        return self._session

    def initialize(self, tasks: dict, selected_tasks: list[str]) -> None:
        """Find the ``build:`` tasks the run may execute (through ``task_dep``) and make the display."""
        seen: set[str] = set()
        stack = list(selected_tasks)
        while stack:
            name = stack.pop()
            if name in seen or name not in tasks:
                continue
            seen.add(name)
            stack.extend(tasks[name].task_dep)
        s = self.session
        wanted = {t for t in (_target_of(tasks[n]) for n in seen) if t is not None}
        order = s.target_ids()
        self.selected = [t for t in order if t in wanted] + sorted(wanted - set(order))
        if self.selected:
            if getattr(s, "pending", None) is None and hasattr(s, "to_build"):  # doit build: M exact from the start
                s.pending = s.to_build(self.selected)
            s.display = s.make_display(len(self.selected))

    def _display(self) -> Any:
        return getattr(self.session, "display", None)

    def skip_uptodate(self, task: Any) -> None:
        tid = _target_of(task)
        d = self._display() if tid is not None else None
        if d is not None:
            d.skipped(tid)
        super().skip_uptodate(task)

    def execute_task(self, task: Any) -> None:
        tid, d = _target_of(task), self._display()
        if tid is not None and d is not None:
            d.started(tid)  # (again in the build itself; a `doit -P process` runner's build cannot tell it)
            if d.live:
                return  # the live display names it
        super().execute_task(task)

    def _finished_elsewhere(self, tid: str, msg: str | None) -> None:
        """A build that ran in a ``doit -P process`` runner: the display learns of its end from doit."""
        d = self._display()
        if d is not None and tid not in self.session.outcomes:
            from neuron_build.build.summary import reported_outcome

            d.finished(reported_outcome(tid, msg))

    def write(self, text: str) -> None:
        d = self._display()
        if d is not None and d.showing and getattr(self.outstream, "isatty", lambda: False)():
            for line in text.rstrip("\n").splitlines():
                d.note(line)  # above the live area, not through it
            return
        super().write(text)

    def add_success(self, task: Any) -> None:
        tid = _target_of(task)
        if tid is not None:
            self.reported[tid] = None
            self._finished_elsewhere(tid, None)
        super().add_success(task)

    def add_failure(self, task: Any, fail: Any) -> None:
        tid = _target_of(task)
        if tid is None:
            if task.name == "build" and isinstance(fail, UnmetDependency):
                return  # the group task: its failed targets are in the summary already
            return super().add_failure(task, fail)
        self.reported[tid] = fail.get_msg()
        self._finished_elsewhere(tid, self.reported[tid])
        if isinstance(fail, TaskFailed):
            return  # the build's failure, not a bug: the summary prints it, with the command showing its log
        super().add_failure(task, fail)

    def complete_run(self) -> None:
        """Stop the display, then doit's end report, then (``doit build``) the summary."""
        s = self.session
        d = getattr(s, "display", None)
        if d is not None:
            d.stop()
        super().complete_run()
        if self.summary and self.selected:
            from neuron_build.build.summary import from_outcomes

            # called from doit's `finally`: a Ctrl-C is still on its way up
            interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
            hits = list(s.hits)
            if interrupted:  # doit stopped before it checked every task: those up to date are not interrupted
                seen = set(hits) | set(s.outcomes) | set(self.reported)
                hits += s.up_to_date([t for t in self.selected if t not in seen])
            summary = from_outcomes(self.selected, s.outcomes, hits, self.reported, interrupted=interrupted)
            self.outstream.flush()
            summary.print(self.outstream)


__all__ = ["BuildReporter"]
