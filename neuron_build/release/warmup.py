"""The warm-up gate: a compile-cache or torchneuron release is promoted only when a fresh-process warm-up
against the pulled files compiled nothing.

For these backends the artifact is a cache that a serving process installs before it compiles the user's
model; a drift in paths, compiler flags, environment or bucket list makes that process compile again on
its first requests (minutes per bucket on a NeuronCore host), and nothing else notices. The gate pulls the
release into a temporary folder (checksums verified, :func:`neuron_build.release.pull.pull_release`) and
runs ``neuron-build warmup DIR --json`` in a fresh interpreter with empty compiler caches
(:func:`run_fresh`). It passes when every bucket reports 0 compiles.

It runs on the channel's serving device kind only: a torchneuron release needs a NeuronCore, a CUDA
compile-cache release a CUDA device. On a host without one the gate is recorded as not checked (``checked:
false`` and the reason, e.g. "no NeuronCore here"), which never passes; ``--allow-unvalidated`` lets a
not-checked warm-up through, marked ``overridden`` (a warm-up that compiled something never passes).
Releases of other backends are not caches: the gate passes with ``applies: false``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from neuron_build.backends import BACKENDS
from neuron_build.errors import NeuronBuildError, UserError
from neuron_build.evaluate.validate import can_run_here
from neuron_build.evaluate.validate_setup import artifact_device_kind
from neuron_build.release.records import Release
from neuron_build.store.contract import ArtifactStore

#: The backends whose artifacts are compile caches (``serving == "caches"`` in :mod:`neuron_build.backends`;
#: see :mod:`neuron_build.compilers.compile_cache`).
CACHE_BACKENDS = tuple(b.name for b in BACKENDS.values() if b.serving == "caches")
GATE = "warmup"


def run_fresh(folder: str | Path, factory_root: str | Path | None = None, env: dict[str, str] | None = None,
              timeout_s: float = 3600) -> dict[str, Any]:
    """Run ``neuron-build warmup FOLDER --json --in-process`` in a fresh interpreter whose
    ``TORCHINDUCTOR_CACHE_DIR`` and ``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`` are new empty folders, and return
    its report (:func:`neuron_build.runtime.warmup`; latencies in seconds). ``TORCHINDUCTOR_COMPILE_THREADS``
    defaults to 1 there (not graph-changing): loading cached graphs needs no pool of compile workers.

    Raises:
        UserError: the warm-up failed (its last output line in the message) or timed out.
    """
    with tempfile.TemporaryDirectory(prefix="neuron-build-warmup-") as tmp:
        e = dict(os.environ if env is None else env)
        e["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        e["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] = os.path.join(tmp, "neff-locks")
        e.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile-worker pool to start for cache hits
        # this neuron_build, whatever the current folder holds (a project folder may hold another checkout)
        e["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), e.get("PYTHONPATH"))
                                          if p)
        cmd = [sys.executable, "-m", "neuron_build.cli", "warmup", str(Path(folder).resolve()), "--json", "--in-process"]
        cmd += ["--factory-root", str(Path(factory_root or Path.cwd()).resolve())]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise UserError(f"warmup of {folder} did not finish within {timeout_s:g} s") from None
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("schema") == "neuron-build/error/v1":  # the child's one-line error
        if doc.get("exit_code") == 2:
            raise UserError(str(doc.get("error")))
        raise NeuronBuildError(f"warmup of {folder} failed (exit {proc.returncode}): {doc.get('error')}")
    if isinstance(doc, dict):
        return doc
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    last = lines[-1].removeprefix("error: ") if lines else "no output"  # the child's own "error: "
    raise UserError(f"warmup of {folder} failed (exit {proc.returncode}): {last}") from None


def warmup_verdict(store: ArtifactStore, release: Release, device_kind: str, factory_root: str | Path | None = None,
                   allow_not_checked: bool = False) -> tuple[bool, str, dict[str, Any]]:
    """Did a fresh-process warm-up of the pulled release compile nothing, on ``device_kind``?

    Args:
        device_kind: the channel's serving device kind (``cpu``, ``cuda``, ``neuron``).
        factory_root: where the release's model factory imports from (the project folder).
        allow_not_checked: a warm-up that could not run here passes, marked ``overridden``.

    Returns:
        (passed, one-line message, figures) for :func:`neuron_build.release.gates.warmup_gate`; figures
        ``applies``, ``checked``,
        ``reason`` (when not checked), ``device_kind``, per bucket ``compiles`` and ``cache_hits``,
        ``first_call_s`` and ``steady_call_s`` (seconds), ``compiled`` (buckets that compiled).
    """
    from neuron_build.release.pull import pull_release  # pull imports the store records only

    if release.backend not in CACHE_BACKENDS:
        article = "an" if release.backend[:1] in "aeiou" else "a"
        return (True, f"{article} {release.backend} release holds compiled models, not caches: nothing to "
                         "warm", {"applies": False})
    kind = artifact_device_kind(release.backend, release.hardware_target)
    figures: dict[str, Any] = {"applies": True, "device_kind": device_kind, "release_device_kind": kind}
    why = None
    if kind != device_kind:
        why = f"the release runs on {kind}, the channel serves {device_kind}"
    else:
        ok, why = can_run_here(kind)
        why = None if ok else why
    if why is not None:
        figures.update(checked=False, reason=why)
        if allow_not_checked:
            return (True, f"overridden by --allow-unvalidated (not checked: {why})",
                             {**figures, "overridden": True})
        return (False, f"not checked: {why}", figures)
    with tempfile.TemporaryDirectory(prefix="neuron-build-gate-") as tmp:
        dest = Path(tmp) / release.model
        pull_release(store, release, dest)
        report = run_fresh(dest, factory_root)
    rows = {b["id"]: {"compiles": b["compiles"], "cache_hits": b["cache_hits"], "first_call_s": b["first_call_s"],
                      "steady_call_s": b["steady_call_s"]} for b in report["buckets"]}
    compiled = sorted(b for b, r in rows.items() if r["compiles"])
    figures.update(checked=True, buckets=rows, compiled=compiled, device=report.get("device"))
    if compiled:
        return (False, f"a fresh-process warm-up compiled {report['compiles_total']} graph(s) in "
                         f"{', '.join(compiled)}: the pulled caches do not cover them (paths, flags, environment or "
                         f"bucket list drifted); rebuild, or compare `neuron-build show` of the buckets", figures)
    return (True, f"a fresh-process warm-up of {len(rows)} bucket(s) compiled nothing on "
                     f"{report.get('device')}", figures)


__all__ = ["CACHE_BACKENDS", "GATE", "run_fresh", "warmup_verdict"]
