"""The builder's two NxDI hooks: restore a target's NxDI persistent-cache entries from the store into the
compile's workdir before it runs, and point the target's cache at the artifact just published
(:mod:`neuron_build.compilers.neuron.nxdi_cache`, :mod:`neuron_build.store.neuron_cache`). Both do nothing
for any other compile."""

from __future__ import annotations

from pathlib import Path

from neuron_build.build.context import BuildContext
from neuron_build.compilers.base import CompileRequest
from neuron_build.store.contract import ArtifactStore


def restore_cache(store: ArtifactStore, ctx: BuildContext, req: CompileRequest, work: Path) -> None:
    """NxDI: restore the target's persistent-cache entries from ``store`` into ``work`` and tell the worker
    where (``req.options``); a store that cannot be read means a cold cache."""
    from neuron_build.compilers.neuron import nxdi_cache
    from neuron_build.store import neuron_cache
    if not nxdi_cache.is_nxdi(req):
        return
    cache = work / nxdi_cache.CACHE_FILES
    try:
        got = neuron_cache.restore(store, ctx.target.id, ctx.ki.details.get("toolchain", {}).get("neuronx-cc"), cache)
    except OSError as e:
        got = {"error": str(e)}
    req.options[nxdi_cache.OPTION] = str(cache.resolve())
    ctx.log.info("NxDI persistent cache", **{k: (v[:12] if isinstance(v, str) else v) for k, v in got.items()})


def remember_cache(store: ArtifactStore, ctx: BuildContext, req: CompileRequest) -> None:
    """NxDI: point the target's persistent cache at the artifact of ``ctx``'s key just published (best
    effort: a failure is logged)."""
    from neuron_build.compilers.neuron import nxdi_cache
    from neuron_build.store import neuron_cache
    if not nxdi_cache.is_nxdi(req):
        return
    man = store.manifest(ctx.ki.key)
    try:
        neuron_cache.remember(store, ctx.target.id, ctx.ki.details.get("toolchain", {}).get("neuronx-cc"),
                              ctx.ki.key, man.files if man is not None else {})
    except (OSError, ValueError) as e:
        ctx.log.warning("could not record the NxDI cache pointer", error=str(e))


__all__ = ["remember_cache", "restore_cache"]
