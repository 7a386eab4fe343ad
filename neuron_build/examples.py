"""Building a model from its factory and making example inputs: the torch side of a target.

Imported only in worker and validation subprocesses, never on the no-op build path; torch is imported
inside the functions.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_build.loaders import TORCH_DTYPES


def torch_dtype(name: str):
    """``"bf16"`` -> ``torch.bfloat16`` (and the other names of :data:`TORCH_DTYPES`)."""
    import torch
    return getattr(torch, TORCH_DTYPES[name])


def load_factory(root: str | Path, factory: str):
    """Import ``module.path:function`` with ``root`` (the folder of buckets.toml) first on ``sys.path``.

    Raises:
        ImportError: the module does not import or has no such function.
    """
    root = str(Path(root).resolve())
    if not sys.path or sys.path[0] != root:  # first, also when PYTHONPATH names it after a folder holding a
        while root in sys.path:              # package of the same name (an editable checkout's models/)
            sys.path.remove(root)
        sys.path.insert(0, root)
    mod_name, _, fn = factory.partition(":")
    _forget_foreign(mod_name.split(".")[0], root)
    mod = importlib.import_module(mod_name)
    try:
        return getattr(mod, fn)
    except AttributeError:
        raise ImportError(f"{mod_name} has no attribute {fn!r}") from None


def _forget_foreign(top: str, root: str) -> None:
    """Drop an already imported package ``top`` (and its submodules) that was loaded from another
    project's folder, so that one process can load the models of several projects (validation, tests)."""
    mod = sys.modules.get(top)
    where = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", []) or []), None)
    if mod is None or where is None or Path(where).resolve().is_relative_to(root):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def resolve_path_kwargs(root: str | Path, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with each top-level string value that is a relative path naming a file or folder under the
    project folder ``root`` (``weights/x.pt``) replaced by its absolute path: a compile runs in a fresh
    temporary folder, so the factory would not find it otherwise. Other values (numbers, names such as
    ``"bert"`` that are no file there, URLs, absolute paths) are passed as given. The file's content is
    recorded like any file the factory reads (:mod:`neuron_build.project.reads`); the key holds the value
    as written."""
    out = dict(kwargs)
    base = Path(root)
    for name, value in kwargs.items():
        if not isinstance(value, str) or not value or "://" in value or Path(value).is_absolute():
            continue
        path = base / value
        try:
            if path.exists():
                out[name] = str(path)
        except OSError:  # a name too long to be a path, and the like: not a file here
            continue
    return out


def _call_factory(root: str | Path, factory: str, kwargs: dict[str, Any]):
    """Call the factory with :func:`resolve_path_kwargs`; a relative path it cannot open is one line naming
    the factory, the path, the folder it was resolved against and the fix (a FileNotFoundError)."""
    try:
        return load_factory(root, factory)(**resolve_path_kwargs(root, kwargs))
    except FileNotFoundError as e:
        name = e.filename
        if not isinstance(name, str) or Path(name).is_absolute():
            raise
        raise FileNotFoundError(
            f"factory {factory} could not open {name!r}: a compile runs in a fresh temporary folder ({Path.cwd()}), "
            f"not the project folder; name the file in kwargs (a relative path there is resolved against {root}) or "
            f"open it relative to the factory's module (Path(__file__).parent)") from e


def build_model(root: str | Path, factory: str | None, kwargs: dict[str, Any], dtype: str,
                hf: dict[str, Any] | None = None):
    """Call the factory (or, with ``hf``, load the Hugging Face model offline: :func:`neuron_build.hf.build`
    with ``kwargs`` for ``from_pretrained``) and return the module in eval mode, float weights cast to
    ``dtype`` (``fp32``/``bf16``/``fp16``), gradients off. A factory's string kwargs naming a file or folder
    under ``root`` are passed as absolute paths (:func:`resolve_path_kwargs`).

    Raises:
        ImportError: the factory does not import; the hf folder or package is not there.
        TypeError: the factory did not return a ``torch.nn.Module``.
        FileNotFoundError: the factory opened a relative path that is not there (one line with the fix).
    """
    import torch
    if hf is not None:
        from neuron_build import hf as hf_models
        model = hf_models.build(hf, kwargs, root)
    else:
        model = _call_factory(root, factory, kwargs)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"factory {factory} returned {type(model).__name__}, not a torch.nn.Module")
    model = model.to(torch_dtype(dtype)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_inputs(inputs: Sequence[dict[str, Any]], seed: int, device: str = "cpu") -> tuple:
    """Deterministic example inputs from concrete input specs.

    Args:
        inputs: dicts with ``name``, ``shape`` (ints), ``dtype`` (a :data:`TORCH_DTYPES` name) and
            ``range`` (``[low, high)`` or None).
        seed: seeds a private ``torch.Generator``; the same seed gives the same tensors.
        device: where the tensors are placed.

    Returns:
        A tuple of tensors in spec order. Integer inputs are uniform in ``[low, high)``; bool inputs are
        random bits; float inputs are standard normal (or uniform in ``range`` when given), made in fp32
        and cast to their dtype.
    """
    import torch
    g = torch.Generator().manual_seed(seed)
    out = []
    for spec in inputs:
        shape, dt, rng = tuple(spec["shape"]), spec["dtype"], spec.get("range")
        if dt == "bool":
            t = torch.randint(0, 2, shape, generator=g).bool()
        elif dt in ("int64", "int32", "int16", "int8", "uint8"):
            lo, hi = int(rng[0]), int(rng[1])
            t = torch.randint(lo, hi, shape, generator=g, dtype=torch_dtype(dt))
        else:
            t = torch.randn(shape, generator=g)
            if rng is not None:
                t = torch.rand(shape, generator=g) * (rng[1] - rng[0]) + rng[0]
            t = t.to(torch_dtype(dt))
        out.append(t.to(device))
    return tuple(out)


__all__ = ["TORCH_DTYPES", "build_model", "load_factory", "make_inputs", "resolve_path_kwargs", "torch_dtype"]
