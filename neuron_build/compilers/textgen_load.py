"""One way to load compiled text-generation graphs, for serving, validation and bench alike.

Serving (:class:`neuron_build.runtime.BucketedModel` over a pulled release), validation
(:mod:`neuron_build.evaluate.textgen_validate`, artifacts in the store) and bench (one graph of the store)
describe what they load as a :class:`TextGenSource` (the compiled folders, where their files are and
what their manifest or ``release.json`` lists of them) and call :func:`load_textgen` (an engine over every
graph: ``generate``) or :func:`load_next_token` (one graph as ``(input_ids, cache_position) -> next
token ids``, what bench times). How each backend loads is decided in one place (:func:`_engine_for`):

- ``inductor``: AOTInductor packages (``model.pt2``) sharing the weights file and one KV state per batch
  size (:func:`neuron_build.compilers.textgen_serve.aoti_engine`);
- ``compile-cache``: every folder's caches installed first
  (:func:`neuron_build.compilers.compile_cache.install_from_caches`), then ``torch.compile`` of the recorded
  model with the recorded settings, once per batch size (every graph a cache hit);
- ``neuron`` (NxDI): NxDI's own application class and generation adapter per compiled folder
  (:func:`neuron_build.compilers.neuron.nxdi_serve.nxdi_engine`; needs a NeuronCore, else one line naming
  the host it needs).

Any other backend has no text-generation serving engine: one line (:class:`NoTextGenEngine`), the same
from ``BucketedModel.load``, ``validate`` and ``bench``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.backends import find_backend
from neuron_build.compilers.textgen import INFO, WEIGHTS
from neuron_build.errors import UserError


class NoTextGenEngine(UserError):
    """The artifacts' backend has no text-generation serving engine (one line naming it and the fix)."""


@dataclass(frozen=True)
class TextGenGraph:
    """One compiled text-generation folder: a prefill or decode graph (``textgen.json``), or an NxDI compile
    of one batch size (``neuron_config.json``).

    Args:
        folder: the artifact's folder (in the store, or a pulled bucket's folder).
        artifact: the model file (default: ``folder / "model.pt2"``).
        files: file name inside the artifact -> (where it is, its sha256 or None) for files found elsewhere
            than ``folder / name`` (a pulled blob several buckets share is written once) or whose sha256 the
            manifest or ``release.json`` lists (the weights are then read once per sha256).
    """

    folder: Path
    artifact: Path | None = None
    files: Mapping[str, tuple[Path, str | None]] = field(default_factory=dict)

    def file(self, name: str) -> tuple[Path, str]:
        """(path, id) of the artifact's file ``name``: the listed place and sha256, else ``folder / name`` and
        that path as its id."""
        path, sha = self.files.get(name, (self.folder / name, None))
        return path, sha or str(path)

    def info(self) -> dict[str, Any]:
        """The folder's ``textgen.json`` (graph, batch, seq, max_seq_len, state, weights, ...).

        Raises:
            UserError: unreadable (not a text-generation artifact, or damaged): one line naming the file.
        """
        f = self.folder / INFO
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{f}: cannot read it ({e}); it is one of the artifact's files (pull the release "
                            f"again, or `neuron-build verify`)") from None


@dataclass(frozen=True)
class TextGenSource:
    """What to load: the compiled graphs of one text-generation model.

    Args:
        model: the model's name (messages).
        backend: the backend that compiled the graphs (decides the loader, :func:`_engine_for`).
        graphs: the folders, prefill and decode graphs (or NxDI compiles) of one or more batch sizes.
        where: names what is loaded in messages (``DIR/release.json``, or a target and key).
        max_seq_len: the KV cache length in tokens (None: read from the graphs' ``textgen.json``).
        hardware_target: the artifacts' hardware target (NxDI's host message).
        serving: compile-cache: the recorded serving record (``torch_compile``, ``env``, ...).
        build_lm: compile-cache: returns the model as it was built (cast, eval), compiled over the caches.
    """

    model: str
    backend: str
    graphs: tuple[TextGenGraph, ...]
    where: str
    max_seq_len: int | None = None
    hardware_target: str | None = None
    serving: Mapping[str, Any] | None = None
    build_lm: Callable[[], Any] | None = field(default=None, compare=False)

    def seq_len(self, infos: Sequence[dict[str, Any]]) -> int:
        """:attr:`max_seq_len`, else the one the graphs' ``textgen.json`` record."""
        if self.max_seq_len is not None:
            return int(self.max_seq_len)
        return min(int(i["max_seq_len"]) for i in infos)

    def needs_lm(self) -> Callable[[], Any]:
        """:attr:`build_lm` (one line naming what is missing when not given)."""
        if self.build_lm is None or self.serving is None:
            raise UserError(f"{self.where}: a {self.backend} text-generation artifact holds caches; it is "
                            f"loaded with the model it was built from and its serving record")
        return self.build_lm


def load_textgen(src: TextGenSource) -> tuple[Any, dict[str, int]]:
    """The engine over every graph of ``src``: ``generate(input_ids, attention_mask=None, max_new_tokens=N,
    eos_token_id=None)`` (:class:`~neuron_build.compilers.textgen_serve.TextGenEngine`, or NxDI's
    :class:`~neuron_build.compilers.neuron.nxdi_serve.NxDIEngine`).

    Returns:
        (the engine, installed cache entries per cache type: empty but for compile-cache).

    Raises:
        NoTextGenEngine: the backend has no text-generation serving engine.
        UserError: a graph's files are unreadable or do not fit together; NxDI on a host without a
            NeuronCore (one line naming the host it needs).
    """
    return _engine_for(src.backend, src.where)[0](src)


