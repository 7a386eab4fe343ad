"""Numeric validation of a compiled artifact against the eager fp32 CPU reference.

For one target: deterministic inputs made from its concrete input specs, the reference model (the
target's own model, or the model its ``reference`` names in ``buckets.toml``) run eagerly in fp32 on the
CPU, and the artifact run on the device it was compiled for. Per output it records the max absolute
error, the relative L2 error ``||a - r|| / ||r||``, the cosine similarity, the tolerance applied and the
verdict, in ``results/<key>/validation/<device kind>.json`` (schema in :mod:`neuron_build.release.gates`). The
key never changes.

- **Inputs**: :func:`neuron_build.examples.make_inputs` with the seed :func:`validation_seed` (bytes 8-15
  of the key, so not the compile's example inputs, which use the first 8 hex digits: a traced artifact is
  checked on values it was not traced with). Float inputs are made in the target dtype and cast exactly
  to fp32 for the reference, so both sides see the same values; integer inputs stay within their range.
- **Tolerance** on the relative L2 error: ``tolerance`` of the model in ``buckets.toml`` for the dtype,
  else :data:`DEFAULT_TOLERANCE` (fp32 1e-4, bf16 and fp16 2e-2).
- **Device kind**: where the artifact runs: ``neuron`` for the neuron backend, else the ``[build] device``
  it was compiled for (``cpu`` or ``cuda``). On a host that cannot run it (no NeuronCore, no CUDA device)
  the verdict is ``not_validated`` with the reason, never ``pass``.
- **Diagnosis** (on a failure): the eager model is run too, to tell a model that disagrees with its
  reference (and which factory kwarg, e.g. ``eps``, is the cause), dtype precision, and a wrong artifact
  apart.

This module imports torch only inside the functions that run models; :func:`is_validated` and
:func:`target_device_kind` are torch-free (doit uses them to decide what is up to date).
"""

from __future__ import annotations

import glob
import math
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from neuron_build.artifact import artifact_file, load_artifact
from neuron_build.backends import find_backend
from neuron_build.errors import UserError
from neuron_build.project.config import DeviceKind, ModelSpec, Project
from neuron_build.project.matrix import Target
from neuron_build.status import Verdict
from neuron_build.store.contract import ArtifactStore, RecordStore
from neuron_build.store.manifest import Manifest
from neuron_build.util import read_json, utc_now

#: Relative L2 error allowed against the fp32 CPU reference, per target dtype, unless the model's
#: ``tolerance`` table in buckets.toml says otherwise. bf16 errors around 1e-2 are normal; above 5e-2
#: something is wrong.
DEFAULT_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
VERDICTS = tuple(v.value for v in Verdict)
DEVICE_KINDS: tuple[str, ...] = get_args(DeviceKind)


# --------------------------------------------------------------------------------------------------
# torch-free helpers

def validation_seed(key: str) -> int:
    """The seed of a target's validation (and benchmark) inputs: hex digits 8-15 of its key, an int in
    [0, 2**32). The compile's example inputs use digits 0-7, so validation runs on other values."""
    return int(key[8:16], 16)


def neuron_devices() -> list[str]:
    """The NeuronCore device nodes of this host (``/dev/neuron0``, ...). [guess: the Neuron driver creates
    one ``/dev/neuron<N>`` per Neuron device; not in the toolchain notes, verify on a Neuron host]"""
    return sorted(glob.glob("/dev/neuron[0-9]*"))


def _cuda_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def artifact_device_kind(backend: str, hardware_target: str) -> str:
    """The device kind an artifact runs on: its backend record's
    (:meth:`neuron_build.backends.BackendSpec.device_kind`): ``neuron`` for the neuron and torchneuron
    backends, else ``cuda`` or ``cpu`` (the ``[build] device`` the inductor, compile-cache or torchscript
    backend compiled for). An unknown backend (a manifest this version did not write): ``cuda`` for a
    ``cuda`` target, else ``cpu``."""
    spec = find_backend(backend)
    if spec is not None:
        return spec.device_kind(hardware_target)
    return "cuda" if hardware_target == "cuda" else "cpu"


