"""Which compilers this host has, found without importing them (no torch import on the no-op path).

Versions come from installed package metadata (``importlib.metadata``): reading it costs a few file
reads, never an import. What the Neuron toolchain looks like, with the source of each fact:

- The real ``torch-neuronx``, ``neuronx-cc``, ``neuronx-distributed`` and ``libneuronxla`` are published
  only on AWS's Neuron package index, https://pip.repos.neuron.amazonaws.com [doc: Neuron setup guides].
- PyPI carries placeholder packages of the same names, version 1.0 / 1.0.post1, whose module has no
  ``trace`` [doc: toolchain notes].
- ``torch-neuronx`` is built for one torch minor release and says so in its metadata, e.g.
  ``Requires-Dist: torch==2.1.*`` [guess: the pin style; the version numbering ``2.1.2.2.x`` = torch
  2.1.2 + SDK 2.x is [seen]].
- The compiler's import name is ``neuronxcc`` (distribution ``neuronx-cc``), and it installs a
  ``neuronx-cc`` executable whose ``--version`` prints ``NeuronX Compiler version <version>`` [seen].
- Neuron devices appear as ``/dev/neuron0``, ``/dev/neuron1``, ... (one per Neuron device, each holding
  several NeuronCores) [doc: the Neuron container guides pass them as ``--device=/dev/neuron0``].

:func:`neuron_status` is the metadata-only verdict (safe on the no-op path); :func:`compiler_executable`
runs ``neuronx-cc --version`` and is only called by ``neuron-build doctor`` and the worker.
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache

from neuron_build.backends import AUTO, AUTO_FALLBACK, BACKENDS, TORCHNEURON_TARGETS, auto_choice, find_backend

#: AWS's Neuron pip repository [doc: Neuron setup guides, "--extra-index-url=https://pip.repos.neuron.amazonaws.com"].
NEURON_INDEX_URL = "https://pip.repos.neuron.amazonaws.com"
NEURON_INSTALL_COMMAND = (f"pip install --extra-index-url {NEURON_INDEX_URL} "
                          "neuronx-cc==2.* torch-neuronx neuronx-distributed")
NEURON_INSTALL_HINT = (f"install the real toolchain from AWS's Neuron package index ({NEURON_INSTALL_COMMAND}; "
                       "see \"On a Neuron host\" in README.md)")
#: The Neuron distributions, in the order they are reported.
NEURON_DISTS = ("torch-neuronx", "neuronx-cc", "neuronx-distributed", "libneuronxla")
#: ``neuronx-cc --version`` output [seen]: ``NeuronX Compiler version 2.14.227.0+2d4f85be``.
_CC_VERSION_RE = re.compile(r"NeuronX Compiler version\s+(\S+)")


@cache
def version(dist: str) -> str | None:
    """Installed version of a distribution, or None when it is not installed. Cached per process."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@cache
def _requires(dist: str) -> tuple[str, ...]:
    try:
        return tuple(md.requires(dist) or ())
    except md.PackageNotFoundError:
        return ()


def clear_caches() -> None:
    """Forget cached metadata (tests that switch the installed toolchain within one process)."""
    version.cache_clear()
    _requires.cache_clear()
    torch_neuronx_api.cache_clear()


