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

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int64": "int64", "int32": "int32",
                "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}


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
    if root not in sys.path:
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


def build_model(root: str | Path, factory: str | None, kwargs: dict[str, Any], dtype: str,
                hf: dict[str, Any] | None = None):
    """Call the factory (or, with ``hf``, load the Hugging Face model offline: :func:`neuron_build.hf.build`
    with ``kwargs`` for ``from_pretrained``) and return the module in eval mode, float weights cast to
    ``dtype`` (``fp32``/``bf16``/``fp16``), gradients off.

    Raises:
        ImportError: the factory does not import; the hf folder or package is not there.
        TypeError: the factory did not return a ``torch.nn.Module``.
    """
    import torch
    if hf is not None:
        from neuron_build import hf as hf_models
        model = hf_models.build(hf, kwargs, root)
    else:
        model = load_factory(root, factory)(**kwargs)
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


__all__ = ["TORCH_DTYPES", "build_model", "load_factory", "make_inputs", "torch_dtype"]
