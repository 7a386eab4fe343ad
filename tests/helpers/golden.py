"""Golden CLI outputs: a command's stdout, stderr and exit code as one plain-text transcript, normalised for what
varies between runs and hosts (paths, times, durations, sizes, content keys, release ids, host and user names,
versions), compared with a committed file under ``tests/golden/``.

Everything the normaliser does not replace is kept byte for byte, so a changed message, column, order or exit
code shows up as a diff. Keys and release ids become numbered placeholders (``<KEY1>``, ``<KEY2>``, ``<R1>``) by
first appearance in one transcript, so the transcript still shows which lines share a key; a short key printed
as a prefix (``893b1c0f2f23``) gets the number of the full key it starts (and the other way round).

``pytest tests/flows/test_golden.py --update-golden`` rewrites the files instead of comparing
(tests/conftest.py registers the option and prints the files it changed)."""

from __future__ import annotations

import difflib
import getpass
import json
import os
import platform
import re
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.cli import REPO

#: where the golden files live (one ``<name>.txt`` per checked command)
GOLDEN_DIR = REPO / "tests" / "golden"
#: the command that accepts changed outputs, printed with every mismatch
UPDATE_HINT = "run pytest tests/flows/test_golden.py --update-golden to accept"
#: ``config.stash`` slot of the golden files an ``--update-golden`` run wrote (tests/conftest.py prints them)
CHANGED = pytest.StashKey[list]()

#: JSON log fields (stderr's JSON lines) whose values vary between runs, and their placeholders
_JSON_FIELDS = {"timestamp": "<TIME>", "bytes": "<BYTES>", "reads": "<READS>", "pid": "<PID>", "host": "<HOST>",
                "hostname": "<HOST>"}
#: placeholders of values whose printed width varies: the spaces next to them are collapsed to two
_VARIABLE_WIDTH = ("<S>", "<MS>", "<MiB>", "<AGE>", "<BYTES>", "<ERR>")

_STAMP = re.compile(r"\b\d{8}T\d{6}(?:\.\d+)?Z(?:-[0-9a-f]{8})?\b")  # failure workdir names
_TIME = re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:\d\d| UTC)?")
_DATE = re.compile(r"\b\d{4}-\d\d-\d\d\b")
_RELEASE = re.compile(r"\br-[0-9a-f]{8,64}\b")
_HEX = re.compile(r"\b[0-9a-f]{12,64}\b")
_AGE = re.compile(r"\b(?:\d+[dhms])+ ago\b")
_CLOCK = re.compile(r"\b(?:\d+h)?\d+m\d\ds\b")  # 1m05s, 2h03m00s (the ETA and "usually" forms)
_SECONDS = re.compile(r"(?<!at most )\b\d+(?:\.\d+)? ?s\b(?! ago)")
_MILLIS = re.compile(r"\b\d+(?:\.\d+)? ?ms\b")
_MIB = re.compile(r"\b\d+(?:\.\d+)? ?(?:MiB|MB|GiB|KiB)\b")
_PID = re.compile(r"\bpid[ =:]?\d+\b")
# show's size rows (``bytes    4200``; ``  model.pt    4200  58cb74ae0665e669``)
_BYTES_ROW = re.compile(r"^(bytes +)\d+$|^(  \S+ +)\d+((?:  \S+)?)$", re.M)
# the report's per-target compile times (``compile s [3.7, 12.1]``), its p95 figure, and the slowest target
_COMPILE_LIST = re.compile(r"compile s \[[\d., ]*\]")
_P95_FIGURE = re.compile(r"^(compile_time_p95_s +)\d+(?:\.\d+)?", re.M)
_SLOWEST = re.compile(r"slowest \S+ <S>")
# validate's figures: floating-point error depends on the CPU's kernels
_ERRORS = re.compile(r"\b(rel L2 error|max abs error|cosine) [-+\d.e]+")


