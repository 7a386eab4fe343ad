"""The inductor backend: ``torch.export`` then AOTInductor packaging to ``model.pt2``.

Op count: the kernels the compiled artifact launches, read from the generated C++ wrapper inside the
package: call sites, in the wrapper's ``run_impl``, of fused kernels (``cpp_fused_*`` on CPU, Triton
launches on CUDA) plus extern calls into ATen (``aoti_torch_cpu_*``/``aoti_torch_cuda_*`` ops and the
``aoti_torch_*_out`` fallbacks such as ``aoti_torch_cpu_addmm_out``). Allocations and views
(``aoti_torch_empty_strided``, ``reinterpret_tensor``) are not kernels and are not counted.

With the profile's ``weights = "external"`` (the request's ``inline_weights_to_neff`` false) the package is
weight-free (:data:`neuron_build.compilers.weights.AOTI_EXTERNAL_CONFIG`), the weights go beside it
(``weights.safetensors`` + ``weights.json``) and the graph key is made from the structure part of the
graph (:func:`neuron_build.compilers.weights.structure_document`): a weights-only change is relinked.
"""

from __future__ import annotations

import re
import zipfile
from collections import Counter
from pathlib import Path

from neuron_build.compilers import graph_key, weights
from neuron_build.compilers.base import (
    EXIT_TOOLCHAIN_MISSING,
    CompileFailed,
    CompilerBase,
    CompileRequest,
    CompileResult,
    enter_stage,
)
from neuron_build.loaders import AOTI_LOADER
from neuron_build.status import Status

OP_COUNT_SOURCE = "aoti-wrapper: fused kernel + extern kernel call sites in run_impl"
_FUSED = re.compile(r"\b(cpp_fused_\w+|triton_\w+)\s*\(")
_TRITON_LAUNCH = re.compile(r"\b(launchKernel|call_triton_\w+)\s*\(")
_EXTERN = re.compile(r"\b(aoti_torch_(?:cpu|cuda)_\w+|aoti_torch_\w+_out|aoti_torch_proxy_executor_call_function)\s*\(")
_NOT_KERNELS = ("aoti_torch_empty_strided", "aoti_torch_cpu_empty_strided", "aoti_torch_cuda_empty_strided")


def count_wrapper_kernels(wrapper_cpp: str) -> tuple[int, dict[str, int]]:
    """Count kernel launches in an AOTInductor C++ wrapper.

    Args:
        wrapper_cpp: the text of ``*.wrapper.cpp``.

    Returns:
        (total, {"fused": n, "extern": m, "per_kernel": {...}}).
    """
    start = wrapper_cpp.find("::run_impl(")
    body = wrapper_cpp[start:] if start >= 0 else wrapper_cpp
    fused = Counter(m.group(1) for m in _FUSED.finditer(body))
    fused.update(m.group(1) for m in _TRITON_LAUNCH.finditer(body))
    extern = Counter(m.group(1) for m in _EXTERN.finditer(body) if m.group(1) not in _NOT_KERNELS)
    n_fused, n_extern = sum(fused.values()), sum(extern.values())
    return n_fused + n_extern, {"fused": n_fused, "extern": n_extern,
                                "distinct_fused": len(fused), "extern_ops": dict(sorted(extern.items()))}


def count_package_kernels(package: Path) -> tuple[int, dict]:
    """Op count of a ``.pt2`` AOTInductor package (see :func:`count_wrapper_kernels`).

    Raises:
        CompileFailed: the package holds no wrapper source.
    """
    with zipfile.ZipFile(package) as z:
        names = [n for n in z.namelist() if n.endswith(".wrapper.cpp") or n.endswith("wrapper.cpp")]
        if not names:
            raise CompileFailed(Status.ERROR, f"{package.name} holds no generated wrapper source to count kernels in")
        total, breakdown = 0, {"fused": 0, "extern": 0, "distinct_fused": 0, "extern_ops": {}}
        for n in names:
            t, b = count_wrapper_kernels(z.read(n).decode("utf-8", "replace"))
            total += t
            for k in ("fused", "extern", "distinct_fused"):
                breakdown[k] += b[k]
            for op, c in b["extern_ops"].items():
                breakdown["extern_ops"][op] = breakdown["extern_ops"].get(op, 0) + c
    return total, breakdown