def load_next_token(src: TextGenSource) -> Callable[[Any, Any], Any]:
    """One graph of ``src`` (its only one) as ``fn(input_ids, cache_position) -> next token ids`` (the argmax
    of the last position's logits, int64 ``[batch]``), what bench times; an NxDI compile is timed as its
    first token: ``generate(input_ids, max_new_tokens=1)``.

    Raises:
        NoTextGenEngine, UserError: as :func:`load_textgen`.
    """
    return _engine_for(src.backend, src.where)[1](src)


def _engine_for(backend: str, where: str) -> tuple[Callable[[TextGenSource], tuple[Any, dict[str, int]]],
                                                   Callable[[TextGenSource], Callable[[Any, Any], Any]]]:
    """(engine loader, one-graph loader) of ``backend``, by its record's ``textgen_engine``
    (:mod:`neuron_build.backends`): ``aoti-graphs``, ``compiled-graphs`` or ``nxdi``.

    Raises:
        NoTextGenEngine: the backend has none.
    """
    spec = find_backend(backend)
    if spec is None or spec.textgen_engine not in _LOADERS:
        raise NoTextGenEngine(f"{where}: backend {backend!r} has no text-generation serving engine (text "
                              f"generation is served from inductor, compile-cache and neuron (NxDI) builds); set "
                              f"backend to one of them for the model in buckets.toml and build again")
    return _LOADERS[spec.textgen_engine]


# -- AOTInductor ------------------------------------------------------------------------------------
def _aoti_engine(src: TextGenSource) -> tuple[Any, dict[str, int]]:
    from neuron_build.compilers.textgen_serve import aoti_engine

    graphs, infos = [], []
    for g in src.graphs:
        info = g.info()
        weights, wid = g.file(info.get("weights", WEIGHTS))  # one file for every graph
        graphs.append((info, g.artifact or g.folder / "model.pt2", weights, wid, g.folder))
        infos.append(info)
    return aoti_engine(graphs, src.seq_len(infos), src.model), {}


def _aoti_next_token(src: TextGenSource) -> Callable[[Any, Any], Any]:
    from neuron_build.compilers.textgen_serve import AOTIStates

    g, = src.graphs
    info = g.info()
    weights, wid = g.file(info.get("weights", WEIGHTS))
    return _argmax(AOTIStates().load(g.artifact or g.folder / "model.pt2", weights, wid, info, g.folder))


# -- compile-cache ----------------------------------------------------------------------------------
def _cached_engine(src: TextGenSource) -> tuple[Any, dict[str, int]]:
    from neuron_build.compilers.compile_cache import install_from_caches
    from neuron_build.compilers.textgen import causal_lm
    from neuron_build.compilers.textgen_serve import compiled_engine

    build_lm = src.needs_lm()
    infos = [g.info() for g in src.graphs]
    installed, _, _ = install_from_caches([g.folder for g in src.graphs], src.serving or {}, src.backend)
    lm = causal_lm(build_lm())
    batches = [int(i["batch"]) for i in infos]
    seqs = sorted({int(i["seq"]) for i in infos if i["graph"] == "prefill"})
    return compiled_engine(lm, batches, seqs, src.seq_len(infos), dict((src.serving or {})["torch_compile"]),
                           src.model), installed


def _cached_next_token(src: TextGenSource) -> Callable[[Any, Any], Any]:
    import torch

    from neuron_build.compilers.compile_cache import install_from_caches
    from neuron_build.compilers.textgen import causal_lm, static_wrapper

    build_lm = src.needs_lm()
    g, = src.graphs
    info = g.info()
    install_from_caches([g.folder], src.serving or {}, src.backend)
    wrapper = static_wrapper(causal_lm(build_lm()), int(info["batch"]), src.seq_len([info]))
    return _argmax(torch.compile(wrapper, **dict((src.serving or {})["torch_compile"])))


def _argmax(runner: Callable[..., Any]) -> Callable[[Any, Any], Any]:
    def next_token(ids, pos):
        return runner(input_ids=ids, cache_position=pos)[:, -1].argmax(-1)
    return next_token


# -- NxDI -------------------------------------------------------------------------------------------
def _nxdi_engine(src: TextGenSource) -> tuple[Any, dict[str, int]]:
    from neuron_build.compilers.neuron.nxdi_serve import nxdi_engine

    return nxdi_engine([g.folder for g in src.graphs], src.model, src.backend, src.hardware_target, src.where), {}


def _nxdi_next_token(src: TextGenSource) -> Callable[[Any, Any], Any]:
    engine, _ = _nxdi_engine(src)

    def first_token(ids, pos):
        return engine.generate(ids, max_new_tokens=1)[:, -1]
    return first_token



#: The loaders of each text-generation serving engine (``BackendSpec.textgen_engine``): (engine, one graph).
_LOADERS: dict[str, tuple[Callable[[TextGenSource], tuple[Any, dict[str, int]]],
                          Callable[[TextGenSource], Callable[[Any, Any], Any]]]] = {
    "aoti-graphs": (_aoti_engine, _aoti_next_token),
    "compiled-graphs": (_cached_engine, _cached_next_token),
    "nxdi": (_nxdi_engine, _nxdi_next_token),
}

__all__ = ["NoTextGenEngine", "TextGenGraph", "TextGenSource", "load_next_token", "load_textgen"]