def can_run_here(device_kind: str) -> tuple[bool, str | None]:
    """Whether this host can run artifacts of ``device_kind``; when not, the reason
    (``"no NeuronCore here"``, ``"no CUDA device here"``). Torch-free: looks for device nodes."""
    if device_kind == "neuron":
        return (True, None) if neuron_devices() else (False, "no NeuronCore here")
    if device_kind == "cuda":
        return (True, None) if _cuda_devices() else (False, "no CUDA device here")
    return True, None


def reference_model_hash(keys, name: str) -> str:
    """sha256 (hex) of the canonical JSON of model ``name``'s ``model`` key component
    (:meth:`neuron_build.project.keys.KeyMaker.model_component` of ``keys``, a ``KeyMaker``): the
    reference model's identity by content (factory, kwargs, sources, weights), which a validation record
    notes so that a changed reference makes it stale. Torch-free."""
    from neuron_build.util import canonical_json, sha256_hex

    return sha256_hex(canonical_json(keys.model_component(name)))


def is_validated(store: RecordStore, key: str, device_kind: str, tolerance: float | None = None,
                 reference: str | None = None, reference_hash: str | None = None) -> bool:
    """True when the store holds a validation of ``key`` on ``device_kind`` that need not be repeated on
    this host: a pass, or ``not_validated`` where this host still cannot run the artifact. A failed
    verdict is never up to date (validation runs again), nor is one made with another ``tolerance`` or
    ``reference`` model than given (both live in buckets.toml, outside the key), nor, with
    ``reference_hash`` (:func:`reference_model_hash`), one made against another content of the reference
    model (its kwargs, factory, sources or weights changed since). Torch-free."""
    r = store.result(key, "validation", device_kind)
    if r is None:
        return False
    if tolerance is not None and r.get("tolerance") != tolerance:
        return False
    ref = r.get("reference") or {}
    if reference is not None and ref.get("model") != reference:
        return False
    if reference_hash is not None and ref.get("model_hash") != reference_hash:
        return False
    if r.get("verdict") == Verdict.PASS:
        return True
    return r.get("verdict") == Verdict.NOT_VALIDATED and not can_run_here(device_kind)[0]


def tolerance_for(spec: ModelSpec, model: str, dtype: str) -> tuple[float, str]:
    """(relative L2 tolerance, where it comes from) for a model's dtype."""
    if dtype in spec.tolerance:
        return spec.tolerance[dtype], f"buckets.toml models.{model}.tolerance.{dtype}"
    return DEFAULT_TOLERANCE[dtype], f"default for {dtype}"




# --------------------------------------------------------------------------------------------------
# metrics

