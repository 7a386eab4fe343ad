"""NxDI's weights apart from its NEFFs: a self-contained artifact, the structure part of its graph key, and a
fine-tune relinked instead of compiled.

Facts [code: NxDI ``models/application_base.py`` @4bcdc54, NxD ``trace/model_builder.py`` @fbac349; shared notes
``weights-and-real-hlo.md`` 3.2]:

- NxD's ModelBuilder always lowers with ``inline_weights_to_neff=False``: ``model.pt`` holds the NEFFs of every
  bucket and no weight. Weights come at ``load()``: from ``<dir>/weights/tp{rank}_sharded_checkpoint.safetensors``
  when the saved config has ``save_sharded_checkpoint``, else ``get_builder().shard_checkpoint()`` re-shards
  the Hugging Face checkpoint at ``config._name_or_path`` on the serving host (``load_weights``).
- With ``save_sharded_checkpoint`` set, ``compile(dir)`` ends with ``shard_weights(dir)``, which is
  ``get_builder().shard_checkpoint(serialize_path=dir/weights/)``: CPU only (modules on ``meta``, a mocked
  process group), no trace. neuron-build sets the flag (:func:`neuron_build.project.textgen.neuron_config`)
  rather than calling NxD's ``shard_checkpoint`` itself: ``load()`` reads ``weights/`` only when the saved
  config says so, and ``shard_weights`` is the code path NxDI itself runs (dtype cast, LoRA, layout option).
- ``NXD_LAYOUT_TRANSFORMATION_OPTIONS`` re-lays the sharded weights out with arguments the trace leaves on the
  builder (``transform_weight_layout_with_overriden_option``): weights sharded without that trace do not fit,
  so that setting means no graph key (compile).

So the artifact is ``neuron_config.json``, ``model.pt``, ``weights/tp*_sharded_checkpoint.safetensors`` and
:data:`~neuron_build.compilers.weights.SPEC_FILE` naming every shard with its tensors' names, dtypes and
shapes (:func:`write_spec`); serving checks the shards against it before NxDI loads anything (:func:`serve_problem`).

The graph key (:func:`structure_document`): NxDI's InferenceConfig as ``compile()`` saves it
(``neuron_config.json``: the NeuronConfig with buckets, TP degree and dtype, and the HF config) without
``_name_or_path`` (a path), the application class, and the checkpoint's tensor names, dtypes and shapes read
from the safetensors headers NxDI's ``load_state_dict`` reads first (``model.safetensors``, else
``model.safetensors.index.json``'s files) [code: NxDI ``modules/checkpoint.py``]; the key's base adds the
compiler args, toolchain and environment. The values are not in it. When the index holds the key, the new
checkpoint is sharded into the staging folder (:func:`stage`) and the builder publishes it with the stored
NEFFs (:mod:`neuron_build.build.graph.relink`): nothing traced, no NEFF compiled. Fails closed: a checkpoint
without those safetensors files or with an unreadable header, a quantized or LoRA config, the layout option:
no graph key; a sharding error: compile.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from neuron_build.compilers import graph_key, weights

#: The folder and file names NxDI reads pre-sharded weights from [code: application_base.py:389-399].
SHARDED_DIR = "weights"
SHARD_NAME = "tp{rank}_sharded_checkpoint.safetensors"
#: Set: the sharded weights carry the trace's layout (see the module docstring): no graph key.
LAYOUT_ENV = "NXD_LAYOUT_TRANSFORMATION_OPTIONS"


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files NxDI's ``load_state_dict`` reads from an HF checkpoint folder: ``model.safetensors``,
    else the files ``model.safetensors.index.json`` maps to.

    Raises:
        NoGraphKey: neither exists, the index cannot be read, or NxDI would read another form first.
    """
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if (folder / "diffusion_pytorch_model.safetensors").is_file():
        raise graph_key.NoGraphKey(f"{folder}: NxDI reads diffusion_pytorch_model.safetensors first; not keyed")
    if not index.is_file():
        raise graph_key.NoGraphKey(f"{folder} holds no model.safetensors or model.safetensors.index.json")
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise graph_key.NoGraphKey(f"{index} cannot be read ({type(e).__name__})") from None
    if not names or any(not isinstance(n, str) or ".." in Path(n).parts or Path(n).is_absolute() for n in names):
        raise graph_key.NoGraphKey(f"{index} names no files in its folder")
    return [folder / n for n in names]


def structure_document(config: dict[str, Any], application: str, folder: Path) -> dict[str, Any]:
    """The structure part of an NxDI target's graph key (see the module docstring).

    Args:
        config: NxDI's InferenceConfig as ``compile()`` saves it (``neuron_config.json``'s content).
        application: the application class (``module.Class``).
        folder: the HF checkpoint folder NxDI shards.

    Raises:
        NoGraphKey: see :func:`checkpoint_files`; an unreadable header; a quantized or LoRA config; the
            layout option set.
    """
    if os.environ.get(LAYOUT_ENV):
        raise graph_key.NoGraphKey(f"{LAYOUT_ENV} is set: the sharded weights carry the compile's layout")
    nc = config.get("neuron_config") or {}
    if nc.get("quantized") or nc.get("lora_config"):
        raise graph_key.NoGraphKey("a quantized or LoRA NxDI config reads other checkpoints; not keyed")
    tensors: dict[str, Any] = {}
    for f in checkpoint_files(folder):
        try:
            tensors.update(weights.header_spec(f))
        except Exception as e:  # missing, truncated, not safetensors: no key (compile)
            raise graph_key.NoGraphKey(f"{f} cannot be read ({type(e).__name__})") from None
    return {"kind": "nxdi-structure", "application": application,
            "config": {k: v for k, v in config.items() if k != "_name_or_path"},
            "checkpoint": [[k, tensors[k]["dtype"], tensors[k]["shape"]] for k in sorted(tensors)]}


