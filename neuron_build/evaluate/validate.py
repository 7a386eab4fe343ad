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

The seed and the device kind are :mod:`neuron_build.evaluate.validate_setup`'s, the comparison of outputs
:mod:`neuron_build.evaluate.validate_compare`'s, running the reference and the artifact in this process and
the diagnosis :mod:`neuron_build.evaluate.validate_run`'s (this module re-exports their public names); this
module holds the other torch-free helpers, :func:`validate_target` and the fresh validation process it
starts. Torch is imported only inside the functions that run models;
:func:`is_validated` and :func:`artifact_device_kind` are torch-free (doit uses them to decide what is up to
date).
"""

from __future__ import annotations

import glob
import math
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast, get_args

from neuron_build.errors import UserError
from neuron_build.evaluate.validate_setup import artifact_device_kind, validation_seed
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

def neuron_devices() -> list[str]:
    """The NeuronCore device nodes of this host (``/dev/neuron0``, ...). [guess: the Neuron driver creates
    one ``/dev/neuron<N>`` per Neuron device; not in the toolchain notes, verify on a Neuron host]"""
    return sorted(glob.glob("/dev/neuron[0-9]*"))


def _cuda_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


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




class ValidationRecord(TypedDict, total=False):
    """The result of :func:`validate_target`, as the store keeps it (``results/<key>/validation/<kind>``)
    and ``validate --json`` prints it: a JSON object with these fields (the text-generation ones only for a
    text-generation target)."""

    target: str
    key: str
    model: str
    dtype: str
    backend: str
    device_kind: str
    host: str
    time: str
    seed: int
    reference: dict[str, Any]  # model, factory, kwargs, dtype "fp32", device "cpu", model_hash (hf: its source)
    tolerance: float
    tolerance_source: str
    outputs: list[dict[str, Any]]  # rows of compare_outputs
    diagnosis: list[str]
    diagnosis_figures: dict[str, Any]
    verdict: str  # a Verdict: pass, fail, not_validated, error
    reason: str | None
    device: str | None
    torch: str
    elapsed_s: float
    partners: list[str]  # text generation: the graphs it ran together
    measure: str  # text generation: what the verdict compares


def validate_target(project: Project, store: ArtifactStore, target: Target, key: str, record: bool = True,
                    keys=None) -> ValidationRecord:
    """Validate one target's artifact and (with ``record``) store the result.

    The models run in a fresh Python process (:mod:`neuron_build.evaluate.validate_worker`, started with
    ``subprocess``: no fork after torch is imported), so the verdict is the same whoever asks (``doit
    validate`` with any ``-n`` and either runner, ``neuron-build validate``, ``bench``) and however many
    run at once: no torch state (the global random generator a factory draws its weights from, the default
    dtype, autocast, threads, half-imported transformers classes) leaks from one validation into another.
    :func:`validate_run.validate_here` is the same check in this process (the worker runs it).

    ``keys`` is the ``KeyMaker`` the caller's keys come from (default: a new one for ``project``); the
    record's ``reference.model_hash`` is :func:`reference_model_hash` of it.

    Returns:
        The result record: ``verdict`` (``pass``/``fail``/``not_validated``/``error``), ``reason`` (None on a
        pass; on a fail the line of :func:`validate_compare.failure_message`; on an error what kept the check
        from reaching a verdict), ``device_kind``, ``device``, ``host``, ``time``, ``target``, ``key``, ``dtype``,
        ``backend``, ``seed``, ``reference`` (model, factory, kwargs, fp32 on cpu), ``tolerance`` and
        ``tolerance_source``, ``outputs`` (rows of :func:`validate_compare.compare_outputs`), ``diagnosis``
        (lines) and ``diagnosis_figures``, ``elapsed_s``. ``error`` is never ``fail``: the reference model did not build
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
        store.put_result(key, "validation", kind, json_safe(rec))
    return cast(ValidationRecord, rec)


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
    """:func:`validate_run.validate_here` in a fresh Python process
    (:mod:`neuron_build.evaluate.validate_worker`); a process that dies or writes no answer gives verdict
    ``error`` with its exit status and last line.

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


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by strings ("inf", "nan"): the store writes strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
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




__all__ = ["DEFAULT_TOLERANCE", "VERDICTS", "ArtifactView", "KeyTable", "ValidationRecord", "can_run_here",
           "is_validated", "json_safe", "neuron_devices", "summary_line", "tolerance_for", "validate_target"]