def flatten_outputs(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Name the tensors of a model output: a tensor is ``output0``; the items of a tuple or list are
    ``output0``, ``output1``, ...; the items of a dict (or a transformers ``ModelOutput``) are named by
    key; nested containers join names with ``.`` (``output1.0``). Non-tensor leaves (None, ints) are
    dropped."""
    import torch

    if isinstance(out, torch.Tensor):
        return [(prefix or "output0", out)]
    items: list[tuple[str, Any]]
    if isinstance(out, dict):
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (list, tuple)):
        items = [(f"output{i}" if not prefix else str(i), v) for i, v in enumerate(out)]
    else:
        return []
    flat: list[tuple[str, Any]] = []
    for name, v in items:
        flat.extend(flatten_outputs(v, f"{prefix}.{name}" if prefix else name))
    return flat


def compare_tensors(actual, reference) -> dict[str, float]:
    """Error figures of ``actual`` against ``reference`` (same shape), computed in float64 on the CPU.

    Returns:
        ``max_abs_error`` (in the output's units), ``rel_l2_error`` = ||a - r||_2 / ||r||_2 (0 when both
        are zero, inf when only r is), ``cosine_similarity`` (1.0 when both are zero, 0.0 when only one is;
        nan when a holds non-finite values), and ``ref_l2_norm``.
    """
    import torch

    a = actual.detach().to("cpu", torch.float64).reshape(-1)
    r = reference.detach().to("cpu", torch.float64).reshape(-1)
    if a.numel() == 0:
        return {"max_abs_error": 0.0, "rel_l2_error": 0.0, "cosine_similarity": 1.0, "ref_l2_norm": 0.0}
    d = a - r
    dn, rn, an = float(d.norm()), float(r.norm()), float(a.norm())
    if not math.isfinite(dn):
        rel = math.inf
    elif rn == 0:
        rel = 0.0 if dn == 0 else math.inf
    else:
        rel = dn / rn
    if not (math.isfinite(an) and math.isfinite(rn)):
        cos = math.nan
    elif an == 0 and rn == 0:
        cos = 1.0
    elif an == 0 or rn == 0:
        cos = 0.0
    else:
        cos = float(torch.dot(a, r)) / (an * rn)
    mx = float(d.abs().max())
    return {"max_abs_error": mx if math.isfinite(mx) else math.inf, "rel_l2_error": rel,
            "cosine_similarity": cos, "ref_l2_norm": rn}


def compare_outputs(actual: Any, reference: Any, tolerance: float) -> tuple[list[dict[str, Any]], str | None]:
    """Compare two model outputs output by output (see :func:`flatten_outputs` for names).

    Returns:
        (rows, structure problem): one row per reference output with ``name``, ``shape``,
        ``max_abs_error``, ``rel_l2_error``, ``cosine_similarity``, ``tolerance`` and ``pass``
        (relative L2 error <= tolerance, finite); the problem is a one-line message when the outputs do
        not match in names or shapes (rows then cover only the outputs that do).
    """
    fa, fr = dict(flatten_outputs(actual)), flatten_outputs(reference)
    rows, problems = [], []
    if [n for n, _ in fr] != list(fa):
        problems.append(f"the artifact returns outputs {list(fa) or 'none'}, the reference {[n for n, _ in fr]}")
    for name, r in fr:
        a = fa.get(name)
        if a is None:
            continue
        if tuple(a.shape) != tuple(r.shape):
            problems.append(f"{name} has shape {list(a.shape)}, the reference {list(r.shape)}")
            continue
        m = compare_tensors(a, r)
        ok = math.isfinite(m["rel_l2_error"]) and m["rel_l2_error"] <= tolerance
        rows.append({"name": name, "shape": list(r.shape), "dtype": str(a.dtype).removeprefix("torch."),
                     "max_abs_error": m["max_abs_error"], "rel_l2_error": m["rel_l2_error"],
                     "cosine_similarity": m["cosine_similarity"], "ref_l2_norm": m["ref_l2_norm"],
                     "tolerance": tolerance, "pass": ok})
    return rows, ("; ".join(problems) or None)


def failure_message(target_id: str, rows: Sequence[dict[str, Any]]) -> str:
    """One line naming every failing output, its error and the tolerance, e.g.
    ``rmsnorm_fused/static/fp32/o1: output0 rel L2 error 3.1e-03 > tolerance 1.0e-04 (max abs error
    2.0e-02, cosine 0.999995)``."""
    parts = [f"{r['name']} rel L2 error {r['rel_l2_error']:.1e} > tolerance {r['tolerance']:.1e} "
             f"(max abs error {r['max_abs_error']:.1e}, cosine {r['cosine_similarity']:.6f})"
             for r in rows if not r["pass"]]
    return f"{target_id}: " + "; ".join(parts)


# --------------------------------------------------------------------------------------------------
# loading and running

@dataclass
class Prepared:
    """Everything needed to run one target's artifact and its models on the same inputs.

    ``inputs`` are the deterministic inputs (target dtype, CPU); ``device`` is where the artifact runs
    (``cpu``, ``cuda``; ``cpu`` for neuron, whose traced models take CPU tensors [doc: torch_neuronx.trace
    returns a ScriptModule called with CPU tensors]).
    """

    project: Project
    store: ArtifactStore
    target: Target
    key: str
    manifest: Manifest
    device_kind: str
    device: str
    seed: int
    inputs: tuple
    reference_model: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def model_spec(self) -> ModelSpec:
        return self.project.config.models[self.target.model]

    @property
    def factory(self) -> str | None:
        """The artifact's factory, as recorded in its key (what was compiled); None for an hf model."""
        return self.manifest.key_details["model"].get("factory")

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.manifest.key_details["model"]["kwargs"])

    @property
    def batch(self) -> int:
        """Samples per call: the first dim of the first input (1 for a 0-d input)."""
        shape = self.manifest.key_details["inputs"]["inputs"][0]["shape"]
        return int(shape[0]) if shape else 1

    def device_inputs(self) -> tuple:
        return tuple(t.to(self.device) for t in self.inputs)

    def reference_inputs(self) -> tuple:
        """The inputs for the fp32 CPU reference: float inputs cast (exactly) to fp32."""
        return tuple(t.float() if t.is_floating_point() else t for t in self.inputs)

    def eager(self, dtype: str, kwargs: dict[str, Any] | None = None, model: str | None = None,
              device: str = "cpu"):
        """The eager model (this target's, or ``model``'s from buckets.toml) in ``dtype`` on ``device``."""
        from neuron_build.examples import build_model

        if model is None:
            factory, kw, hf = self.factory, (self.kwargs if kwargs is None else kwargs), self.model_spec.hf_spec()
        else:
            spec = self.project.config.models[model]
            factory, kw, hf = spec.factory, (dict(spec.kwargs) if kwargs is None else kwargs), spec.hf_spec()
        return build_model(self.project.root, factory, kw, dtype, hf=hf).to(device)

    def load_artifact(self):
        """Load the artifact onto its device and return a callable.

        The file and loader are :func:`neuron_build.artifact.artifact_file`'s; loading is
        :func:`neuron_build.artifact.load_artifact`'s: ``inductor`` -> ``torch._inductor.aoti_load_package``;
        ``torchscript`` -> ``torch.jit.load`` onto :attr:`device`; ``neuron`` -> ``import torch_neuronx``
        (registers the Neuron ops; its ``ImportError`` propagates) then ``torch.jit.load``, which places the
        NEFF on a NeuronCore [doc]; ``compile-cache`` and ``torchneuron`` -> the eager model compiled with the
        recorded settings after the artifact's caches were installed
        (:func:`neuron_build.compilers.compile_cache.compile_from_caches`).

        Raises:
            UserError: unknown backend or no artifact file.
        """
        m = self.manifest
        found = artifact_file(m.compiler, m.files)
        spec = find_backend(m.backend)
        name = found[0] if found else (m.compiler.get("artifact") or (spec.artifact if spec else "model.pt"))
        path = self.store.artifact_dir(self.key) / name
        if found is None or not path.is_file():
            raise UserError(f"{self.target.id}: artifact {self.key[:12]} has no {name}; "
                            f"rebuild it (neuron-build build {self.target.id})")
        serving = (m.compiler or {}).get("serving")
        if spec is not None and spec.serving == "caches" and serving is not None:
            from neuron_build.compilers.compile_cache import compile_from_caches

            module = self.eager(self.target.dtype, device=self.device)
            return compile_from_caches([self.store.artifact_dir(self.key)], serving, m.backend, module)[0]
        if spec is None or spec.serving != "artifact":
            raise UserError(f"{self.target.id}: cannot load an artifact of backend {m.backend!r}")
        return load_artifact(path, found[1], m.backend, self.device, explain_missing_neuronx=False)