def torch_requirement(dist: str = "torch-neuronx") -> str | None:
    """The ``torch`` version specifier that ``dist`` declares (``"==2.1.*"``), or None when it declares
    none (or is not installed). Environment markers are honoured."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in _requires(dist):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower().replace("_", "-") != "torch":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        return str(req.specifier) or None
    return None


def torch_matches(spec: str, torch_version: str) -> bool:
    """Whether ``torch_version`` (e.g. ``"2.13.0+cpu"``) satisfies ``spec`` (e.g. ``"==2.13.*"``); the
    local label (``+cpu``) is ignored, as PEP 440 says for ``==`` prefix matches. An unparsable version
    counts as matching (nothing is reported that cannot be shown)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(torch_version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


def neuron_devices() -> list[str]:
    """The Neuron device files of this host (``/dev/neuron0``, ...), sorted; empty without Neuron
    hardware [doc: containers get them with ``--device=/dev/neuronN``]."""
    found = [p for p in glob.glob("/dev/neuron*") if re.fullmatch(r"/dev/neuron\d+", p)]
    return sorted(found, key=lambda p: int(p[len("/dev/neuron"):]))


@dataclass(frozen=True)
class NeuronStatus:
    """What was found of the Neuron toolchain, from package metadata only.

    ``kind`` is ``ok``, ``missing`` (no torch-neuronx), ``placeholder`` (PyPI's placeholder packages),
    ``torch_mismatch`` (torch-neuronx built for another torch) or ``incomplete`` (torch-neuronx without
    the neuronx-cc compiler). ``usable`` is True only for ``ok``. ``problem`` is one sentence saying
    what is wrong and how to install the real toolchain (None when usable). ``versions`` maps each of
    :data:`NEURON_DISTS` to its installed version or None; ``torch`` is the installed torch version and
    ``torch_requirement`` the torch specifier torch-neuronx declares.
    """

    usable: bool
    problem: str | None
    versions: dict[str, str | None]
    kind: str = "ok"
    torch: str | None = None
    torch_requirement: str | None = None

    @property
    def verdict(self) -> str:
        """One sentence: the problem, or what was found when the toolchain is usable."""
        if self.problem:
            return self.problem
        return (f"The Neuron toolchain is installed: torch-neuronx {self.versions['torch-neuronx']} with "
                f"neuronx-cc {self.versions['neuronx-cc']} for torch {self.torch}.")


def neuron_status() -> NeuronStatus:
    """Detect torch-neuronx, neuronx-cc, neuronx-distributed and libneuronxla from package metadata.

    Never imports them (nor torch). The worker imports ``torch_neuronx`` and reports a module without
    ``trace`` (the placeholder, whatever its version says) in the same words.
    """
    versions = {d: version(d) for d in NEURON_DISTS}
    torch_v = version("torch")
    tnx, ncc = versions["torch-neuronx"], versions["neuronx-cc"]

    def status(kind: str, problem: str | None, req: str | None = None) -> NeuronStatus:
        return NeuronStatus(problem is None, problem, versions, kind, torch_v, req)

    if tnx is None or importlib.util.find_spec("torch_neuronx") is None:
        return status("missing", "The Neuron toolchain is not installed (no torch-neuronx package); "
                                 f"{NEURON_INSTALL_HINT}.")
    if tnx.startswith("1.0") or (ncc or "").startswith("1.0"):
        found = f"torch-neuronx {tnx}" + (f", neuronx-cc {ncc}" if ncc else "")
        return status("placeholder", f"The Neuron toolchain is not installed (found the PyPI placeholder: {found}); "
                                     f"uninstall them and {NEURON_INSTALL_HINT}.")
    req = torch_requirement("torch-neuronx")
    if req and torch_v and not torch_matches(req, torch_v):
        return status("torch_mismatch", f"The installed torch-neuronx {tnx} is built for torch{req} but torch "
                                        f"{torch_v} is installed; install the torch-neuronx release for torch "
                                        f"{torch_v} (or the torch it requires) from AWS's Neuron package index "
                                        f"({NEURON_INDEX_URL}; see \"On a Neuron host\" in README.md).", req)
    if ncc is None:
        return status("incomplete", f"The Neuron toolchain is incomplete: torch-neuronx {tnx} is installed but the "
                                    f"neuronx-cc compiler is not; {NEURON_INSTALL_HINT}.", req)
    return status("ok", None, req)


@dataclass(frozen=True)
class CompilerExecutable:
    """The ``neuronx-cc`` executable on PATH: its path (None when absent), the version its ``--version``
    prints (None when it could not be run or read) and, when that failed, why (``error``)."""

    path: str | None
    version: str | None = None
    error: str | None = None
    output: str = field(default="", repr=False)


def compiler_executable(timeout_s: float = 60.0) -> CompilerExecutable:
    """Find ``neuronx-cc`` on PATH and run ``neuronx-cc --version`` (not on the no-op path: it starts
    a Python interpreter). Never raises."""
    path = shutil.which("neuronx-cc")
    if path is None:
        return CompilerExecutable(None, error="neuronx-cc is not on PATH")
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return CompilerExecutable(path, error=f"`neuronx-cc --version` failed: {e}")
    out = (proc.stdout + proc.stderr).decode("utf-8", "replace")
    m = _CC_VERSION_RE.search(out)
    if proc.returncode != 0 or not m:
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "no output")
        return CompilerExecutable(path, error=f"`neuronx-cc --version` exited with {proc.returncode}: {first[:200]}",
                                  output=out)
    return CompilerExecutable(path, m.group(1), output=out)


#: The backends that compile for a Neuron hardware target (``[build] target``): the records of
#: :data:`neuron_build.backends.BACKENDS` with ``neuron_toolchain``.
NEURON_BACKENDS = tuple(b.name for b in BACKENDS.values() if b.neuron_toolchain)

