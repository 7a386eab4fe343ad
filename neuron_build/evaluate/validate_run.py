"""Running one target's reference model and artifact in this process, and diagnosing a failure.

Part of :mod:`neuron_build.evaluate.validate` (which re-exports every public name here): the deterministic
inputs, the eager models and the loaded artifact of one target (:class:`Prepared`, made by :func:`prepare`),
the check itself (:func:`validate_here`, which the validation process
:mod:`neuron_build.evaluate.validate_worker` runs) and, on a failure, the eager runs that tell a model that
disagrees with its reference, dtype precision and a wrong artifact apart (:func:`diagnose`). Torch is
imported only inside the functions that run models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neuron_build.artifact import artifact_file, load_artifact
from neuron_build.backends import find_backend
from neuron_build.errors import UserError
from neuron_build.evaluate.validate_compare import compare_outputs, compare_tensors, failure_message
from neuron_build.evaluate.validate_setup import artifact_device_kind, validation_seed
from neuron_build.project.config import ModelSpec, Project
from neuron_build.project.matrix import Target
from neuron_build.status import Verdict
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.manifest import Manifest


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


def validate_here(project: Project, store: Any, target: Target, key: str, keys, rec: dict[str, Any]) -> dict[str, Any]:
    """Run the reference and the artifact in this process and fill ``rec``
    (:func:`~neuron_build.evaluate.validate.validate_target` made it) with the rows and the verdict; ``store``
    needs only ``manifest`` and ``artifact_dir`` (:class:`~neuron_build.evaluate.validate.ArtifactView`),
    ``keys`` only ``.key(target).key`` (:class:`~neuron_build.evaluate.validate.KeyTable`).

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



__all__ = ["Prepared", "diagnose", "prepare", "validate_here"]