def prepare(project: Project, store: ArtifactStore, target: Target, key: str) -> Prepared:
    """Read the artifact's manifest and make the target's inputs (imports torch).

    Raises:
        UserError: the store holds no complete artifact for ``key``.
    """
    from neuron_build.examples import make_inputs

    m = store.manifest(key)
    if m is None:
        raise UserError(f"{target.id} is not built for its current key {key[:12]}; "
                        f"run `neuron-build build {target.id}` (or `doit validate`, which builds first)")
    kind = artifact_device_kind(m.backend, m.hardware_target)
    device = "cuda" if kind == "cuda" else "cpu"
    seed = validation_seed(key)
    inputs = make_inputs(m.key_details["inputs"]["inputs"], seed)
    spec = project.config.models[target.model]
    return Prepared(project, store, target, key, m, kind, device, seed, inputs, spec.reference or target.model)


def _run(fn, inputs: tuple):
    import torch

    with torch.inference_mode():
        return fn(*inputs)


def _max_rel(out, ref) -> float:
    rows, problem = compare_outputs(out, ref, math.inf)
    if problem or not rows:
        return math.inf
    return max(r["rel_l2_error"] for r in rows)


def _factory_defaults(root, factory: str | None) -> dict[str, Any]:
    """The keyword defaults of a factory function ({} when it cannot be inspected; for an hf model,
    :data:`neuron_build.hf.DEFAULT_KWARGS`)."""
    import inspect

    from neuron_build.examples import load_factory

    if factory is None:
        from neuron_build.hf import DEFAULT_KWARGS
        return dict(DEFAULT_KWARGS)
    try:
        sig = inspect.signature(load_factory(root, factory))
    except (ImportError, TypeError, ValueError):
        return {}
    return {n: prm.default for n, prm in sig.parameters.items() if prm.default is not inspect.Parameter.empty}


