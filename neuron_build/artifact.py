"""Which file of an artifact is the loadable model, with which loader, and loading it.

One place for the three readers of compiled artifacts: releases (which file and loader a release records
per bucket), validation and benchmarks (the artifact in the store, on its device) and the runtime (a pulled
release's buckets).

- **File**: the ``artifact`` the compiler recorded in the manifest's ``compiler`` section when the
  artifact holds that file, else ``model.pt2`` or ``model.pt`` (the first the artifact holds).
- **Loader**: the ``loader`` the compiler recorded, else by suffix: ``torch._inductor.aoti_load_package``
  for ``.pt2`` (AOTInductor), ``torch.jit.load`` for ``.pt`` (TorchScript; Neuron artifacts are
  TorchScript modules holding the NEFF and are placed on a NeuronCore when loaded [doc: toolchain notes]).

Core module: torch is imported only inside :func:`load_artifact`.
"""

from __future__ import annotations

import importlib
import itertools
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.backends import find_backend
from neuron_build.errors import UserError
from neuron_build.loaders import AOTI_LOADER, CACHE_LOADER, JIT_LOADER

#: The model files looked for, in this order, when the compiler recorded none the artifact holds.
MODEL_FILES = ("model.pt2", "model.pt")


def artifact_file(compiler: Mapping[str, Any] | None, files: Collection[str]) -> tuple[str, str] | None:
    """(file name, loader) of the loadable model among an artifact's files, or None when it holds none.

    Args:
        compiler: the manifest's ``compiler`` section (``artifact``: file name, ``loader``: how to load it;
            either may be missing, and a multi-file ``artifact`` list is not a single loadable file).
        files: the names of the artifact's files (the manifest's ``files``).
    """
    comp = compiler or {}
    name, loader = comp.get("artifact"), comp.get("loader")
    if not isinstance(name, str) or not name or name not in files:
        name = next((n for n in MODEL_FILES if n in files), None)
    if name is None:
        return None
    if not loader:
        loader = AOTI_LOADER if name.endswith(".pt2") else JIT_LOADER
    return name, loader


def load_artifact(path: str | Path, loader: str, backend: str, device: str | None = None, *,
                  explain_missing_neuronx: bool = True, shared_weights: Any = None) -> Any:
    """Load a compiled model file and return the callable module.

    ``.pt2`` files (or ``loader`` :data:`AOTI_LOADER`) go to ``torch._inductor.aoti_load_package``; anything
    else to ``torch.jit.load`` (its deprecation warning of torch 2.9+ silenced: Neuron artifacts need it),
    after ``import torch_neuronx`` for the neuron backend, which registers the Neuron TorchScript classes and
    places the NEFF on a NeuronCore [doc].

    Args:
        path: the model file.
        loader: the loader a release or manifest recorded (see :func:`artifact_file`).
        backend: ``inductor``, ``torchscript`` or ``neuron``.
        device: for TorchScript artifacts of other backends than neuron, the ``map_location`` (``cpu``,
            ``cuda``); None loads onto the device the module was saved from.
        explain_missing_neuronx: True: a missing torch-neuronx is a :class:`UserError` naming the file;
            False: its ``ImportError`` propagates (validation records it as the artifact failing to load).

    An artifact with external weights (``weights.json`` beside it) gets ``weights.safetensors`` checked
    against it (names, shapes, dtypes, from the header) before anything is loaded, then loaded into the model:
    an AOTInductor package by :func:`neuron_build.compilers.weights.load_into` (with ``shared_weights``, a
    :class:`neuron_build.compilers.weights.SharedWeights`, the tensors come from it, loaded once per file
    content and shared by every package given the same one), a Neuron model by
    ``torch_neuronx.replace_weights`` (:func:`neuron_build.compilers.neuron.external_weights.replace_into`).

    Raises:
        UserError: a neuron artifact and no torch-neuronx here (with ``explain_missing_neuronx``); external
            weights that do not fit the package (one line; nothing loaded).
        ImportError: the same, without it.
    """
    import torch

    from neuron_build.compilers import weights

    path = Path(path)
    why = weights.problem(path.parent)  # external weights: checked before the model is even loaded
    if why is not None:
        raise UserError(why)
    if loader == AOTI_LOADER or path.suffix == ".pt2":
        module = torch._inductor.aoti_load_package(str(path))
        if weights.read_spec(path.parent) is not None:
            state = shared_weights.get(path.parent) if shared_weights is not None else None
            weights.load_into(module, path.parent, state=state)
        return module
    spec = find_backend(backend)
    if spec is not None and spec.jit_registers:  # torch_neuronx: registers the Neuron TorchScript classes
        try:
            importlib.import_module(spec.jit_registers)
        except ImportError as e:
            if not explain_missing_neuronx:
                raise
            raise UserError(f"{path} was compiled for Neuron; loading it needs torch-neuronx on a "
                            f"Neuron host ({e})") from None
        device = None
    with warnings.catch_warnings():  # torch 2.9+ flags torch.jit.load as deprecated; Neuron artifacts need it
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(path)) if device is None else torch.jit.load(str(path), map_location=device)
    if spec is not None and spec.jit_registers and weights.read_spec(path.parent) is not None:
        from neuron_build.compilers.neuron.external_weights import replace_into

        replace_into(module, path.parent, shared_weights.get(path.parent) if shared_weights is not None else None)
    return module


