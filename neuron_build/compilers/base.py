"""The seam between the build and a compiler backend.

A backend's compiler is a :class:`CompilerBase` subclass with a ``name`` and a
``compile(model, example_inputs, request)`` method, run inside the worker subprocess
(``python -m neuron_build.worker``). It writes the artifact's files into ``request.out_dir`` and returns a
:class:`CompileResult`. Failures are raised as :class:`CompileFailed` with a manifest status (see
:class:`neuron_build.status.Status`) and a one-line reason. ``preflight(request)`` runs before the model is
built (a missing toolchain fails in a second, not after loading the weights); ``needs_module`` False means
the compiler reads the checkpoint itself and the worker builds no model.

Compilers are named by their backend's record (:mod:`neuron_build.backends`: ``compiler``,
``textgen_compiler``) and imported lazily, so the build process never imports torch or a compiler.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

from neuron_build.backends import BACKENDS as _RECORDS
from neuron_build.backends import get_backend
from neuron_build.errors import NeuronBuildError

#: backend name -> "module:class" of its forward-graph compiler (each record's ``compiler``).
BACKENDS = {b.name: b.compiler for b in _RECORDS.values()}

#: worker exit status for a missing toolchain (the compiler's own statuses pass through).
EXIT_TOOLCHAIN_MISSING = 3
#: The worker-log line that marks where a compile is: ``neuron-build stage: <stage>``. The build reads the
#: last one of a failed compile as its failure stage (a killed worker writes no error.json, but its log
#: has the line).
STAGE_PREFIX = "neuron-build stage: "
#: The stages, in order: building the model and its example inputs (``model``), capturing the graph
#: (``export``: torch.export / torch.jit.trace), compiling it (``compile``: AOTInductor, torch.jit.freeze,
#: torch_neuronx.trace with neuronx-cc), writing the artifact (``save``), counting its ops (``count``).
STAGES = ("model", "export", "compile", "save", "count")


def enter_stage(name: str) -> None:
    """Print the :data:`STAGE_PREFIX` line of stage ``name`` (one of :data:`STAGES`) to the worker log."""
    print(f"{STAGE_PREFIX}{name}", flush=True)


@dataclass
class CompileRequest:
    """Everything the worker needs to compile one target; written to ``request.json``.

    ``factory`` (``module.path:function``) builds the model, or, for an hf model, ``hf`` (the record of
    :func:`neuron_build.hf.spec`) names the Hugging Face model it loads (``factory`` is then None); ``kwargs``
    go to the factory or to ``from_pretrained``.
    ``inputs`` are concrete input specs (``name``, ``shape``, ``dtype``, ``range``). ``out_dir`` receives
    the artifact's files; ``work_dir`` is the compiler workdir (absolute). ``seed`` makes the example inputs.
    ``never_read``: folders (absolute) whose files are never recorded inputs and are not watched while the
    factory runs: the store and the state folder (a store of thousands of folders would otherwise exhaust
    inotify's watches, and every record would be incomplete).
    """

    target: str
    key: str
    root: str
    factory: str | None
    kwargs: dict[str, Any]
    dtype: str
    inputs: list[dict[str, Any]]
    backend: str
    hardware_target: str
    compiler_args: list[str]
    inline_weights_to_neff: bool
    tp_degree: int
    out_dir: str
    work_dir: str
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    hf: dict[str, Any] | None = None
    never_read: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompileResult:
    """What a backend reports: the op count (kernels the artifact launches), how it was counted, and any
    backend details for the manifest's ``compiler`` section."""

    op_count: int | None
    op_count_source: str | None
    details: dict[str, Any] = field(default_factory=dict)


class CompileFailed(NeuronBuildError):
    """A compile that failed in a known way.

    Args:
        status: a manifest status (``ERROR``, ``TRANSIENT``, ``TOOLCHAIN_MISSING``, ...).
        reason: one line for the CLI.
        exit_code: the worker's exit status.
        details: extra fields for the failure record (diagnostics, ...).
    """

    def __init__(self, status: str, reason: str, exit_code: int = 1, details: dict[str, Any] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.exit_code = status, reason, exit_code
        self.details = details or {}


class Compiler(Protocol):
    """A compiler backend (runs in the worker); :class:`CompilerBase` gives the defaults."""

    name: str
    #: False: the compiler reads the model's checkpoint itself; the worker builds no model (passes None).
    needs_module: bool

    def preflight(self, request: CompileRequest) -> None:
        """Check the toolchain before the (possibly slow) model build.

        Raises:
            CompileFailed: ``TOOLCHAIN_MISSING`` (exit 3) with the install hint, or ``ERROR``.
        """
        ...

    def compile(self, model: Any, example_inputs: tuple, request: CompileRequest) -> CompileResult:
        """Compile ``model`` for ``example_inputs`` (a tuple of tensors with the bucket's shapes and
        dtypes) and write the artifact files into ``request.out_dir``.

        Raises:
            CompileFailed: with the manifest status and a one-line reason.
        """
        ...


class CompilerBase:
    """The defaults of :class:`Compiler`: the worker builds the model (``needs_module``), and there is no
    toolchain to check before it (``preflight`` does nothing). Subclasses set ``name`` and ``compile``."""

    name: ClassVar[str] = ""
    needs_module: ClassVar[bool] = True

    def preflight(self, request: CompileRequest) -> None:
        """Nothing to check before the model build (see :meth:`Compiler.preflight`)."""

    def compile(self, model: Any, example_inputs: tuple, request: CompileRequest) -> CompileResult:
        """See :meth:`Compiler.compile`."""
        raise NotImplementedError(f"{type(self).__name__}.compile")


def load_class(ref: str) -> type:
    """The class ``"module.path:Class"`` names (imports the module).

    Raises:
        ImportError, AttributeError: the module or class does not exist.
    """
    mod, _, cls = ref.partition(":")
    return getattr(importlib.import_module(mod), cls)


def load_compiler(name: str) -> Compiler:
    """Instantiate the forward-graph compiler of backend ``name`` (its record's ``compiler``).

    Raises:
        KeyError: no such backend.
    """
    return load_class(get_backend(name).compiler)()


__all__ = ["BACKENDS", "EXIT_TOOLCHAIN_MISSING", "STAGES", "STAGE_PREFIX", "CompileFailed", "CompileRequest",
           "CompileResult", "Compiler", "CompilerBase", "enter_stage", "load_class", "load_compiler"]