#: Run in a fresh interpreter by :func:`torch_neuronx_api`: which API the installed torch_neuronx has.
_API_PROBE = r"""
import json, sys
out = {"imports": False, "trace": False, "native": False, "dynamo_backend": False, "error": None}
try:
    import torch, torch_neuronx
    out["imports"] = True
    out["trace"] = callable(getattr(torch_neuronx, "trace", None))
    out["native"] = torch._C._get_privateuse1_backend_name() == "neuron" and hasattr(torch, "neuron")
    out["dynamo_backend"] = "neuron" in torch._dynamo.list_backends(exclude_tags=())
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:300]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class TorchNeuronxApi:
    """Which torch-neuronx product is installed, told apart by API, never by package name or version:
    ``xla`` (``torch_neuronx.trace`` exists: the XLA library, the ``neuron`` backend's path, the only one on
    trn1/inf2), ``native`` (importing it registers the ``neuron`` device through PrivateUse1 and the
    ``neuron`` Dynamo backend: TorchNeuron, the ``torchneuron`` backend's path) [doc; guess: probe both],
    ``none`` (neither: the PyPI placeholder, or a module that does not import; ``error`` says why)."""

    kind: str
    trace: bool = False
    native: bool = False
    dynamo_backend: bool = False
    error: str | None = None

    @property
    def description(self) -> str:
        return {"xla": "XLA torch-neuronx (torch_neuronx.trace): backend neuron",
                "native": "TorchNeuron, the native backend (the neuron device, torch.compile(backend=\"neuron\")): "
                          "backend torchneuron",
                }.get(self.kind, f"neither API ({self.error or 'no trace and no neuron device'})")


@cache
def torch_neuronx_api(timeout_s: float = 120.0) -> TorchNeuronxApi:
    """Probe the installed torch_neuronx's API in a fresh interpreter (importing it registers devices and
    costs seconds, so never in this process; cached per process). Only called when the metadata says a
    usable toolchain is installed (:func:`neuron_status`). Never raises."""
    import json
    import sys

    try:
        proc = subprocess.run([sys.executable, "-c", _API_PROBE], capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        d = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return TorchNeuronxApi("none", error=f"the probe failed: {e}")
    kind = "native" if d.get("native") else ("xla" if d.get("trace") else "none")
    return TorchNeuronxApi(kind, bool(d.get("trace")), bool(d.get("native")), bool(d.get("dynamo_backend")),
                           d.get("error"))


def resolve_backend(requested: str, target: str | None = None) -> tuple[str, str | None]:
    """Resolve ``auto``: ``torchneuron`` when the toolchain is usable, ``target`` is trn2/trn3 and the
    installed torch-neuronx is the native one (by API, :func:`torch_neuronx_api`); ``neuron`` when the
    toolchain is usable otherwise; else ``inductor``.

    Returns:
        (backend, note): ``note`` says why ``auto`` fell back, else None.
    """
    if requested != AUTO:
        return requested, None
    st = neuron_status()
    if st.usable:
        api = torch_neuronx_api()
        chosen = auto_choice(api.kind, target)
        if chosen is not None:
            return chosen, None
        return AUTO_FALLBACK, (f"backend auto: using {AUTO_FALLBACK} because the installed torch-neuronx is "
                               f"TorchNeuron (the native backend), which serves only {'/'.join(TORCHNEURON_TARGETS)}, "
                               f"and target = \"{target}\"; trn1 and inf2 need the XLA torch-neuronx (backend neuron)")
    reason = st.problem[0].lower() + st.problem[1:] if st.problem else ""
    return AUTO_FALLBACK, f"backend auto: using {AUTO_FALLBACK} because {reason}"


_announced: set[str] = set()


def announce_backend(note: str | None) -> bool:
    """Log ``note`` (the ``auto`` fallback) once per process, as one line: its first clause, then where
    to read more (``neuron-build doctor``). Returns True when it was logged now."""
    if not note or note in _announced:
        return False
    _announced.add(note)
    from neuron_build.log import get_logger
    get_logger().info(f"{note.split('; ')[0].rstrip('.')}; `neuron-build doctor` shows how to install it")
    return True


def toolchain_versions(backend: str) -> dict[str, str | None]:
    """The compiler versions that are part of the key and the manifest for ``backend``: torch, and for
    neuron and torchneuron the versions of :data:`NEURON_DISTS` from package metadata."""
    out: dict[str, str | None] = {"torch": version("torch")}
    spec = find_backend(backend)
    if spec is not None and spec.neuron_toolchain:
        out.update(neuron_status().versions)
    return out


__all__ = ["NEURON_BACKENDS", "NEURON_DISTS", "NEURON_INDEX_URL", "NEURON_INSTALL_COMMAND", "NEURON_INSTALL_HINT",
           "TORCHNEURON_TARGETS", "CompilerExecutable", "NeuronStatus", "TorchNeuronxApi", "announce_backend",
           "clear_caches", "compiler_executable", "neuron_devices", "neuron_status", "resolve_backend",
           "toolchain_versions", "torch_matches", "torch_neuronx_api", "torch_requirement", "version"]
