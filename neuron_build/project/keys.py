"""The key: a sha256 over a canonical JSON of everything that determines a target's artifact.

Components (each hashed on its own so ``explain`` can say which one changed):

- ``format``: the key format version;
- ``model``: factory (or, for an hf model, ``hf``: auto class, output, from_pretrained kwargs, the
  transformers version and the content of the model folder's files, :mod:`neuron_build.hf`), kwargs,
  ``sources`` (the sha256 of every project file the factory's import runs, read statically, and of the
  files the model's ``sources`` globs match: :mod:`neuron_build.project.sources`), ``weights`` (the
  content of declared weight files and folders) and ``packages`` (the versions of the packages the model
  names, and the weight files they ship);
- ``inputs``: the target dtype and each input's concrete shape, dtype and range (for a text-generation
  graph also ``graph``, prefill or decode, and ``max_seq_len``, the static KV cache's length);
- ``compiler``: backend, hardware target, normalised compiler args (without ``--verbose``), profile
  options (``inline_weights_to_neff``, ``tp_degree``, ``weights`` when ``"external"``; for an NxDI target, which
  keeps its weights apart whatever the profile says, the weights choice is left out), and the version of what the backend writes
  (:data:`ARTIFACT_FORMAT`); for AOTInductor on CPU (built with ``-march=native``) also ``cpu_isa``, the
  build host's CPU ISA (:mod:`neuron_build.cpu_isa`);
- ``env``: the environment variables of :data:`KEY_ENV` for the backend (an allow-list: logging, debug,
  cache and runtime settings such as ``TORCH_LOGS`` or ``NEURON_RT_*`` never count);
- ``toolchain``: compiler versions (torch; torch-neuronx, neuronx-cc, neuronx-distributed, libneuronxla
  for neuron and torchneuron: TorchNeuron's own NEFF cache key omits them [code], ours does not).

The key holds the declared inputs only, so ``plan`` shows, before any build, the key the artifact is
published under (ccache's direct mode). What a build recorded besides (the project files the worker saw
imported that no static reading finds, the files the factory read by any code, the environment variables
it read, the distributions it imported: :mod:`neuron_build.project.reads`) lives in the artifact's
manifest as ``recorded_inputs``, each by content, value or version (:meth:`KeyMaker.recorded_inputs`);
a lookup is a hit only when they all still match (:meth:`KeyMaker.stale_inputs`).

Never in the key: absolute paths, host, user, time, the store location, bytes of saved artifacts. Paths in
the key are relative to the folder of ``buckets.toml``, so a moved checkout computes the same keys; a
weights file outside that folder is named by its file name only and keyed by its content.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.backends import AUTO, BACKENDS, find_backend
from neuron_build.cpu_isa import host_cpu_isa
from neuron_build.errors import ConfigError
from neuron_build.project.compiler_args import key_args
from neuron_build.project.config import Project
from neuron_build.project.digest_cache import DigestCache
from neuron_build.project.matrix import Target
from neuron_build.project.outside import outside_name
from neuron_build.project.plan_cache import InputLog
from neuron_build.project.sources import glob_sources, is_project_file, local_imports
from neuron_build.project.toolchain import resolve_backend, toolchain_versions, version
from neuron_build.project.weights_checks import keeps_choice, weights_faults
from neuron_build.util import canonical_json, file_sha256, sha256_hex

KEY_FORMAT = 3  # 3: declared inputs only; what a build recorded lives in its manifest
#: (backend, device) pairs whose artifacts are compiled for the build host's CPU (``-march=native``): their
#: ``compiler`` component carries ``cpu_isa`` (:mod:`neuron_build.cpu_isa`). From each record's ``isa_bound``.
ISA_BOUND = {(b.name, t) for b in BACKENDS.values() for t in b.isa_bound}
#: What each backend writes, versioned: bump a backend's ``artifact_format`` (:mod:`neuron_build.backends`)
#: whenever the files it writes for the same model change (another file, another layout, another saver), so
#: no artifact of the old form is served under a new key, nor reused by the graph key (whose base holds the
#: ``compiler`` component). Part of the ``compiler`` component as ``artifact_format``.
ARTIFACT_FORMAT = {b.name: b.artifact_format for b in BACKENDS.values()}
COMPONENTS = ("format", "model", "inputs", "compiler", "env", "toolchain")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".h5", ".msgpack", ".gguf", ".npz", ".npy")
#: The weight entry of a file that does not exist (the key changes when it appears).
MISSING = "missing"

#: The environment variables that change the compiled artifact, per backend, each with the reason
#: (each record's ``key_env`` in :mod:`neuron_build.backends`, where the reasons are). Only these are in
#: the key (an allow-list). README "What is in the key" lists them.
KEY_ENV: dict[str, dict[str, str]] = {b.name: dict(b.key_env) for b in BACKENDS.values()}


def key_env(backend: str, environ: dict[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that are in the key for ``backend`` (:data:`KEY_ENV`), sorted by name."""
    allowed = KEY_ENV.get(backend, {})
    return {k: environ[k] for k in sorted(allowed) if k in environ}


