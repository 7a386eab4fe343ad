"""The progress of ``push``, ``fetch`` and ``pull`` for people, on stderr (stdout may carry ``--json``).

On a terminal (as :func:`neuron_build.build.display.wants_live` decides: a TTY, not ``TERM=dumb``, rich
installed) a rich progress bar with the bytes done of the total, the rate and an ETA. Elsewhere (CI, pipes,
logs) one plain line per file copied::

    push tiny/b1/fp32/p1 model.pt: 4,200 bytes (1/4 files, 4,200 of 16,800 bytes, ETA 1 s)

Files the destination held already are neither counted nor printed. The unit of
progress is one file: a blob is copied by one store call.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from neuron_build.build.display import make_console, wants_live
from neuron_build.build.progress import format_duration
from neuron_build.cli.app import display_text
from neuron_build.store.sync import TransferProgress
from neuron_build.util import plural


class TransferDisplay(TransferProgress):
    """A :class:`~neuron_build.store.sync.TransferProgress` that draws (see the module docstring).

    Args:
        verb: ``push``, ``fetch`` or ``pull``: the first word of each line.
        stream: where it writes (default stderr).
        live: force the rich bar on or off (None: :func:`wants_live` of ``stream``).
    """

    def __init__(self, verb: str, stream: Any = None, live: bool | None = None):
        self.verb = verb
        self.stream = sys.stderr if stream is None else stream
        self.live = wants_live(self.stream) if live is None else live
        self.files = self.nbytes = 0
        self.done_files = self.done_bytes = 0
        self.started = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def begin(self, files: int, nbytes: int) -> None:
        self.files, self.nbytes = files, nbytes
        self.started = time.monotonic()
        if self.live and files:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=make_console(self.stream),
                                 transient=True)
            self._bar.start()
            self._task = self._bar.add_task(f"{self.verb} {plural(files, 'file')}", total=max(nbytes, 1))

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before any byte)."""
        elapsed = time.monotonic() - self.started
        if self.done_bytes <= 0 or elapsed <= 0:
            return None
        return max(0.0, (self.nbytes - self.done_bytes) / (self.done_bytes / elapsed))

    def file(self, target: str, name: str, size: int, copied: bool) -> None:
        if not copied:  # the destination had it: not part of the count
            return
        self.done_files += 1
        self.done_bytes += size
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done_bytes,
                             description=f"{self.verb} {self.done_files}/{self.files} {target} {name}")
        else:
            eta = self.eta_s()
            display_text(f"{self.verb} {target} {name}: {size:,} bytes ({self.done_files}/{self.files} files, "
                         f"{self.done_bytes:,} of {self.nbytes:,} bytes"
                         + (f", ETA {format_duration(eta)})" if eta is not None else ")"), stream=self.stream, flush=True)

    def end(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


__all__ = ["TransferDisplay"]