def diagnose(p: Prepared, ref_out, tolerance: float) -> tuple[list[str], dict[str, Any]]:
    """Why a validation failed, by running eager models against the same reference output.

    1. When the reference is another model: the eager fp32 model against it. If that already fails, the
       model definitions disagree (not the compiler); each factory kwarg that differs from the
       reference's is swapped in turn, and a swap that brings the error within tolerance is named as the
       cause (``eps=None`` leaves a fused kernel at ``torch.finfo(dtype).eps``).
    2. Else the eager model in the target dtype on the CPU: if it fails too, the error comes from the
       dtype's precision; if it passes, the artifact itself is wrong.

    Returns:
        (lines of explanation, figures: ``eager_fp32_rel_l2``, ``eager_<dtype>_rel_l2``, ``kwarg_swaps``).
    """
    notes: list[str] = []
    figs: dict[str, Any] = {}
    dtype, ref_name = p.target.dtype, p.reference_model
    ref_inputs = p.reference_inputs()
    if ref_name != p.target.model:
        e32 = _max_rel(_run(p.eager("fp32"), ref_inputs), ref_out)
        figs["eager_fp32_rel_l2"] = e32
        if e32 > tolerance:
            ref_spec = p.project.config.models[ref_name]
            mine, theirs = p.kwargs, dict(ref_spec.kwargs)
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k, "<unset>") != theirs.get(k, "<unset>"))
            notes.append(f"the eager fp32 model {p.target.model} already differs from its reference {ref_name} "
                         f"(rel L2 error {e32:.1e}): the two models disagree, not the compiler")
            my_defaults = _factory_defaults(p.project.root, p.factory)
            ref_defaults = _factory_defaults(p.project.root, ref_spec.factory)

            def show(d: dict[str, Any], k: str) -> str:
                if k in d:
                    return repr(d[k])
                dflt = (my_defaults if d is mine else ref_defaults).get(k, "<none>")
                return f"unset (the factory's default {dflt!r})" if dflt != "<none>" else "unset"

            if diff:
                shown = ", ".join(f"{k}={show(mine, k)} here vs {show(theirs, k)}" for k in diff)
                notes.append(f"the factory kwargs differ from {ref_name}'s {'only ' if len(diff) == 1 else ''}"
                             f"in: {shown}")
            swaps: dict[str, float] = {}
            for k in diff:
                kw = dict(mine)
                if k in theirs:
                    kw[k] = theirs[k]
                else:
                    kw.pop(k, None)
                try:
                    err = _max_rel(_run(p.eager("fp32", kwargs=kw), ref_inputs), ref_out)
                except Exception:  # the factory does not take the reference's value
                    continue
                swaps[k] = err
                if err <= tolerance:
                    note = (f"cause: {k}: with {k}={show(theirs, k)} as in {ref_name} the error drops "
                            f"to {err:.1e}")
                    if k == "eps" and mine.get(k, my_defaults.get(k, 0.0)) is None:
                        note += ("; eps=None leaves the kernel at its default, torch.finfo(dtype).eps of the dtype "
                                 f"it computes in (1.19e-07 for fp32), not {theirs.get(k)!r}")
                    notes.append(note)
            figs["kwarg_swaps"] = swaps
            return notes, figs
    if dtype != "fp32":
        ed = _max_rel(_run(p.eager(dtype), p.inputs), ref_out)
        figs[f"eager_{dtype}_rel_l2"] = ed
        if ed > tolerance:
            notes.append(f"the eager {dtype} model on the CPU has rel L2 error {ed:.1e} too: the error comes from "
                         f"{dtype} precision, not the compiler; raise tolerance.{dtype} only if that is acceptable")
            return notes, figs
        notes.append(f"the eager {dtype} model on the CPU is within tolerance (rel L2 error {ed:.1e}): "
                     f"the compiled artifact is wrong (compiler, artifact file or loader)")
        return notes, figs
    e32 = figs.get("eager_fp32_rel_l2", 0.0)  # 0: the model is its own reference
    notes.append(f"the eager fp32 model matches the reference (rel L2 error {e32:.1e}): the compiled artifact "
                 "is wrong (compiler, artifact file or loader)")
    return notes, figs


