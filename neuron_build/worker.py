"""The compile subprocess: ``python -m neuron_build.worker REQUEST.json``.

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

from neuron_build.compilers import graph_key
from neuron_build.status import Status
from neuron_build.util import write_json_atomic


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
    if len(argv) != 1:
        print("usage: python -m neuron_build.worker REQUEST.json", file=sys.stderr)
        return 2
    return run(argv[0])


if __name__ == "__main__":
    sys.exit(main())
