"""The compile subprocess: ``python -m neuron_build.worker REQUEST.json``; the graph probe of one model
build: ``python -m neuron_build.worker --graphs PROBE.json`` (:func:`probe`).

Reads a :class:`~neuron_build.compilers.base.CompileRequest`, builds the model from its factory, makes the
example inputs, runs the backend, and writes ``result.json`` (op count, its source, backend details, and
``imported``: the project files, relative to the project folder, that were imported while the model was
built and compiled, so the manifest records modules no static reading finds; ``reads``: the project
files the model's code opened (by any code) and the environment variables it read while the model was built,
traced or exported and compiled, each file's sha256 when the block that read it ended (``digests``), and the
distributions the model's build imported, :class:`WorkerReads`; ``graph_key``, ``graph_document`` and ``graph_hit``: the graph key the
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
from neuron_build.util import plural, write_json_atomic

__all__ = ["WorkerReads", "main", "probe", "run"]


def run(request_path: str) -> int:
    """Run one compile request; returns the process exit status."""
    from neuron_build.compilers.base import CompileFailed, CompileRequest, enter_stage, load_compiler

    req = CompileRequest(**json.loads(Path(request_path).read_text()))
    work = Path(req.work_dir)
    t0 = time.monotonic()
    recording = WorkerReads(req, work)
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
            recording.start()  # what the model's code opens and reads: model build, trace/export, compile
            model = (build_model(req.root, req.factory, req.kwargs, req.dtype, hf=req.hf)
                     if compiler.needs_module else None)
            recording.model_built(modules_before)
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
        reads = recording.end()
    except graph_key.GraphHit as e:  # the graph index holds this graph's artifact: nothing compiled
        reads = recording.end()
        graph = _graph_file(work)  # (a hit re-raised by a wrapper may have lost its document digest)
        document = e.document or (graph.get("document") if graph.get("graph_key") == e.graph_key else None)
        write_json_atomic(work / "result.json", {"op_count": None, "op_count_source": None, "details": {},
                                                 "imported": _imported(req, work), "graph_key": e.graph_key,
                                                 "graph_document": document, "graph_hit": True,
                                                 "reads": reads})
        print(f"graph unchanged: done in {time.monotonic() - t0:.1f} s without compiling", flush=True)
        return 0
    except CompileFailed as e:
        recording.end()
        print(f"compile failed: {e.status}: {e.reason}", flush=True)
        write_json_atomic(work / "error.json", {"status": e.status, "reason": e.reason, "details": e.details})
        return e.exit_code
    except Exception as e:  # an unexpected failure in the compiler or the model: a compile error
        recording.end()
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


class WorkerReads:
    """What the model's own code reads in a worker, compile or graph probe alike
    (:class:`~neuron_build.project.reads.ReadRecorder`): the files it opens and the variables it reads
    while the model is built (the factory call) and then traced, exported and compiled, the worker's own
    folders left out. ``dists`` stay those the model's build imported (a compile and a graph reuse record
    the same set).

    Each recorded file's sha256 is taken when the block that read it ends: the factory call for what the
    factory read, the end of the compile for what trace, export or compile read first (a file over 64 MiB,
    a checkpoint, by its stat signature instead: it is not read twice). The record's
    ``digests`` (path -> sha256, ``missing``) let the builder see a file that changed between the read and
    the publish (the artifact holds the old content): :func:`neuron_build.build.builder.Builder` then marks
    the record incomplete.

    Use: :meth:`start` before the model is built, :meth:`model_built` when the factory returned,
    :meth:`end` (idempotent; a no-op when never started) when the compile or the probe ended; the record
    is :attr:`reads`.
    """

    def __init__(self, req, work: Path):
        self.root = Path(req.root)
        self._exclude = [work.parent, Path(req.out_dir).parent, *map(Path, req.never_read)]
        self._recorder = None
        self._records: list[dict] = []
        self._dists: list[str] = []
        self.digests: dict[str, str] = {}
        #: the record (``files``, ``env``, ``dists``, ``digests``, ``incomplete``), set by :meth:`end`
        self.reads: dict | None = None

    def start(self) -> WorkerReads:
        """Begin recording (a new block)."""
        from neuron_build.project.reads import ReadRecorder
        self._recorder = ReadRecorder(self.root, exclude=self._exclude)
        self._recorder.__enter__()
        return self

    def _stop(self, modules_before: list[str] | None) -> None:
        from neuron_build.project.read_check import record_path
        rec, self._recorder = self._recorder, None
        if rec is None:
            return
        rec.__exit__(None, None, None)
        record = rec.to_json(list(sys.modules) if modules_before is None else modules_before)
        for rel in record.get("files", []):
            if rel not in self.digests:  # the content as it is when the block that read it ends
                path = record_path(self.root, rel)  # a project file, or one outside it (``~/...``, absolute)
                self.digests[rel] = _sha256(path) if path is not None else "missing"
        self._records.append(record)

    def model_built(self, modules_before: list[str]) -> None:
        """The factory returned: digest what it read, note the distributions it imported, record on."""
        self._stop(modules_before)
        self._dists = self._records[-1].get("dists", []) if self._records else []
        self.start()

    def end(self) -> dict | None:
        """Stop recording; the record (None when recording never started)."""
        if self._recorder is None:
            return self.reads
        self._stop(None)
        from neuron_build.project.reads import merge
        reads: dict = merge(*self._records)
        reads["dists"] = list(self._dists)
        reads["digests"] = {f: self.digests[f] for f in reads.get("files", []) if f in self.digests}
        why = [r["incomplete"] for r in self._records if r.get("incomplete")]
        if why:
            reads["incomplete"] = why[0]
            print(f"warning: {why[0]}: this artifact is rebuilt by every build", flush=True)
        self.reads = reads
        return reads


def _sha256(path: Path) -> str:
    """sha256 of a file, ``missing`` when it cannot be read; a file over
    :data:`~neuron_build.project.declared.READ_STAT_BYTES` (a checkpoint: not read twice) by its stat
    signature instead (:func:`~neuron_build.project.declared.stat_digest`)."""
    from neuron_build.project.declared import READ_STAT_BYTES, stat_digest
    from neuron_build.util import file_sha256
    try:
        if not path.is_file():
            return "missing"
        return stat_digest(path) if path.stat().st_size > READ_STAT_BYTES else file_sha256(path)
    except OSError:
        return "missing"


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
    (:mod:`neuron_build.build.graph.probe`). ``PROBE.json`` is ``{"requests": [CompileRequest, ...],
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

    spec = json.loads(Path(spec_path).read_text())
    reqs = [CompileRequest(**r) for r in spec["requests"]]
    out = Path(spec["results"])
    first, t0 = reqs[0], time.monotonic()
    work = Path(first.work_dir)
    recording = WorkerReads(first, work)
    print(f"neuron-build graph probe: model {first.factory or (first.hf or {}).get('source')} dtype {first.dtype} "
          f"backend {first.backend}: {plural(len(reqs), 'target')}", flush=True)
    try:
        if first.options.get("task") == "text-generation":
            from neuron_build.compilers.textgen import textgen_compiler
            compiler = textgen_compiler(first.backend)
        else:
            compiler = load_compiler(first.backend)
        compiler.preflight(first)
        modules_before = list(sys.modules)
        graph_key.watch_custom_ops()
        recording.start()  # as a compile worker records: the model build, then every target's export
        model = (build_model(first.root, first.factory, first.kwargs, first.dtype, hf=first.hf)
                 if compiler.needs_module else None)
        recording.model_built(modules_before)
    except Exception as e:  # the target compiles in its own worker, which reports this failure
        recording.end()
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
    reads = recording.end()
    write_json_atomic(out, {"reads": reads, "imported": _imported(first, work), "targets": targets})
    print(f"graph probe done in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


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