def validate_target(project: Project, store: ArtifactStore, target: Target, key: str, record: bool = True,
                    keys=None) -> dict[str, Any]:
    """Validate one target's artifact and (with ``record``) store the result.

    The models run in a fresh Python process (:mod:`neuron_build.evaluate.validate_worker`, started with
    ``subprocess``: no fork after torch is imported), so the verdict is the same whoever asks (``doit
    validate`` with any ``-n`` and either runner, ``neuron-build validate``, ``bench``) and however many
    run at once: no torch state (the global random generator a factory draws its weights from, the default
    dtype, autocast, threads, half-imported transformers classes) leaks from one validation into another.
    :func:`validate_here` is the same check in this process (the worker runs it).

    ``keys`` is the ``KeyMaker`` the caller's keys come from (default: a new one for ``project``); the
    record's ``reference.model_hash`` is :func:`reference_model_hash` of it.

    Returns:
        The result record: ``verdict`` (``pass``/``fail``/``not_validated``/``error``), ``reason`` (None on a
        pass; on a fail the line of :func:`failure_message`; on an error what kept the check from reaching a
        verdict), ``device_kind``, ``device``, ``host``, ``time``, ``target``, ``key``, ``dtype``,
        ``backend``, ``seed``, ``reference`` (model, factory, kwargs, fp32 on cpu), ``tolerance`` and
        ``tolerance_source``, ``outputs`` (rows of :func:`compare_outputs`), ``diagnosis`` (lines) and
        ``diagnosis_figures``, ``elapsed_s``. ``error`` is never ``fail``: the reference model did not build
        or run, or the validation process died; the promote gate counts it as not validated and ``doit
        validate`` runs it again.

    Raises:
        UserError: the target (or a partner graph of a text-generation target) is not built.
    """
    t0 = time.monotonic()
    m = store.manifest(key)
    if m is None:
        raise UserError(f"{target.id} is not built for its current key {key[:12]}; "
                        f"run `neuron-build build {target.id}` (or `doit validate`, which builds first)")
    spec = project.config.models[target.model]
    kind = artifact_device_kind(m.backend, m.hardware_target)
    tol, tol_src = tolerance_for(spec, target.model, target.dtype)
    ref_name = spec.reference or target.model
    ref_spec = project.config.models[ref_name]
    if keys is None:
        from neuron_build.project.keys import KeyMaker
        keys = KeyMaker(project)
    rec: dict[str, Any] = {
        "target": target.id, "key": key, "model": target.model, "dtype": target.dtype, "backend": m.backend,
        "device_kind": kind, "host": socket.gethostname(), "time": utc_now(), "seed": validation_seed(key),
        "reference": {"model": ref_name, "factory": ref_spec.factory, "kwargs": dict(ref_spec.kwargs),
                      "dtype": "fp32", "device": "cpu", "model_hash": reference_model_hash(keys, ref_name)},
        "tolerance": tol, "tolerance_source": tol_src, "outputs": [], "diagnosis": [],
    }
    if ref_spec.hf is not None:  # an hf reference: what it loads (source, auto class, output, input names)
        rec["reference"]["hf"] = ref_spec.hf_spec()
    ok, why = can_run_here(kind)
    if not ok:
        rec.update(verdict=Verdict.NOT_VALIDATED, reason=why, device=None)
    else:
        table = _key_table(project, keys, target, key)
        rec = _validate_isolated(project, ArtifactView.of(store, table.values()), target, key, table, rec)
    rec["elapsed_s"] = round(time.monotonic() - t0, 3)
    if record:
        store.put_result(key, "validation", kind, _json_safe(rec))
    return rec