def saved_config(config: Any, folder: Path) -> dict[str, Any]:
    """NxDI's InferenceConfig as ``compile()`` saves it: ``config.save(folder)`` read back.

    Raises:
        NoGraphKey: it cannot be saved or read back as JSON.
    """
    try:
        config.save(str(folder))
        return json.loads((folder / "neuron_config.json").read_text())
    except (OSError, ValueError, TypeError) as e:
        raise graph_key.NoGraphKey(f"NxDI's config cannot be saved as JSON ({type(e).__name__})") from None


def write_spec(out: Path) -> list[str]:
    """Write the spec of the sharded weights in ``out/weights/`` (:func:`weights.write_files_spec`); returns
    the shards' paths relative to ``out``.

    Raises:
        FileNotFoundError: there is no shard.
    """
    shards = sorted(p.relative_to(out).as_posix() for p in (out / SHARDED_DIR).glob(SHARD_NAME.format(rank="*")))
    if not shards:
        raise FileNotFoundError(f"no {SHARDED_DIR}/{SHARD_NAME.format(rank='<rank>')} in {out.name}")
    weights.write_files_spec(out, shards)
    return shards


def stage(app: Any, out: Path) -> None:
    """Shard ``app``'s checkpoint into ``out/weights/`` as ``compile()`` would (``app.shard_weights(out)``)
    and write the spec: the weights a relink publishes. On failure nothing is left in ``out``.

    Raises:
        Exception: whatever sharding raises.
    """
    try:
        app.shard_weights(str(out))
        write_spec(out)
    except BaseException:
        shutil.rmtree(out / SHARDED_DIR, ignore_errors=True)
        (out / weights.SPEC_FILE).unlink(missing_ok=True)
        raise


def checkpoint(request: Any, document_of: Any, app: Any, out: Path) -> str | None:
    """:func:`graph_key.checkpoint` of an NxDI target: on a hit, the new checkpoint is sharded into ``out``
    (:func:`stage`) before :class:`~neuron_build.compilers.graph_key.GraphHit` goes up, so the builder
    relinks it; a sharding failure compiles (a warning). The graph probe gets the hit as is."""
    try:
        return graph_key.checkpoint(request, document_of)
    except graph_key.GraphHit:
        if ((request.options or {}).get(graph_key.OPTION) or {}).get("probe"):
            raise
        print("NxDI: the graph index holds this structure: sharding the checkpoint, no trace, no NEFF", flush=True)
        try:
            stage(app, out)
        except Exception as e:  # fail closed: the compile shards (and fails) as NxDI would
            print(f"warning: the checkpoint cannot be sharded ({type(e).__name__}: {str(e)[:200]}); compiling",
                  flush=True)
            return None
        raise


def serve_problem(folder: Path, cfg: dict[str, Any]) -> str | None:
    """One line saying why NxDI cannot load the weights of the compiled ``folder`` (its ``neuron_config.json``
    content ``cfg``) on this host, read from the headers only, or None: a pre-sharded artifact whose spec or
    shards do not fit (a shard per rank, names, dtypes, shapes), or one without shards whose checkpoint
    folder (``_name_or_path``) is not here."""
    nc = cfg.get("neuron_config") or {}
    if not nc.get("save_sharded_checkpoint"):
        path = cfg.get("_name_or_path")
        if isinstance(path, str) and Path(path).is_dir():
            return None
        return (f"{folder / 'neuron_config.json'}: this NxDI artifact holds no sharded weights ({SHARDED_DIR}/) and "
                f"NxDI would shard the checkpoint {path} of the build host on load, which this host lacks; rebuild it "
                f"with this neuron-build (its NxDI artifacts carry {SHARDED_DIR}/), release and pull again")
    try:
        specs = weights.read_specs(folder)
    except ValueError as e:
        return str(e)
    want = [f"{SHARDED_DIR}/{SHARD_NAME.format(rank=r)}" for r in range(int(nc.get("tp_degree") or 1))]
    if specs is None or any(w not in specs for w in want):
        return (f"{folder / weights.SPEC_FILE}: the spec does not name the {len(want)} sharded weights files "
                f"NxDI loads ({want[0]} ...); rebuild the artifact or pull the release again")
    return weights.problem(folder)


__all__ = ["LAYOUT_ENV", "SHARDED_DIR", "SHARD_NAME", "checkpoint", "checkpoint_files", "saved_config",
           "serve_problem", "stage", "structure_document", "write_spec"]
