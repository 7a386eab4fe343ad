"""The compile subprocess: ``python -m neuron_build.worker REQUEST.json``; the graph probe of one model
build: ``python -m neuron_build.worker --graphs PROBE.json`` (:func:`probe`).

Reads a :class:`~neuron_build.compilers.base.CompileRequest`, builds the model from its factory, makes the
example inputs, runs the backend, and writes ``result.json`` (op count, its source, backend details, and
``imported``: the project files, relative to the project folder, that were imported while the model was
built and compiled, so the manifest records modules no static reading finds; ``reads``: the project
files the factory opened (by any code), the environment variables it read and the distributions the build
imported, :mod:`neuron_build.project.reads`; ``graph_key``, ``graph_document`` and ``graph_hit``: the graph key the
backend made, the digest of its canonical document, and whether the graph index held it,
:mod:`neuron_build.compilers.graph_key`, in which case nothing was
compiled) into the request's work_dir. On failure it writes ``error.json`` (status, reason, details) there and exits with
the failure's exit status: 1 for a compiler error, 3 for a missing toolchain, 70 for a transient tool
failure, 137 for a compiler killed by SIGKILL. Everything it prints goes to the worker log
(``worker.log`` in the artifact, ``failure.log`` beside a failure record).

The compiler's ``preflight(request)`` (:class:`~neuron_build.compilers.base.CompilerBase`) runs before the
model is built, so a missing toolchain fails in a second instead of after loading the model's weights; a
compiler whose ``needs_module`` is False gets no model. When the graph key is made is the backend's record
(:mod:`neuron_build.backends`, ``graph_key``).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from neuron_build.compilers import graph_key
from neuron_build.status import Status
from neuron_build.util import write_json_atomic

__all__ = ["run", "probe", "main", "reads_record"]


def run(request_path: str) -> int:
    """Run one compile request; returns the process exit status."""
    from neuron_build.compilers.base import CompileFailed, CompileRequest, enter_stage, load_compiler

    req = CompileRequest(**json.loads(Path(request_path).read_text()))
    work = Path(req.work_dir)
    t0 = time.monotonic()
    from neuron_build.project.reads import ReadRecorder
    recorder = ReadRecorder(req.root, exclude=[work.parent, Path(req.out_dir).parent, *map(Path, req.never_read)])
    print(f"neuron-build worker: target {req.target} key {req.key[:12]} backend {req.backend} "
          f"({req.hardware_target}) dtype {req.dtype}", flush=True)
    try:
        enter_stage("model")
        spec = _backend(req.backend)
        try:
            from neuron_build.examples import build_model, make_inputs
            if req.options.get("task") == "text-generation":  # prefill / decode graphs of a decoder LM
                from neuron_build.compilers.textgen import textgen_compiler
                compiler = textgen_compiler(req.backend)
            else:
                compiler = load_compiler(req.backend)
            compiler.preflight(req)  # toolchain checks before the (possibly slow) model build
            modules_before = list(sys.modules)  # after the backend's own imports (preflight)
            if (req.options or {}).get(graph_key.OPTION) and spec.graph_key == "before":
                graph_key.watch_custom_ops()  # the kernels the model registers: a custom op is keyed by them
            with recorder:  # what the factory opens and which variables it reads
                model = (build_model(req.root, req.factory, req.kwargs, req.dtype, hf=req.hf)
                         if compiler.needs_module else None)
            # the distributions the model's build imported (not the compile's: a compile and a graph reuse
            # of one model record the same set, so no target's key moves when another compiles)
            reads = recorder.to_json(modules_before)
            if reads.get("incomplete"):
                print(f"warning: {reads['incomplete']}: this artifact is rebuilt by every build", flush=True)
        except CompileFailed:
            raise
        except ImportError as e:
            what = f"hf model {req.hf['source']} does not load" if req.hf else f"factory {req.factory} does not import"
            raise CompileFailed(Status.ERROR, f"{what}: {e}") from e
        inputs = make_inputs(req.inputs, req.seed)
        print(f"model built in {time.monotonic() - t0:.1f} s", flush=True)
        if (req.options or {}).get(graph_key.OPTION) and spec.graph_key == "none":
            print(f"no graph key for backend {req.backend}: {spec.graph_key_why}; compiling", flush=True)
        result = compiler.compile(model, inputs, req)
    except graph_key.GraphHit as e:  # the graph index holds this graph's artifact: nothing compiled
        graph = _graph_file(work)  # (a hit re-raised by a wrapper may have lost its document digest)
        document = e.document or (graph.get("document") if graph.get("graph_key") == e.graph_key else None)
        write_json_atomic(work / "result.json", {"op_count": None, "op_count_source": None, "details": {},
                                                 "imported": _imported(req, work), "graph_key": e.graph_key,
                                                 "graph_document": document, "graph_hit": True,
                                                 "reads": reads})
        print(f"graph unchanged: done in {time.monotonic() - t0:.1f} s without compiling", flush=True)
        return 0
    except CompileFailed as e:
        print(f"compile failed: {e.status}: {e.reason}", flush=True)
        write_json_atomic(work / "error.json", {"status": e.status, "reason": e.reason, "details": e.details})
        return e.exit_code
    except Exception as e:  # an unexpected failure in the compiler or the model: a compile error
        traceback.print_exc()
        sys.stdout.flush()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        write_json_atomic(work / "error.json", {"status": Status.ERROR, "reason": f"{type(e).__name__}: {first}"[:500],
                                     "details": {}})
        return 1
    graph = _graph_file(work)
    write_json_atomic(work / "result.json", {"op_count": result.op_count, "op_count_source": result.op_count_source,
                                  "details": result.details, "imported": _imported(req, work),
                                  "graph_key": graph.get("graph_key"), "graph_hit": False,
                                  "graph_document": graph.get("document"),
                                  "reads": reads})
    print(f"compile done in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


def _backend(name: str):
    """The record of backend ``name`` (:func:`neuron_build.backends.get_backend`).

    Raises:
        CompileFailed: ERROR for an unknown backend (a request this version did not write).
    """
    from neuron_build.backends import get_backend
    from neuron_build.compilers.base import CompileFailed
    try:
        return get_backend(name)
    except KeyError as e:
        raise CompileFailed(Status.ERROR, str(e.args[0])) from None


def probe(spec_path: str) -> int:
    """The graph probe: ``python -m neuron_build.worker --graphs PROBE.json``
    (:mod:`neuron_build.build.graph_probe`). ``PROBE.json`` is ``{"requests": [CompileRequest, ...],
    "results": path}``: requests of one model build (same root, factory or hf, kwargs, dtype, backend and
    task), each with the graph key option's ``probe`` set. The model is built once (its reads recorded
    once); each target gets a deep copy of it and its own example inputs, and its backend runs up to the
    graph key (:func:`neuron_build.compilers.graph_key.checkpoint` stops it there: nothing is compiled).
    Writes ``results``: ``{"reads", "imported", "targets": {key: {"graph_key", "graph_document"} or
    {"graph_key": null, "reason"}}}``. Exit status 0, or 1 when the model does not build (``results``
    then holds ``{"error": reason}``)."""
    import copy

    from neuron_build.compilers.base import CompileRequest, load_compiler
    from neuron_build.examples import build_model, make_inputs
    from neuron_build.project.reads import ReadRecorder

    spec = json.loads(Path(spec_path).read_text())
    reqs = [CompileRequest(**r) for r in spec["requests"]]
    out = Path(spec["results"])
    first, t0 = reqs[0], time.monotonic()
    work = Path(first.work_dir)
    print(f"neuron-build graph probe: model {first.factory or (first.hf or {}).get('source')} dtype {first.dtype} "
          f"backend {first.backend}: {len(reqs)} targets", flush=True)
    try:
        if first.options.get("task") == "text-generation":
            from neuron_build.compilers.textgen import textgen_compiler
            compiler = textgen_compiler(first.backend)
        else:
            compiler = load_compiler(first.backend)
        compiler.preflight(first)
        modules_before = list(sys.modules)
        graph_key.watch_custom_ops()
        recorder = ReadRecorder(first.root, exclude=[work.parent, Path(first.out_dir).parent,
                                                     *map(Path, first.never_read)])
        with recorder:
            model = (build_model(first.root, first.factory, first.kwargs, first.dtype, hf=first.hf)
                     if compiler.needs_module else None)
        reads = reads_record(recorder, modules_before)
    except Exception as e:  # the target compiles in its own worker, which reports this failure
        traceback.print_exc()
        write_json_atomic(out, {"error": f"the model does not build: {type(e).__name__}: {e}"[:500]})
        return 1
    print(f"model built in {time.monotonic() - t0:.1f} s", flush=True)
    targets: dict[str, dict] = {}
    for req in reqs:
        t1 = time.monotonic()
        try:  # a copy: whatever one target's export changes in the model, the next starts from the build
            compiler.compile(copy.deepcopy(model), make_inputs(req.inputs, req.seed), req)
            targets[req.key] = {"graph_key": None, "reason": "the backend made no graph key"}
        except graph_key.GraphHit as e:
            targets[req.key] = {"graph_key": e.graph_key, "graph_document": e.document}
        except graph_key.NoGraphKey as e:
            targets[req.key] = {"graph_key": None, "reason": f"no graph key: {e}"}
        except Exception as e:
            first_line = (str(e).strip().splitlines() or [""])[0]
            targets[req.key] = {"graph_key": None, "reason": f"{type(e).__name__}: {first_line}"[:500]}
        print(f"{req.target}: graph key {(targets[req.key]['graph_key'] or 'none')[:12]} "
              f"({time.monotonic() - t1:.2f} s){'' if targets[req.key]['graph_key'] else ': ' + targets[req.key]['reason']}",
              flush=True)
    write_json_atomic(out, {"reads": reads, "imported": _imported(first, work), "targets": targets})
    print(f"graph probe done in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


def reads_record(recorder: Any, modules_before: list[str]) -> dict:
    """The record of what a model build read (``reads`` of ``result.json`` and of the probe's results): one
    function for the compile worker and the graph probe, so both record reads in the same shape (digests
    included)."""
    return recorder.to_json(modules_before)


def _imported(req, work: Path) -> list[str]:
    """The project files (relative POSIX paths) imported while the model was built and compiled."""
    from neuron_build.project.sources import recorded_files
    return recorded_files(sys.modules.values(), Path(req.root),
                          exclude=[work.parent, Path(req.out_dir).parent, *map(Path, req.never_read)])


def _graph_file(work: Path) -> dict:
    """What the backend wrote about its graph key (:data:`graph_key.GRAPH_FILE`), or {}."""
    try:
        raw = json.loads((work / graph_key.GRAPH_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--graphs":
        return probe(argv[1])
    if len(argv) != 1:
        print("usage: python -m neuron_build.worker REQUEST.json | --graphs PROBE.json", file=sys.stderr)
        return 2
    return run(argv[0])


if __name__ == "__main__":
    sys.exit(main())
