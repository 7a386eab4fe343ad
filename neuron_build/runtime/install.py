"""Installing a pulled release: read and check ``release.json`` and the files it lists, make this process hit a
compile-cache or torchneuron release's caches, and build the user's model as it was built.

:func:`neuron_build.runtime.pulled.read_pulled` reads a folder ``neuron-build pull`` wrote (every name it
turns into a path checked first: :mod:`neuron_build.trust`) into its typed record; :func:`verify_pulled` checks
every listed file's size and sha256; :func:`install_release` installs the caches for your own serving code; :func:`serving_model`
builds the model a cache release records; :func:`textgen_source` says what of a text-generation release
:func:`neuron_build.compilers.textgen_load.load_textgen` loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_build.errors import FactoryNotImportable, UserError
from neuron_build.runtime.pulled import RELEASE_FILE, PulledRelease, read_pulled, release_file
from neuron_build.util import file_sha256

#: What :meth:`~neuron_build.runtime.BucketedModel.load` checks of each listed file: ``sha256`` (content and
#: size, the default) or ``size`` (sizes only: for hosts that verified the files at pull, ``neuron-build pull``
#: checks sha256).
VERIFY_MODES = ("sha256", "size")


def verify_pulled(release: PulledRelease, root: Path, verify: str = "sha256") -> None:
    """Check every file a pulled release (in folder ``root``) lists in its buckets' ``files``: it must exist
    with the listed size and, with ``verify = "sha256"``, the listed sha256 (every byte read once: hard links
    of one file are hashed once). The names were checked when the record was read
    (:func:`~neuron_build.runtime.pulled.read_pulled`).

    Raises:
        UserError: one line naming the first file that is missing, of another size or another sha256.
    """
    # a file several buckets list (the weights every graph of a text-generation model shares) is checked once
    listed = list({n: e for b in release.buckets for n, e in b.files.items()}.items())
    for name, ent in listed:
        p = root / name
        if not p.is_file():
            raise UserError(f"{p}: missing, {RELEASE_FILE} lists it; pull the release again")
        size = p.stat().st_size
        if size != ent.get("size"):
            raise UserError(f"{p}: {size} bytes, {RELEASE_FILE} lists {ent.get('size')}; the file was changed after "
                            f"pull: pull the release again")
    if verify != "sha256":
        return
    hashed: dict[tuple[int, int], str] = {}  # hard links of one blob (a pull links files of one digest): read once
    for name, ent in listed:
        p = root / name
        st = p.stat()
        ident = (st.st_dev, st.st_ino)
        if ident not in hashed:
            hashed[ident] = file_sha256(p)
        got = hashed[ident]
        if got != ent.get("sha256"):
            raise UserError(f"{p}: sha256 {got[:16]}..., {RELEASE_FILE} lists {str(ent.get('sha256'))[:16]}...; the "
                            f"file was changed after pull: pull the release again")


def install_release(folder: str | Path, neff_cache_dir: str | Path | None = None) -> dict[str, Any]:
    """For your own serving code: make this process hit a pulled compile-cache or torchneuron release's
    caches (environment, NEFF cache folder or Inductor kernels, ``load_cache_artifacts`` of every bucket:
    :func:`neuron_build.compilers.compile_cache.install_from_caches`), then compile your model with the
    returned ``torch_compile`` settings::

        settings = install_release("serve/minilm")
        model = torch.compile(my_model.to(torch.float32).eval(), **settings["torch_compile"])

    Returns:
        The release's ``serving`` record (``torch_compile``, ``env``, ``device``, ``factory``, ``kwargs``,
        ``dtype``) plus ``installed`` (entries per cache type) and ``neff_cache_dir``.

    Raises:
        UserError: no ``release.json``, or not a compile-cache or torchneuron release.
    """
    from neuron_build.compilers.compile_cache import install_from_caches

    root = Path(folder)
    rec = read_pulled(root, f"pull a release into {root} first")
    serving = rec.serving
    if serving is None:
        raise UserError(f"{root}: a {rec.backend} release holds compiled models, not caches; load it "
                        f"with BucketedModel.load")
    installed, neff_dir, _env = install_from_caches([root / b.id for b in rec.buckets], serving,
                                                    rec.backend, neff_cache_dir)
    return {**serving, "installed": installed, "neff_cache_dir": str(neff_dir) if neff_dir else None}


def serving_device(serving: dict[str, Any]) -> str:
    """Where the compiled model runs: the recorded device, except ``neuron`` on a host without a NeuronCore
    (``/dev/neuron*``), which runs on CPU tensors (only meaningful with a compile-only toolchain or a test
    double)."""
    import glob

    dev = serving.get("device") or "cpu"
    if dev == "neuron" and not glob.glob("/dev/neuron[0-9]*"):
        return "cpu"
    return dev


def serving_model(serving: dict[str, Any], model: Any = None, factory_root: str | Path | None = None):
    """The user's model for a compile-cache release, as it was built: ``model`` itself (an ``nn.Module``),
    ``model(**kwargs)`` (a callable), the recorded ``factory`` called with the recorded ``kwargs``, or for an
    hf model the recorded ``hf`` folder or package loaded offline (:func:`neuron_build.hf.build`; a relative
    folder resolves against ``factory_root``); cast to the recorded dtype, in eval mode, gradients off.

    Raises:
        ImportError: the recorded factory does not import (``factory_root`` first on ``sys.path``), or the
            recorded hf folder or package is not there; :class:`~neuron_build.errors.FactoryNotImportable` (also
            a ``UserError``) when the factory's own module is not under ``factory_root``.
        TypeError: the factory did not return an ``nn.Module``.
    """
    import torch

    from neuron_build.examples import load_factory, torch_dtype

    if model is None and serving.get("hf"):
        from neuron_build import hf

        model = hf.build(serving["hf"], dict(serving.get("kwargs") or {}), factory_root or Path.cwd())
    elif model is None:
        root = Path(factory_root or Path.cwd()).resolve()
        try:
            model = load_factory(root, serving["factory"])
        except ModuleNotFoundError as e:
            mod = serving["factory"].partition(":")[0]
            if not e.name or not (mod == e.name or mod.startswith(e.name + ".")):
                raise  # a module the factory itself imports is missing: not a question of the folder
            raise FactoryNotImportable(
                f"the release's model factory {serving['factory']} does not import from {root} (no module named "
                f"{e.name!r}): pass the project folder that holds it as --factory-root (neuron-build warmup) or "
                f"factory_root= (BucketedModel.load)") from None
    if not isinstance(model, torch.nn.Module):
        model = model(**dict(serving.get("kwargs") or {}))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"factory {serving.get('factory')} returned {type(model).__name__}, not a torch.nn.Module")
    model = model.to(torch_dtype(serving["dtype"])).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def textgen_source(release: PulledRelease, root: Path, build_lm: Callable[[], Any] | None = None):
    """What :func:`neuron_build.compilers.textgen_load.load_textgen` loads of a pulled text-generation release
    (its record, checked, in folder ``root``): every bucket's folder, its model file and the files its bucket
    lists (a blob several buckets pin is pulled once, under one bucket's folder: each file's name inside the
    artifact maps to where it is and its listed sha256). ``build_lm``: the recorded model (compile-cache).
    """
    from neuron_build.compilers.textgen_load import TextGenGraph, TextGenSource

    graphs = []
    for b in release.buckets:
        files: dict[str, tuple[Path, str | None]] = {}
        for p, e in b.files.items():  # the bucket's own copy, else the first other bucket's
            name = p.partition("/")[2]
            if name not in files or p == f"{b.id}/{name}":
                files[name] = (root / p, e["sha256"])
        graphs.append(TextGenGraph(root / b.id, root / b.artifact if b.artifact else None, files))
    tg = release.textgen or {}
    return TextGenSource(release.model, release.backend, tuple(graphs), str(release_file(root)),
                         tg.get("max_seq_len"), release.hardware_target or None, release.serving, build_lm)


__all__ = ["VERIFY_MODES", "install_release", "serving_device", "serving_model", "textgen_source", "verify_pulled"]