def _key_table(project: Project, keys, target: Target, key: str) -> KeyTable:
    """The keys the validation of ``target`` reads: its own, and a text-generation target's partner graphs'."""
    table = {target.id: key}
    if target.graph:
        from neuron_build.evaluate.textgen_validate import partners
        from neuron_build.project.matrix import expand

        for t in partners(expand(project), target):
            table.setdefault(t.id, keys.key(t).key)
    return KeyTable(table)


class KeyTable(dict):
    """target id -> key of the targets one validation reads; ``.key(target).key`` as a ``KeyMaker`` answers
    (picklable, so the validation process needs no ``KeyMaker``)."""

    def key(self, target: Target) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(key=self[target.id])


@dataclass
class ArtifactView:
    """The part of a store a validation process reads, made in the parent: per key its manifest (or None)
    and the local folder of its files (:meth:`~neuron_build.store.contract.ArtifactStore.artifact_dir`, so a
    remote artifact is downloaded, digests verified, before the process starts). Picklable."""

    manifests: dict[str, Manifest | None]
    dirs: dict[str, Path]

    @classmethod
    def of(cls, store: ArtifactStore, keys: Iterable[str]) -> ArtifactView:
        manifests, dirs = {}, {}
        for k in keys:
            manifests[k] = store.manifest(k)
            if manifests[k] is not None:
                dirs[k] = store.artifact_dir(k)
        return cls(manifests, dirs)

    def manifest(self, key: str) -> Manifest | None:
        return self.manifests.get(key)

    def artifact_dir(self, key: str) -> Path:
        return self.dirs[key]