# -- which installed versions can load an artifact ------------------------------------------------------


@dataclass(frozen=True)
class LoadRule:
    """What the serving host must have installed to load one kind of artifact.

    Attributes:
        kind: the artifact kind (a key of :data:`LOAD_RULES`).
        what: how the kind is named in messages (``AOTInductor package (.pt2)``).
        requires: package -> a function of the version the artifact was built with, returning the PEP 440
            specifier the installed version must satisfy (``"2.13.0"`` -> ``"==2.13.0"``).
        why: the rule in words, with its source, for messages and README.
    """

    kind: str
    what: str
    requires: dict[str, Callable[[str], str]]
    why: str


def _release(v: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.13.0+cpu`` -> ``(2, 13, 0)``)."""
    out = []
    for part in v.split("+", maxsplit=1)[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _same_release(v: str) -> str:
    return "==" + ".".join(map(str, _release(v)[:3]))


def _same_minor(v: str) -> str:
    return "==" + ".".join(map(str, _release(v)[:2])) + ".*"


def _this_or_newer_minor(v: str) -> str:
    r = _release(v)
    return f">={r[0]}.{r[1]},<{r[0] + 1}" if len(r) >= 2 else f">={v}"


def _this_or_newer(v: str) -> str:
    return ">=" + ".".join(map(str, _release(v))) if _release(v) else f">={v}"


#: Artifact kind -> its :class:`LoadRule`. A new artifact kind adds a row (and :func:`artifact_kind` maps
#: its loader to it); every check (promotion gate, pull, :class:`~neuron_build.runtime.BucketedModel`) reads
#: this table.
LOAD_RULES: dict[str, LoadRule] = {
    "aoti": LoadRule(
        "aoti", "AOTInductor package (.pt2)", {"torch": _same_release},
        "an AOTInductor package holds compiled C++ kernels for one torch ABI: it loads only in the same "
        "torch release (major.minor.patch; the local label such as +cpu does not count) [doc: PyTorch "
        "AOTInductor docs, no compatibility across versions]"),
    "torchscript": LoadRule(
        "torchscript", "TorchScript module (.pt)", {"torch": _this_or_newer_minor},
        "a TorchScript file loads in the torch release that saved it or a newer one of the same major "
        "version; an older torch may lack operators it uses [doc: PyTorch serialization semantics]"),
    "neuron": LoadRule(
        "neuron", "Neuron TorchScript module with NEFF (.pt)",
        {"torch": _same_minor, "torch-neuronx": _this_or_newer},
        "torch-neuronx is built for one torch minor release (its metadata pins torch==X.Y.*) [doc: toolchain "
        "notes]; the NEFF loads with the torch-neuronx (and its runtime) that compiled it or a newer one "
        "[guess: the toolchain notes state no NEFF/runtime compatibility rule; verify on a Neuron host]"),
    "compile-cache": LoadRule(
        "compile-cache", "torch.compile caches (compile_cache.bin, NEFF cache, Inductor kernels)",
        {"torch": _same_release, "torch-neuronx": _this_or_newer},
        "torch.compiler.load_cache_artifacts entries are keyed on the torch version (Inductor's FX-graph and "
        "AOT-autograd cache keys include it [code: torch 2.13]), so another torch release misses every entry; "
        "TorchNeuron's NEFF cache key omits the torch-neuronx version [code: toolchain notes], so a newer one "
        "may reuse them [guess]"),
}


def artifact_kind(loader: str, backend: str, artifact: str = "") -> str:
    """The :data:`LOAD_RULES` kind of an artifact: ``aoti`` for ``.pt2`` (:data:`AOTI_LOADER`),
    ``compile-cache`` for caches (:data:`CACHE_LOADER`), else the backend record's ``artifact_kind``
    (:mod:`neuron_build.backends`: ``compile-cache`` for the compile-cache and torchneuron backends,
    ``neuron`` for the neuron backend's TorchScript module, ``aoti`` for inductor), ``torchscript`` for an
    unknown backend."""
    if loader == AOTI_LOADER or artifact.endswith(".pt2"):
        return "aoti"
    if loader == CACHE_LOADER:
        return "compile-cache"
    spec = find_backend(backend)  # (the record's kind; an unknown backend: a TorchScript module)
    return spec.artifact_kind if spec is not None else "torchscript"


def load_requirements(kind: str, toolchain: Mapping[str, Any]) -> dict[str, str]:
    """Package -> PEP 440 specifier a host must satisfy to load an artifact of ``kind`` built with
    ``toolchain`` (package -> version, as manifests and releases record it). Packages the toolchain does
    not name are left out; an unknown kind requires nothing."""
    rule = LOAD_RULES.get(kind)
    if rule is None:
        return {}
    return {pkg: fn(str(toolchain[pkg])) for pkg, fn in rule.requires.items() if toolchain.get(pkg)}


def version_problem(kind: str, toolchain: Mapping[str, Any], installed: Mapping[str, str | None],
                    what: str) -> str | None:
    """One line saying why ``installed`` versions cannot load an artifact built with ``toolchain``, or None.

    Args:
        kind: a :data:`LOAD_RULES` kind.
        toolchain: package -> version the artifact was built with.
        installed: package -> the installed version (None: not installed).
        what: names the artifact or release in the message (``release r-1234 of minilm``).
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    rule = LOAD_RULES.get(kind)
    for pkg, spec in load_requirements(kind, toolchain).items():
        have = installed.get(pkg)
        built = toolchain[pkg]
        if have is None:
            return (f"{what}: built with {pkg} {built}, but {pkg} is not installed here; this "
                    f"{rule.what} needs {pkg}{spec}")
        try:
            ok = SpecifierSet(spec).contains(Version(have), prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            continue  # an unparsable version is not refused on a guess
        if not ok:
            return (f"{what}: built with {pkg} {built}, but this host has {pkg} {have}; a {rule.what} needs "
                    f"{pkg}{spec} ({rule.why.split(' [')[0]}); install {pkg}{spec} or use a release built "
                    f"with {pkg} {have}")
    return None


def installed_versions(packages: Iterable[str]) -> dict[str, str | None]:
    """Package -> installed version (None when not installed), from package metadata (no import)."""
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for p in packages:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def release_version_problem(backend: str, toolchain: dict[str, Any], artifacts: list[tuple[str, str]],
                            what: str, installed: dict[str, str | None] | None = None) -> str | None:
    """One line saying why this host's installed versions cannot load a release's artifacts, or None.

    The rule is the artifact kind's (:data:`LOAD_RULES`: an AOTInductor ``.pt2``
    needs the same torch release, a TorchScript ``.pt`` the same or a newer torch of the major version, a
    Neuron ``.pt`` the same torch minor and the same or a newer torch-neuronx).

    Args:
        artifacts: (loader, artifact file) of each bucket.
        installed: package -> installed version; default: this host's (package metadata).
    """
    kinds = sorted({artifact_kind(loader, backend, name) for loader, name in artifacts})
    for kind in kinds:
        needed = load_requirements(kind, toolchain)
        have = installed if installed is not None else installed_versions(needed)
        problem = version_problem(kind, toolchain, have, what)
        if problem:
            return problem
    return None


def pulled_path(bucket: dict, name: str) -> str:
    """The path, relative to a pulled folder, of the file ``name`` (its name inside the artifact) of a bucket
    of ``release.json``: ``<bucket id>/<name>``, or another bucket's copy of the same blob (``neuron-build pull``
    writes a blob several buckets pin once: :mod:`neuron_build.release.pull`);
    ``<bucket id>/<name>`` when the bucket lists no such file."""
    own = f"{bucket['id']}/{name}"
    files = bucket.get("files") or {}
    if own in files:
        return own
    return next((p for p in files if p.partition("/")[2] == name), own)


__all__ = ["AOTI_LOADER", "JIT_LOADER", "LOAD_RULES", "MODEL_FILES", "LoadRule", "artifact_file", "artifact_kind",
           "installed_versions", "load_artifact", "load_requirements", "pulled_path", "release_version_problem",
           "version_problem"]