def digest_entries(root: Path, entry: str, digest, observe: Any = None) -> dict[str, str]:
    """The key entries of one ``weights`` item: name -> sha256 (``digest(path)``) of each file.

    A file under ``root`` is named by its path relative to ``root``; one outside by its file name only
    (``<outside>/w.bin``), so a moved checkout or another mount computes the same key. A folder means every
    file under it (hidden files and folders left out), in sorted order of their relative paths. A missing
    path is :data:`MISSING` (the config check reports it as "not found" first). ``observe`` (an
    :class:`~neuron_build.project.plan_cache.InputLog`) notes each folder before it is listed and each file
    before it is read.
    """
    p = Path(entry)
    p = p if p.is_absolute() else root / p
    try:
        p = p.resolve()
        name = p.relative_to(root).as_posix()
    except ValueError:
        name = f"<outside>/{p.name}"
    except OSError:
        return {entry: MISSING}
    if observe is not None:
        observe.folder(p)
    if p.is_dir():
        found: list[tuple[str, Path]] = []
        if observe is not None:
            observe.listing(p)
        for dirpath, dirnames, filenames in os.walk(p):  # top-down: a folder is noted before it is listed
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if observe is not None:
                for d in dirnames:
                    observe.listing(os.path.join(dirpath, d))
            for fn in filenames:
                f = Path(dirpath, fn)
                if not fn.startswith(".") and f.is_file():
                    found.append((f.relative_to(p).as_posix(), f))
        return {f"{name}/{rel}": _observed(observe, digest, f) for rel, f in sorted(found)}
    if observe is not None:
        observe.file(p)
    if not p.is_file():
        return {name: MISSING}
    return {name: digest(p)}


def _observed(observe: Any, digest, f: Path) -> str:
    if observe is not None:
        observe.file(f)
    return digest(f)


@dataclass(frozen=True)
class KeyInfo:
    """A target's key and the details it was computed from.

    ``details`` maps each component name to its JSON value; ``hashes`` maps it to its sha256; ``key`` is
    the sha256 of the canonical JSON of ``details`` (64 hex chars).
    """

    key: str
    details: dict[str, Any]
    hashes: dict[str, str]


def diff_components(old: dict[str, Any], new: dict[str, Any], old_hashes: dict[str, str] | None = None,
                    new_hashes: dict[str, str] | None = None) -> list[str]:
    """The components whose hashes differ, in :data:`COMPONENTS` order, each with the sub-keys that
    changed: ``["model: sources.models/ffn.py, weights.w.bin", ...]``.

    ``old_hashes`` and ``new_hashes`` (component -> sha256, as key records carry them) let equal
    components be skipped without serialising them."""
    out = []
    for c in COMPONENTS:
        a, b = old.get(c), new.get(c)
        if old_hashes and new_hashes and c in old_hashes and old_hashes.get(c) == new_hashes.get(c):
            continue
        if canonical_json(a) == canonical_json(b):
            continue
        detail = _subdiff(a, b)
        out.append(f"{c}: {detail}" if detail else c)
    return out