@dataclass
class Normaliser:
    """Turns one transcript's run- and host-specific text into placeholders. ``paths`` maps absolute folders to
    their placeholder (``<PROJECT>``, ``<REPO>``, ``<HOME>``); the longest is replaced first. Key and release
    numbering restarts with every call."""

    paths: dict[str, str]
    host: str = field(default_factory=socket.gethostname)
    user: str = field(default_factory=getpass.getuser)
    versions: dict[str, str] = field(default_factory=dict)

    def __call__(self, text: str) -> str:
        keys: list[str] = []
        releases: list[str] = []
        lines = [self._json_line(line) for line in text.split("\n")]
        text = "\n".join(lines)
        for path, name in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(path, name)
        for value, name in self.versions.items():
            if value:
                text = re.sub(rf"(?<![\w.]){re.escape(value)}(?![\w.])", name, text)
        if self.user and self.host:
            text = text.replace(f"{self.user}@{self.host}", "<USER>@<HOST>")
        if self.host:  # only where a host is named: "on HOST", "@HOST" (a bare word may be any word)
            text = re.sub(rf"(?<=\bon )(?:{re.escape(self.host)})(?![\w-])|(?<=@){re.escape(self.host)}(?![\w-])",
                          "<HOST>", text)
        text = _STAMP.sub("<STAMP>", text)
        text = _TIME.sub("<TIME>", text)
        text = _DATE.sub("<DATE>", text)
        text = _RELEASE.sub(lambda m: _numbered(m.group(0), releases, "R"), text)
        text = _HEX.sub(lambda m: _numbered(m.group(0), keys, "KEY"), text)
        text = _AGE.sub("<AGE> ago", text)
        text = _CLOCK.sub("<S>", text)
        text = _MILLIS.sub("<MS>", text)
        text = _SECONDS.sub("<S>", text)
        text = _MIB.sub("<MiB>", text)
        text = _PID.sub("pid <PID>", text)
        text = _BYTES_ROW.sub(lambda m: f"{m.group(1)}<BYTES>" if m.group(1) else f"{m.group(2)}<BYTES>{m.group(3)}",
                              text)
        text = _COMPILE_LIST.sub("compile s [<S>]", text)
        text = _P95_FIGURE.sub(r"\g<1><S>", text)
        text = _SLOWEST.sub("slowest <TARGET> <S>", text)
        text = _ERRORS.sub(r"\1 <ERR>", text)
        for p in _VARIABLE_WIDTH:
            text = re.sub(rf" {{2,}}{re.escape(p)}", f"  {p}", text)
            text = re.sub(rf"{re.escape(p)} {{2,}}(?=\S)", f"{p}  ", text)
        return text

    @staticmethod
    def _json_line(line: str) -> str:
        """A JSON log line (stderr's events) with its varying fields replaced: the timestamp, every ``*_s``,
        ``*_ms`` and ``*_mb`` figure, sizes, the packages a compile read. Other lines are returned as they are."""
        if not line.startswith("{"):
            return line
        try:
            ev = json.loads(line)
        except ValueError:
            return line
        if not isinstance(ev, dict):
            return line
        for k in ev:
            if k in _JSON_FIELDS:
                ev[k] = _JSON_FIELDS[k]
            elif k.endswith("_s"):
                ev[k] = "<S>"
            elif k.endswith("_ms"):
                ev[k] = "<MS>"
            elif k.endswith("_mb"):
                ev[k] = "<MiB>"
        return json.dumps(ev)


def _numbered(token: str, seen: list[str], prefix: str) -> str:
    """``<PREFIXn>``: n is the 1-based position of the first token in ``seen`` that ``token`` starts or that
    starts ``token`` (a short key and its full form share a number); a new token is appended."""
    for i, s in enumerate(seen):
        if s.startswith(token) or token.startswith(s):
            if len(token) > len(s):
                seen[i] = token
            return f"<{prefix}{i + 1}>"
    seen.append(token)
    return f"<{prefix}{len(seen)}>"


def normaliser_for(project: Path, store: Path | None = None) -> Normaliser:
    """The normaliser of a test project: its folder (resolved and as given) is ``<PROJECT>``, a store outside it
    ``<STORE>``, the checkout ``<REPO>``, ``$HOME`` ``<HOME>``; the torch and Python versions and this host's
    CPU ISA (what AOTInductor calls it) become ``<TORCH>``, ``<PYTHON>``, ``<ISA>``."""
    from neuron_build.cpu_isa import host_cpu_isa

    paths: dict[str, str] = {}
    for p, name in ((Path.home(), "<HOME>"), (REPO, "<REPO>"), (project, "<PROJECT>"), (store, "<STORE>")):
        if p is not None:
            for form in {str(p), str(Path(p).resolve()), os.path.realpath(p)}:
                if form not in ("/", ""):
                    paths[form] = name
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = ""
    versions = {torch: "<TORCH>", platform.python_version(): "<PYTHON>", host_cpu_isa(): "<ISA>"}
    return Normaliser(paths=paths, versions=versions)


def transcript(args: Sequence[str], returncode: int, stdout: str, stderr: str, normalise: Normaliser) -> str:
    """One golden transcript: ``$ neuron-build ARGS``, ``--- stdout``, its lines, ``--- stderr``, its lines,
    ``[exit N]``; normalised as one text, so a key in stdout and stderr gets one number."""
    def block(s: str) -> str:
        return s if not s or s.endswith("\n") else s + "\n"
    text = (f"$ neuron-build {shlex.join(args)}\n--- stdout\n{block(stdout)}--- stderr\n{block(stderr)}"
            f"[exit {returncode}]\n")
    return normalise(text)


def check_golden(name: str, actual: str, update: bool, directory: Path = GOLDEN_DIR) -> bool:
    """Compare ``actual`` with ``directory/<name>.txt``. With ``update``, write the file instead; return whether
    it changed (False when it already held ``actual``). Without, fail the test with a unified diff and
    :data:`UPDATE_HINT` when they differ or the file is missing.

    Raises: ``pytest.fail.Exception`` on a mismatch (not with ``update``)."""
    path = directory / f"{name}.txt"
    expected = path.read_text() if path.exists() else None
    if expected == actual:
        return False
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return True
    if expected is None:
        pytest.fail(f"no golden file {path.relative_to(REPO)}; {UPDATE_HINT}", pytrace=False)
    diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        fromfile=f"tests/golden/{name}.txt (expected)",
                                        tofile=f"{name} (this run)"))
    pytest.fail(f"the output of `{name}` differs from tests/golden/{name}.txt:\n{diff}\n{UPDATE_HINT}",
                pytrace=False)
    return False  # unreachable; pytest.fail raises
