"""The static checks of ``buckets.toml``: what the schema alone cannot say.

Checks across tables (a model's profiles are defined, its input dims have bucket sizes, a reference takes
the same inputs) and against the file system (the factory module exists, parses and defines the function,
the modules it imports are findable, declared weight files and source globs exist). Nothing is imported or
executed: loading a config never imports torch or the model's code.

Each check is one small function returning its faults (one line each, naming the TOML path, what is wrong
and the fix); :data:`PROJECT_CHECKS` run once per file, :data:`MODEL_CHECKS` once per ``[models.NAME]``
table, in the order listed, which is the order the faults are reported in.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_build.backends import find_backend
from neuron_build.project.config_errors import toml_path
from neuron_build.project.config_terms import (
    CAUSAL_LM,
    NAME,
    NAME_RULE,
    TEXTGEN_BACKENDS,
    long_name_fault,
)
from neuron_build.project.factory_checks import check_factory, check_hf
from neuron_build.project.weights_checks import backend_weights

# The checks read the models of neuron_build.project.config (ConfigFile, ModelSpec, named in the docstrings)
# without importing it: config imports this module, and an import back would be a cycle.
ConfigFile = ModelSpec = Any

#: A check of the whole file: (config, the config's folder) -> faults.
ProjectCheck = Callable[[ConfigFile, Path], list[str]]
#: A check of one model table: (config, the config's folder, model name, its spec) -> faults.
ModelCheck = Callable[[ConfigFile, Path, str, ModelSpec], list[str]]
#: A check of a text-generation model table: (config, its spec, its TOML location) -> faults.
TextgenCheck = Callable[[ConfigFile, ModelSpec, tuple[Any, ...]], list[str]]


def _at(name: str) -> tuple[str, str]:
    return ("models", name)


def _hint(word: str, known: list[str]) -> str:
    """``did you mean 'x'? `` for the closest of ``known`` to ``word``, else empty."""
    close = difflib.get_close_matches(word, known, n=1)
    return f"did you mean '{close[0]}'? " if close else ""


# --------------------------------------------------------------------------------------------------
# the whole file

def _store_is_local(cfg: ConfigFile, root: Path) -> list[str]:
    """``[build] store`` is a local folder (a remote store is ``[build] remote``)."""
    if "://" in cfg.build.store and not cfg.build.store.startswith("file://"):
        return [f"build.store: {cfg.build.store!r} is a URL; [build] store is the local folder (such as "
                f"\"artifacts\"; a shared file system mount works) and a shared store goes in "
                f"[build] remote = {cfg.build.store!r}"]
    return []


def _store_beside_sources(cfg: ConfigFile, root: Path) -> list[str]:
    """The local store folder is neither the project folder (nor a folder holding it) nor a folder holding a
    module a model's factory imports: the store's files never count as sources
    (:func:`neuron_build.project.sources.is_project_file`), so such a model's sources would drop out of its
    key and an edit to one would not rebuild it."""
    s = cfg.build.store
    if "://" in s and not s.startswith("file://"):
        return []  # _store_is_local reports it
    store = (root / s.removeprefix("file://")).resolve()
    proj = root.resolve()
    fix = "set it to a folder beside the sources, e.g. \"artifacts\""
    if proj.is_relative_to(store):
        what = "is the project folder" if store == proj else f"holds the project folder {proj}"
        return [f"build.store: {s!r} ({store}) {what}, so the models' source files would drop out of the key "
                f"(an edited model would stay cached); {fix}"]
    from neuron_build.project.sources import local_imports

    for name, m in cfg.models.items():
        if m.factory is None:
            continue
        entry = root.joinpath(*m.module.split("."))
        entry = entry / "__init__.py" if (entry / "__init__.py").exists() else entry.with_suffix(".py")
        if not entry.is_file():
            continue  # _loads reports it
        inside = [f for f in local_imports(entry, proj, module=m.module) if f.is_relative_to(store)]
        if inside:
            return [f"build.store: {s!r} ({store}) holds {inside[0].relative_to(proj).as_posix()}, a source of "
                    f"model '{name}', so it would drop out of the key (an edited model would stay cached); {fix}"]
    return []


def _state_dir_is_a_folder(cfg: ConfigFile, root: Path) -> list[str]:
    """``[build] state_dir`` is not a file, nor inside one (it is created when missing)."""
    state = root / cfg.build.state_dir
    for p in (state, *state.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == state else f"is inside {p}, a file"
                return [f"build.state_dir: {cfg.build.state_dir!r} ({state}) {where}, not a folder; set "
                        f"it to a folder (default \".neuron-build\")"]
            break
    return []


def _table_names(cfg: ConfigFile, root: Path) -> list[str]:
    """Profile and model names are safe in paths and target ids."""
    faults = []
    for kind, name in [*(("profile", n) for n in cfg.profiles), *(("model", n) for n in cfg.models)]:
        if long_name_fault(kind, name):
            faults.append(f"{kind}s.{name[:20]}...: {long_name_fault(kind, name)}")
        elif not NAME.match(name):
            faults.append(f"{toml_path((kind + 's', name))}: name {name!r} {NAME_RULE}")
    return faults


def _one_scheduler(cfg: ConfigFile, root: Path) -> list[str]:
    """``[dask] cluster = "slurm"`` starts its own scheduler: ``[build] scheduler`` would name a second one."""
    if cfg.dask.cluster != "scheduler" and cfg.build.scheduler:
        return [f"dask.cluster: {cfg.dask.cluster!r} starts its own Dask scheduler, but [build] scheduler is "
                f"{cfg.build.scheduler!r}; remove one of them"]
    return []


def _slurm_needs_dask(cfg: ConfigFile, root: Path) -> list[str]:
    """``[dask] cluster = "slurm"`` makes the workers of ``executor = "dask"``: with the local executor it would
    be ignored, and every compile would run on the submit host instead."""
    if cfg.dask.cluster != "scheduler" and cfg.build.executor != "dask":
        return [f"dask.cluster: {cfg.dask.cluster!r} makes the workers of executor = \"dask\", but [build] "
                f"executor is {cfg.build.executor!r}, so every compile would run on this host; set [build] "
                f"executor = \"dask\" or remove [dask] cluster"]
    return []


def _remote_options(cfg: ConfigFile, root: Path) -> list[str]:
    """Every ``[build] remote_options`` key is one the remote store takes and every value of neuron-build's
    keys is within S3's limits (:func:`neuron_build.remote_options.option_faults`): all at once, one line
    each; options without a ``remote`` would be read by nothing."""
    opts = cfg.build.remote_options
    if not opts:
        return []
    if cfg.build.remote is None:
        return [f"build.remote_options: {', '.join(opts)} given, but [build] remote is not set, so no store reads "
                f"them; set remote = \"s3://<bucket>/<prefix>\" or remove remote_options"]
    from neuron_build.remote_options import option_faults

    return [f"build.remote_options: {f}" for f in option_faults(cfg.build.remote, opts)]


def _documented_flags(cfg: ConfigFile, root: Path) -> list[str]:
    """Every neuronx-cc flag of a profile is documented, or in its ``unchecked_args`` (:func:`flag_faults`)."""
    from neuron_build.project.compiler_args import flag_faults

    return [f for name, prof in cfg.profiles.items() for f in flag_faults(name, prof.compiler_args, prof.unchecked_args)]


def _walltime_fits_a_compile(cfg: ConfigFile, root: Path) -> list[str]:
    """A Slurm worker lives long enough for a compile of ``timeout_s`` (:meth:`DaskSettings.timeout_fault`)."""
    fault = cfg.dask.timeout_fault(cfg.build.timeout_s)
    return [fault] if fault else []


# --------------------------------------------------------------------------------------------------
# one model table

def _known_profiles(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every profile a model lists is a ``[profiles.NAME]`` table."""
    profiles = list(cfg.profiles)
    return [f"{toml_path(_at(name) + ('profiles', i))}: unknown profile '{p}'; {_hint(p, profiles)}"
            f"defined profiles: {', '.join(profiles)}"
            for i, p in enumerate(m.profiles) if p not in cfg.profiles]