def _validate_isolated(project: Project, view: ArtifactView, target: Target, key: str, table: KeyTable,
                       rec: dict[str, Any]) -> dict[str, Any]:
    """:func:`validate_here` in a fresh Python process (:mod:`neuron_build.evaluate.validate_worker`); a
    process that dies or writes no answer gives verdict ``error`` with its exit status and last line.

    Raises:
        UserError: the worker's (a partner graph not built).
    """
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="neuron-build-validate-") as tmp:
        job, out, log = Path(tmp, "job.pkl"), Path(tmp, "out.json"), Path(tmp, "worker.log")
        with job.open("wb") as f:
            pickle.dump((project, view, target, key, table, rec), f)
        with log.open("wb") as f:
            rc = subprocess.call([sys.executable, "-m", "neuron_build.evaluate.validate_worker", str(job), str(out)],
                                 stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        answer = read_json(out)
        if isinstance(answer, dict) and isinstance(answer.get("user_error"), str):
            raise UserError(answer["user_error"])
        if isinstance(answer, dict) and isinstance(answer.get("record"), dict):
            got = answer["record"]
            for row in got.get("outputs") or []:  # the JSON spelling of non-finite figures, back to floats
                for k in ("max_abs_error", "rel_l2_error", "cosine_similarity", "steps_rel_l2_error"):
                    if row.get(k) in ("inf", "-inf", "nan"):
                        row[k] = float(row[k])
            return got
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip()[:300] if lines else "no output"
    return {**rec, "verdict": Verdict.ERROR, "device": None,
            "reason": f"{target.id}: the validation process exited with status {rc} before a verdict: {last}"}


def validate_here(project: Project, store: Any, target: Target, key: str, keys, rec: dict[str, Any]) -> dict[str, Any]:
    """Run the reference and the artifact in this process and fill ``rec`` (:func:`validate_target` made
    it) with the rows and the verdict; ``store`` needs only ``manifest`` and ``artifact_dir``
    (:class:`ArtifactView`), ``keys`` only ``.key(target).key`` (:class:`KeyTable`).

    An exception while the reference is built or run gives verdict ``error`` (never ``fail``): the artifact
    was not judged. An artifact that does not load or run is a ``fail``.

    Raises:
        UserError: the target (or a partner graph) is not built.
    """
    import torch

    from neuron_build.evaluate.textgen_validate import ReferenceFailed

    kind = rec["device_kind"]
    if kind == "cuda" and not torch.cuda.is_available():
        return {**rec, "verdict": Verdict.NOT_VALIDATED, "device": None,
                "reason": "no CUDA device here (this torch build sees none)"}
    tol = rec["tolerance"]
    try:
        if target.graph:  # a prefill or decode graph: greedy generation with its partner graphs
            from neuron_build.evaluate.textgen_validate import validate_textgen

            rec.update(device="cpu", torch=torch.__version__)
            try:
                validate_textgen(project, store, target, keys, rec, tol, validation_seed(key), compare_tensors)
            except (UserError, ReferenceFailed):
                raise
            except Exception as e:  # graphs that do not load or run have failed validation
                rec.update(verdict=Verdict.FAIL, reason=f"{target.id}: the graphs did not load or run: {_first(e)}")
            return rec
        p = prepare(project, store, target, key)
        rec["device"] = p.device if p.device != "cuda" else f"cuda:{torch.cuda.current_device()}"
        rec["torch"] = torch.__version__
        try:
            ref_out = _run(p.eager("fp32", model=rec["reference"]["model"]), p.reference_inputs())
        except Exception as e:  # no reference: no verdict
            raise ReferenceFailed(f"the fp32 reference {rec['reference']['model']} did not build or run: "
                                  f"{_first(e)}") from e
        try:
            out = _run(p.load_artifact(), p.device_inputs())
        except UserError:
            raise
        except Exception as e:  # an artifact that does not load or run has failed validation
            out, problem = None, f"the artifact did not load or run: {_first(e)}"
        rows, problem = compare_outputs(out, ref_out, tol) if out is not None else ([], problem)
        rec["outputs"] = rows
        if out is None:
            rec.update(verdict=Verdict.FAIL, reason=f"{target.id}: {problem}")
        elif problem:
            rec.update(verdict=Verdict.FAIL, reason=f"{target.id}: output structure differs: {problem}")
        elif all(r["pass"] for r in rows):
            rec.update(verdict=Verdict.PASS, reason=None)
        else:
            rec.update(verdict=Verdict.FAIL, reason=failure_message(target.id, rows))
            notes, figs = diagnose(p, ref_out, tol)
            rec["diagnosis"], rec["diagnosis_figures"] = notes, figs
    except ReferenceFailed as e:
        rec.update(verdict=Verdict.ERROR, reason=f"{target.id}: no verdict: {e}")
    return rec


def _first(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters of it)."""
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return f"{type(e).__name__}: {first}"


def _json_safe(obj: Any) -> Any:
    """Replace non-finite floats by strings ("inf", "nan"): the store writes strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def summary_line(rec: dict[str, Any]) -> str:
    """One line for the CLI: verdict, target, worst output error and tolerance (or the reason)."""
    v = rec["verdict"]
    if v == Verdict.ERROR:
        return f"ERROR  {rec['reason']} (not a verdict: run it again)"
    if v == Verdict.NOT_VALIDATED:
        return f"NOT VALIDATED  {rec['target']}: {rec['reason']}"
    if v == Verdict.FAIL:
        return f"FAIL  {rec['reason']}"
    worst = max(rec["outputs"], key=lambda r: r["rel_l2_error"])
    n = len(rec["outputs"])
    what = worst["name"] if n == 1 else f"{n} outputs, worst {worst['name']}"
    return (f"pass  {rec['target']}: {what} rel L2 error "
            f"{worst['rel_l2_error']:.1e} <= {worst['tolerance']:.1e}, max abs error {worst['max_abs_error']:.1e}, "
            f"cosine {worst['cosine_similarity']:.6f} ({rec['device_kind']}, vs {rec['reference']['model']} fp32)")


__all__ = ["DEFAULT_TOLERANCE", "VERDICTS", "ArtifactView", "KeyTable", "Prepared",
           "artifact_device_kind", "can_run_here", "compare_outputs",
           "compare_tensors", "diagnose", "failure_message", "flatten_outputs", "is_validated", "neuron_devices",
           "prepare", "summary_line", "tolerance_for", "validate_here", "validate_target", "validation_seed"]