def _external_state(ep, folder: Path) -> dict | None:
    """The exported program's weights, written beside the package (:func:`weights.write`); None (a warning:
    the target compiles with its weights inline) when they cannot be read or written: fail closed."""
    try:
        state = weights.exported_state(ep)
        weights.write(folder, state)
        return state
    except Exception as e:  # an unreadable state dict, a dtype safetensors cannot hold: compile inline
        for name in (weights.WEIGHTS_FILE, weights.SPEC_FILE):
            (folder / name).unlink(missing_ok=True)
        print(f"warning: the weights cannot be kept apart ({type(e).__name__}: {str(e)[:200]}); "
              "compiling with the weights inline", flush=True)
        return None


def _compile(ep, out: Path, external: bool, state: dict | None) -> str | None:
    """AOTInductor-compile ``ep`` to ``out``; with ``external``, weight-free (the weights file beside it)
    when the package lists every weight, else (fail closed) compiled again with the weights inlined and the
    weights files removed. Returns why the weights ended up inline, or None."""
    import torch

    if not external:
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out))
        return None
    torch._inductor.aoti_compile_and_package(ep, package_path=str(out), inductor_configs=weights.AOTI_EXTERNAL_CONFIG)
    try:
        why = weights.uncovered(list(torch._inductor.aoti_load_package(str(out)).get_constant_fqns()), state or {})
    except Exception as e:  # a package that cannot list its constants cannot take them from outside
        why = f"the package cannot list its constants ({type(e).__name__})"
    if why is None:
        return None
    print(f"warning: {why}: compiling with the weights inlined", flush=True)
    for name in (weights.WEIGHTS_FILE, weights.SPEC_FILE):
        (out.parent / name).unlink(missing_ok=True)
    torch._inductor.aoti_compile_and_package(ep, package_path=str(out))
    return why


class InductorCompiler(CompilerBase):
    """``torch.export.export`` + ``torch._inductor.aoti_compile_and_package`` -> ``model.pt2``."""

    name = "inductor"

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        import torch

        device = request.hardware_target
        if device == "cuda" and not torch.cuda.is_available():
            raise CompileFailed(Status.TOOLCHAIN_MISSING, "device = \"cuda\" but this host has no CUDA device; "
                                "set device = \"cpu\" under [build]", EXIT_TOOLCHAIN_MISSING)
        model = model.to(device)
        example_inputs = tuple(t.to(device) for t in example_inputs)
        print(f"torch.export.export: {len(example_inputs)} inputs "
              f"{[tuple(t.shape) for t in example_inputs]}", flush=True)
        enter_stage("export")
        with torch.no_grad():
            ep = torch.export.export(model, example_inputs, strict=False)
        print(f"exported graph: {len(ep.graph.nodes)} nodes; AOTInductor compile for {device}", flush=True)
        out = Path(request.out_dir) / "model.pt2"
        state = _external_state(ep, out.parent) if not request.inline_weights_to_neff else None
        external = state is not None  # the profile's weights = "external", and the weights could be written
        if external:  # (beside the package, before the key: a hit relinks them)
            graph_key.checkpoint(request, lambda: weights.structure_document(ep, state))
        else:
            graph_key.checkpoint(request, lambda: graph_key.export_document(ep))  # a hit stops before compiling
        enter_stage("compile")  # compiles and writes model.pt2 in one call
        why = _compile(ep, out, external, state)
        if not external and not request.inline_weights_to_neff:
            why = "the weights could not be kept apart"
        enter_stage("count")
        ops, breakdown = count_package_kernels(out)
        print(f"op count {ops} ({breakdown['fused']} fused, {breakdown['extern']} extern)", flush=True)
        from neuron_build.cpu_isa import package_cpu_isa

        isa = package_cpu_isa(out)  # -march=native: the package needs a host with this ISA
        details = {"artifact": "model.pt2", "loader": AOTI_LOADER,
                   "exported_nodes": len(ep.graph.nodes), "op_breakdown": breakdown,
                   "weights": "external" if external and why is None else "inline"}  # (relink: only external)
        if why is not None:
            details["weights_inline_why"] = why
        if isa is not None:
            details["cpu_isa"] = isa
        return CompileResult(op_count=ops, op_count_source=OP_COUNT_SOURCE, details=details)


__all__ = ["OP_COUNT_SOURCE", "InductorCompiler", "count_package_kernels", "count_wrapper_kernels"]