def _meant_textgen(m: ModelSpec) -> bool:
    """A text-generation table, or one without inputs whose ``max_seq_len``/``decode_buckets`` say it meant
    ``task = "text-generation"`` (that is then its one fault, not also missing inputs)."""
    return m.is_textgen or (not m.inputs and (m.max_seq_len is not None or bool(m.decode_buckets)))


def _textgen(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """The keys of a text-generation model (or those given without ``task = "text-generation"``)."""
    at = _at(name)
    if not (m.is_textgen or m.max_seq_len is not None or m.decode_buckets):
        return []
    if not m.is_textgen:
        given = "max_seq_len" if m.max_seq_len is not None else "decode_buckets"
        return [f"{toml_path(at + (given,))}: applies to task = \"text-generation\" only; remove it or add "
                f"task = \"text-generation\" to {toml_path(at)}"]
    return [f for check in TEXTGEN_CHECKS for f in check(cfg, m, at)]


def _inputs_given(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """A forward model declares its inputs (a text-generation model's follow from the task)."""
    if not m.inputs and not _meant_textgen(m):
        return [f"{toml_path(_at(name) + ('inputs',))}: required key is missing; add it"]
    return []


def _input_dims(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every bucket dim an input's shape names has sizes in ``buckets``."""
    at = _at(name)
    return [f"{toml_path(at + ('inputs', i, 'shape'))}: dim '{d}' has no sizes; "
            f"add it to {toml_path(at + ('buckets',))} (e.g. {d} = [128])"
            for i, inp in enumerate(m.inputs) for d in inp.dims if d not in m.buckets]


def _input_names(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """No two inputs share a name."""
    names = [inp.name for inp in m.inputs]
    return [f"{toml_path(_at(name) + ('inputs',))}: input name '{n}' is used twice"
            for n in sorted({n for n in names if names.count(n) > 1})]


def _used_dims(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every dim in ``buckets`` is used by an input (a text-generation model's are the prefill buckets)."""
    used = set(m.buckets) if _meant_textgen(m) else set()
    used.update(d for inp in m.inputs for d in inp.dims)
    return [f"{toml_path(_at(name) + ('buckets', d))}: no input uses dim '{d}'; "
            f"remove it or use it in an input's shape" for d in m.buckets if d not in used]


def _weights_exist(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every ``weights`` entry is a file, or a folder holding files."""
    faults = []
    for i, w in enumerate(m.weights):
        wp = root / w
        if wp.is_dir():
            if not any(f.is_file() for f in wp.rglob("*")):
                faults.append(f"{toml_path(_at(name) + ('weights', i))}: folder '{w}' holds no files; "
                              f"put the weight files in it or remove the entry")
        elif not wp.is_file():
            where = "" if Path(w).is_absolute() else f" (relative to {root})"
            faults.append(f"{toml_path(_at(name) + ('weights', i))}: '{w}' not found{where}; "
                          f"give an existing file or folder")
    return faults


def _sources_match(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every ``sources`` glob is relative, inside the project folder, and matches a file."""
    faults = []
    for i, g in enumerate(m.sources):
        if Path(g).is_absolute() or ".." in Path(g).parts:
            faults.append(f"{toml_path(_at(name) + ('sources', i))}: '{g}' must be a glob relative to {root} "
                          f"(e.g. \"kernels/**/*.py\"), inside the project folder")
        elif not any(p.is_file() for p in root.glob(g)):
            faults.append(f"{toml_path(_at(name) + ('sources', i))}: '{g}' matches no file under {root}; "
                          f"fix the pattern or remove it")
    return faults


def _packages_installed(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """Every ``packages`` entry is an installed distribution."""
    import importlib.metadata as md

    faults = []
    for i, pkg in enumerate(m.packages):
        try:
            md.distribution(pkg)
        except Exception:
            faults.append(f"{toml_path(_at(name) + ('packages', i))}: package '{pkg}' is not installed; "
                          f"install it (pip install {pkg}) or remove it")
    return faults


def _reference(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """A declared ``reference`` names another model that takes the same inputs (name, symbolic shape,
    dtype, range, in order). Its buckets do not matter: the reference runs eagerly on this model's inputs."""
    if m.reference is None:
        return []
    where = toml_path(_at(name) + ("reference",))
    ref = cfg.models.get(m.reference)
    if ref is None:
        others = [n for n in cfg.models if n != name]
        alone = "" if others else (" (a model is its own reference by default: remove the line, or define the "
                                   "model to compare with)")
        return [f"{where}: unknown model '{m.reference}'; {_hint(m.reference, others)}defined models: "
                f"{', '.join(cfg.models)}{alone}"]
    if m.reference == name:
        return [f"{where}: a model is its own reference by default; remove the line or name another model"]

    def sig(spec: ModelSpec) -> list[str]:
        return [f"{i.name}{list(i.shape)}" + (f" {i.dtype}" if i.dtype else "")
                + (f" range {list(i.range)}" if i.range else "") for i in spec.inputs]

    if sig(m) != sig(ref):
        return [f"{where}: model '{m.reference}' takes other inputs ({'; '.join(sig(ref))}) than "
                f"'{name}' ({'; '.join(sig(m))}); a reference must take the same input names, shapes, "
                f"dtypes and ranges"]
    return []


def _loads(cfg: ConfigFile, root: Path, name: str, m: ModelSpec) -> list[str]:
    """The factory will import (:func:`~neuron_build.project.factory_checks.check_factory`) or the hf model
    resolves (:func:`~neuron_build.project.factory_checks.check_hf`)."""
    at = _at(name)
    return check_factory(m, root, at) if m.factory is not None else check_hf(m, root, at)


# --------------------------------------------------------------------------------------------------
# a text-generation model table

def _tg_max_seq_len(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    if m.max_seq_len is None:
        return [f"{toml_path(at + ('max_seq_len',))}: required for task = \"text-generation\" (the KV cache "
                f"length in tokens: prompt plus new tokens); add it, e.g. max_seq_len = 2048"]
    return []


def _tg_no_inputs(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    if m.inputs:
        return [f"{toml_path(at + ('inputs',))}: a text-generation model's inputs follow from the task (token "
                f"ids, cache positions, the KV cache); remove it"]
    return []


def _tg_prefill_buckets(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    """The buckets are exactly batch and seq, each prompt length leaving room for a new token."""
    dims = list(m.buckets)
    if sorted(dims) != ["batch", "seq"]:
        return [f"{toml_path(at + ('buckets',))}: a text-generation model's buckets are the prefill buckets "
                f"{{ batch = [...], seq = [...] }}; got {{ {', '.join(dims) or 'nothing'} }}: "
                f"give exactly batch and seq"]
    if m.max_seq_len is None:
        return []
    return [f"{toml_path(at + ('buckets', 'seq', i))}: a prompt of {s} tokens leaves no room in the KV "
            f"cache of max_seq_len = {m.max_seq_len} for a new token; lower it below "
            f"{m.max_seq_len} or raise max_seq_len" for i, s in enumerate(m.buckets["seq"]) if s >= m.max_seq_len]


def _tg_decode_buckets(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    """Decode buckets fit the cache and are the neuron backend's (NxDI's token-generation buckets)."""
    faults = []
    if m.max_seq_len is not None:
        faults += [f"{toml_path(at + ('decode_buckets', i))}: {c} is longer than max_seq_len = {m.max_seq_len}; "
                   f"lower it or raise max_seq_len" for i, c in enumerate(m.decode_buckets) if c > m.max_seq_len]
    spec = find_backend(cfg.build.backend)  # auto: not known to be NxDI's until resolved
    if m.decode_buckets and not (spec is not None and spec.decode_buckets):
        faults.append(f"{toml_path(at + ('decode_buckets',))}: the {cfg.build.backend} backend decodes against "
                      f"the whole KV cache (max_seq_len); remove it (token-generation buckets over cache length "
                      f"are NxDI's, for backend = \"neuron\")")
    return faults


def _tg_backend(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    if cfg.build.backend not in TEXTGEN_BACKENDS:
        return [f"{toml_path(at + ('task',))}: text-generation models build with backend inductor or "
                f"compile-cache (transformers' static-cache export) or neuron (NxDI); [build] backend is "
                f"\"{cfg.build.backend}\": set backend = \"inductor\" or \"neuron\""]
    return []


def _tg_task_keys(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    """Keys of a forward model that the task decides for a text-generation model."""
    faults = []
    if m.hf is not None and m.auto_class not in (None, CAUSAL_LM):
        faults.append(f"{toml_path(at + ('auto_class',))}: a text-generation model loads with {CAUSAL_LM}; "
                      f"remove auto_class or set it to \"{CAUSAL_LM}\"")
    if m.output is not None:
        faults.append(f"{toml_path(at + ('output',))}: a text-generation model's graphs return the logits; "
                      f"remove output")
    if m.reference is not None:
        faults.append(f"{toml_path(at + ('reference',))}: a text-generation model is validated against its own "
                      f"eager generate(); remove reference")
    if m.truncate:
        faults.append(f"{toml_path(at + ('truncate',))}: a prompt is never cut; remove truncate (a prompt longer "
                      f"than every seq bucket is refused with the fix)")
    return faults


#: The checks of the whole file, in report order.
PROJECT_CHECKS: list[ProjectCheck] = [_store_is_local, _store_beside_sources, _state_dir_is_a_folder,
                                      _table_names, _one_scheduler, _slurm_needs_dask, _remote_options, _documented_flags,
                                      _walltime_fits_a_compile, backend_weights]
#: The checks of each ``[models.NAME]`` table, in report order.
MODEL_CHECKS: list[ModelCheck] = [_known_profiles, _textgen, _inputs_given, _input_dims, _input_names, _used_dims,
                                  _weights_exist, _sources_match, _packages_installed, _reference, _loads]
#: The checks of a ``task = "text-generation"`` table (run by the ``_textgen`` model check), in report order.
TEXTGEN_CHECKS: list[TextgenCheck] = [_tg_max_seq_len, _tg_no_inputs, _tg_prefill_buckets, _tg_decode_buckets,
                                      _tg_backend, _tg_task_keys]


def cross_checks(cfg: ConfigFile, root: Path) -> list[str]:
    """Every fault of the static checks of ``cfg`` (a ``buckets.toml`` in the folder ``root``), one line each
    naming the TOML path and the fix: :data:`PROJECT_CHECKS`, then :data:`MODEL_CHECKS` for each model in
    file order. Empty when the config is sound. Nothing is imported or executed."""
    faults = [f for check in PROJECT_CHECKS for f in check(cfg, root)]
    for name, m in cfg.models.items():
        faults.extend(f for check in MODEL_CHECKS for f in check(cfg, root, name, m))
    return faults


__all__ = ["MODEL_CHECKS", "PROJECT_CHECKS", "TEXTGEN_CHECKS", "ModelCheck", "ProjectCheck", "TextgenCheck",
           "cross_checks"]