def _subdiff(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        parts = []
        for k in sorted(set(a) | set(b), key=str):
            if canonical_json(a.get(k)) != canonical_json(b.get(k)):
                sub = _subdiff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
                parts.append(sub or (f"{prefix}.{k}" if prefix else str(k)))
        return ", ".join(parts)
    return ""


class KeyMaker:
    """Computes keys for a project's targets, caching the per-model and per-build parts.

    Cheap on the no-op path: no torch import, model sources read once per model, weight files digested
    once and then cached by (path, size, mtime_ns, ctime_ns, inode).

    Args:
        project: the loaded config.
        backend: override ``[build] backend``.
        environ: the environment (default ``os.environ``); only :data:`KEY_ENV` variables count.
        exclude: folders whose files are never sources nor recorded inputs (the store).

    Raises:
        ConfigError: a profile a model uses asks for ``weights = "external"`` and the backend resolved here
            (``--backend``, or ``auto`` on this host) compiles weights in
            (:func:`~neuron_build.project.weights_checks.weights_faults`).
    """

    def __init__(self, project: Project, backend: str | None = None, environ: dict[str, str] | None = None,
                 exclude: tuple[Path, ...] = ()):
        self.project = project
        build = project.config.build
        self.backend, self.backend_note = resolve_backend(backend or build.backend, build.target)
        refused = weights_faults(project.config, self.backend, "--backend" if backend else (
            '[build] backend = "auto" chose it on this host' if build.backend == AUTO else "[build] backend"))
        if refused:  # (a named backend was refused when the file loaded; --backend and auto are checked here)
            raise ConfigError(str(project.path), refused)
        #: the resolved backend's record (:mod:`neuron_build.backends`), None for a name it does not know
        self.backend_spec = find_backend(self.backend)
        self.hardware_target = (build.target if self.backend_spec is not None and self.backend_spec.neuron_toolchain
                                else build.device)
        self.environ = dict(os.environ if environ is None else environ)
        self.digests = DigestCache(project.state_dir / "digests.json")
        self.exclude = (project.state_dir, *exclude)
        self._static_cache: dict[str, dict[str, Any]] = {}
        self._model_cache: dict[str, dict[str, Any]] = {}
        self._toolchain = toolchain_versions(self.backend)
        #: the build host's CPU ISA, in the key of AOTInductor CPU packages (built with -march=native)
        self.cpu_isa: str | None = (host_cpu_isa(self.environ) if (self.backend, self.hardware_target) in ISA_BOUND
                                    else None)
        self._env = key_env(self.backend, self.environ)
        self._compiler_cache: dict[tuple[str, bool], dict[str, Any]] = {}
        #: (component, id of its value) -> (value, canonical JSON, sha256); the value is kept so the id
        #: cannot be reused by another object while the entry lives
        self._json_cache: dict[tuple[str, int], tuple[Any, bytes, str]] = {}
        #: every file-system fact the keys computed so far depend on (for the plan cache)
        self.inputs = InputLog()
        self._checker: Any = None
        self._declared_env: dict[str, dict[str, Any]] = {}

    def static_sources(self, name: str) -> dict[str, str]:
        """Project file (relative POSIX path) -> sha256 of every source a model's factory runs that static
        reading finds, plus the files its ``sources`` globs match."""
        return self._static(name)["sources"]

    def _static(self, name: str) -> dict[str, Any]:
        if name in self._static_cache:
            return self._static_cache[name]
        p = self.project
        m = p.config.models[name]
        root = p.root.resolve()
        log = self.inputs
        files = (set(local_imports(p.factory_file(name), root, self.exclude, module=m.module, observe=log))
                 if m.factory is not None else set())
        if m.sources:
            globbed = glob_sources(root, m.sources)
            log.glob(root, m.sources, globbed)
            files.update(globbed)
        sources = {f.relative_to(root).as_posix(): _observed(log, file_sha256, f) for f in sorted(files)}
        weights: dict[str, str] = {}
        for w in m.weights:
            weights.update(digest_entries(root, w, self.digests.digest, observe=log))
        packages: dict[str, Any] = {}
        for dist_name in m.packages:
            dist = md.distribution(dist_name)
            pfiles = sorted(f for f in (dist.files or []) if str(f).endswith(WEIGHT_SUFFIXES))
            packages[dist_name] = {
                "version": dist.version,
                "weights": {str(f): _observed(log, self.digests.digest, Path(dist.locate_file(f))) for f in pfiles},
            }
        declared = self._declared(m, root)
        if m.hf is None:
            comp = {"factory": m.factory, "kwargs": m.kwargs, "sources": sources, "weights": weights,
                    "packages": packages}
        else:
            comp = {"hf": self._hf(m, root), "kwargs": m.kwargs, "sources": sources, "weights": weights,
                    "packages": packages}
        comp.update(declared)
        self._static_cache[name] = comp
        return comp

    def _declared(self, m, root: Path) -> dict[str, Any]:
        """The ``model`` component's entries of a model's declared inputs (:mod:`neuron_build.project.declared`):
        ``inputs_from`` and ``always_rebuild``, each only when given (a model without them keeps its key)."""
        from neuron_build.project.declared import inputs_from_entries

        out: dict[str, Any] = {}
        if m.inputs_from:
            out["inputs_from"] = inputs_from_entries(root, m.inputs_from, self.digests.digest, observe=self.inputs)
        if m.always_rebuild:
            out["always_rebuild"] = True
        return out

    def rebuild_reasons(self, name: str, recorded: Any) -> list[str]:
        """Why the artifact of a target of model ``name`` whose manifest records ``recorded`` is not a hit:
        :meth:`stale_inputs`, an incomplete record's line with its fix, or the model's ``always_rebuild``
        (:func:`neuron_build.project.declared.reasons`); empty for a hit."""
        from neuron_build.project.declared import reasons

        stale = self.stale_inputs(recorded)
        m = self.project.config.models.get(name)
        return reasons(name, stale, always_rebuild=bool(m is not None and m.always_rebuild))

    def _hf(self, m, root: Path) -> dict[str, Any]:
        """The ``hf`` part of an hf model's ``model`` component: the auto class, the output, the effective
        from_pretrained kwargs, the transformers version and ``files`` (file name -> sha256 of each file of
        :func:`neuron_build.hf.model_files`). Not the folder's location nor the ``hf`` value: the same
        files in another folder or another venv's package give the same key."""
        from neuron_build import hf

        spec = m.hf_spec()
        log = self.inputs  # for the plan cache, each noted before it is read
        log.folder(root / m.hf)  # is it a folder here (else a package name)?
        if not hf.is_path(m.hf, root):
            for pkg in hf.package_folders(m.hf):
                log.listing(pkg)  # which of its folders holds config.json
                for sub in (d for d in pkg.iterdir() if d.is_dir()):
                    log.listing(sub)
        folder = hf.resolve(m.hf, root)
        log.listing(folder)
        kwargs = {k: v for k, v in hf.from_pretrained_kwargs(m.kwargs).items() if k != "local_files_only"}
        return {"auto_class": spec["auto_class"], "output": spec["output"], "from_pretrained": kwargs,
                "transformers": version("transformers"),
                "files": {f.name: _observed(log, self.digests.digest, f) for f in hf.model_files(folder)}}

    def recorded_inputs(self, name: str, imported: list[str], reads: dict[str, Any] | None) -> dict[str, Any]:
        """The ``recorded_inputs`` of a manifest of model ``name``: what its build recorded besides the
        declared inputs, each with its digest now (:func:`neuron_build.project.reads.current`).

        ``imported`` (files imported: project-relative POSIX paths, or outside names) and ``reads``
        (``{"files", "listings", "env", "dists", "incomplete"}``) come from the worker's ``result.json``
        (untrusted): a relative path that leaves the project or is never an input (hidden (recorded reads:
        VCS and tool caches only), VCS, ``__pycache__``, ``*.egg-info``, ``*.dist-info``, the store:
        :func:`~neuron_build.project.sources.is_project_file`) is dropped, and so is an outside name (``~/...``
        or absolute) that is not clean or names an exempt place
        (:func:`~neuron_build.project.outside.outside_path`); so are the files and folders the model
        component keys already (static sources, an hf folder, declared weights) and the distributions the
        toolchain component holds.
        """
        from neuron_build.project import reads as _reads

        static = self.static_sources(name)
        covered = self._keyed_folders(name)
        rec = _reads.merge(reads)
        toolchain = {n.replace("_", "-").lower() for n in self._toolchain}
        names = {
            "imports": [f for f in sorted(set(imported or [])) if isinstance(f, str) and f not in static
                        and self._input(f)],
            "files": [f for f in rec["files"] if self._input(f, never=_reads.never_read_folder)
                      and not any(f == c or f.startswith(c + "/") for c in covered)],
            "listings": [f for f in rec["listings"] if self._input(f, never=_reads.never_read_folder, folder=True)
                         and not any(f == c or f.startswith(c + "/") for c in covered)],
            "env": rec["env"],
            "dists": [d for d in rec["dists"] if d.replace("_", "-").lower() not in toolchain],
        }
        out = self.checker().current(names)
        if isinstance(reads, dict) and reads.get("incomplete"):
            out["incomplete"] = str(reads["incomplete"])[:300]
        return out

    def _input(self, rel: str, never: Any = None, folder: bool = False) -> bool:
        """Is ``rel`` (from a worker's record: a path relative to the project, ``.`` for its folder when
        ``folder``, or an outside name, ``~/...`` or absolute) a file (a ``folder``) that may be an input?
        ``never``: the folder-name test of :func:`~neuron_build.project.sources.is_project_file` (recorded
        reads: :func:`~neuron_build.project.reads.never_read_folder`, hidden checkpoint folders count).
        An outside name is one :func:`~neuron_build.project.outside.outside_path` accepts, not under the
        project or the store."""
        from neuron_build.project.outside import is_outside_name, outside_path

        root = self.project.root.resolve()
        if isinstance(rel, str) and is_outside_name(rel):
            p = outside_path(rel, self.environ.get("HOME"))
            return p is not None and not any(p.is_relative_to(e) for e in (root, *self.exclude))
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or not rel or (rel == "." and not folder):
            return False
        return is_project_file(root / p / "_" if folder else root / p, root, self.exclude, never=never)

    def checker(self) -> Any:
        """The :class:`~neuron_build.project.reads.InputCheck` of this project (its digest cache, the
        environment, every file it reads noted in :attr:`inputs`)."""
        from neuron_build.project.read_check import InputCheck  # not the recorder: the no-op path checks only

        if self._checker is None:
            self._checker = InputCheck(self.project.root.resolve(), self.environ, self.digests.digest)
        return self._checker

    def stale_inputs(self, recorded: Any) -> list[str]:
        """Why an artifact whose manifest records ``recorded`` (its ``recorded_inputs``: untrusted) is
        stale: one line per recorded input that changed (``recorded read models/w.safetensors changed``);
        empty when every one still matches (or nothing was recorded)."""
        return self.checker().stale(recorded)

    def _keyed_folders(self, name: str) -> list[str]:
        """Paths (project-relative POSIX, or outside names) whose files a model's component keys by content
        already: an hf model's folder and the declared weights; a recorded read inside them is not keyed
        twice."""
        m = self.project.config.models[name]
        root = self.project.root.resolve()
        out = []
        for p in ([m.hf] if m.hf is not None else []) + [str(w) for w in m.weights]:
            try:
                real = (root / os.path.expanduser(p)).resolve()
            except (OSError, RuntimeError):
                continue
            if real.is_relative_to(root):
                out.append(real.relative_to(root).as_posix())
            elif (name := outside_name(real)) is not None:  # declared weights under ~/ or /data
                out.append(name)
        return out

    def model_component(self, name: str) -> dict[str, Any]:
        """The ``model`` component of one model (declared inputs only; cached)."""
        if name not in self._model_cache:
            self._model_cache[name] = dict(self._static(name))
        return self._model_cache[name]

    def details(self, target: Target) -> dict[str, Any]:
        """The key details of a target: a dict of the components in :data:`COMPONENTS`."""
        cfg = self.project.config
        m = cfg.models[target.model]
        prof = cfg.profiles[target.profile]
        chosen = keeps_choice(self.backend, target.graph)  # NxDI keeps the weights apart whatever the profile says
        comp = self._compiler_cache.get((target.profile, chosen))
        if comp is None:
            comp = self._compiler_cache[(target.profile, chosen)] = {
                "backend": self.backend, "hardware_target": self.hardware_target,
                "compiler_args": list(key_args(prof.compiler_args)),
                "inline_weights_to_neff": prof.inline_weights_to_neff or not chosen, "tp_degree": prof.tp_degree,
                "artifact_format": ARTIFACT_FORMAT.get(self.backend, 1)}
            if prof.weights == "external" and chosen:  # (absent when inline: the keys of before stay as they were)
                comp["weights"] = "external"
            if self.cpu_isa is not None:
                comp["cpu_isa"] = self.cpu_isa
        return {
            "format": KEY_FORMAT,
            "model": self.model_component(target.model),
            "inputs": self._inputs(target, m),
            "compiler": comp,
            "env": self._model_env(target.model, m),
            "toolchain": self._toolchain,
        }

    def _model_env(self, name: str, m) -> dict[str, Any]:
        """The ``env`` component of model ``name``: the backend's allow-list, plus the variables the model
        declares (``env = [...]``, None when unset; cached per model)."""
        if not m.env:
            return self._env
        got = self._declared_env.get(name)
        if got is None:
            from neuron_build.project.declared import declared_env
            got = self._declared_env[name] = {**self._env, **declared_env(m.env, self.environ)}
        return got

    def _inputs(self, target: Target, m) -> dict[str, Any]:
        """The ``inputs`` component; a text-generation graph adds ``graph`` and ``max_seq_len`` (the KV
        cache's length, part of every graph's shapes)."""
        comp: dict[str, Any] = {"dtype": target.dtype, "inputs": [i.to_json() for i in target.inputs(m)]}
        if target.graph:
            comp.update(graph=target.graph, max_seq_len=m.max_seq_len)
        if target.graph == "nxdi":  # NxDI's NeuronConfig (tp_degree, buckets, dtype, sampling, LNC)
            from neuron_build.project.textgen import neuron_config
            comp["neuron_config"] = neuron_config(m, dict(target.bucket)["batch"], target.dtype,
                                                  self.project.config.profiles[target.profile].tp_degree,
                                                  self.hardware_target)
        return comp

    def key(self, target: Target) -> KeyInfo:
        """The target's :class:`KeyInfo`.

        The key is the sha256 of the canonical JSON of the details; that JSON is assembled from each
        component's canonical JSON (sorted keys make it compositional), and the components shared by many
        targets (model, env, toolchain, a profile's compiler options) are serialised once."""
        d = self.details(target)
        texts, hashes = {}, {}
        for c in COMPONENTS:
            cache_key = (c, id(d[c])) if c != "inputs" else None
            hit = self._json_cache.get(cache_key) if cache_key else None
            if hit is None or hit[0] is not d[c]:
                j = canonical_json(d[c])
                hit = (d[c], j, sha256_hex(j))
                if cache_key:
                    self._json_cache[cache_key] = hit
            texts[c], hashes[c] = hit[1], hit[2]
        whole = b"{" + b",".join(b'"' + c.encode() + b'":' + texts[c] for c in sorted(COMPONENTS)) + b"}"
        return KeyInfo(key=sha256_hex(whole), details=d, hashes=hashes)

    def save(self) -> None:
        """Persist the digest cache (call once after computing keys)."""
        self.digests.save()


__all__ = ["ARTIFACT_FORMAT", "COMPONENTS", "ISA_BOUND", "KEY_ENV", "MISSING", "DigestCache", "KeyInfo", "KeyMaker", "canonical_json", "diff_components",
           "digest_entries", "file_sha256", "key_env", "version"]
