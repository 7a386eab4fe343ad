"""The backends, one frozen record each: what every layer asks about a backend, in one place (torch-free).

As pip's ``vcs/versioncontrol.py`` gives each ``VersionControl`` its facts as attributes, every fact a
caller would otherwise get by comparing a backend's name is a field of its :class:`BackendSpec`, and
callers ask :func:`get_backend`. The config's ``Backend`` type, the text-generation backends, the graph-key
tables (:data:`neuron_build.compilers.graph_key.BEFORE_COMPILE`, ``NO_GRAPH_KEY``), the key's per-backend
environment and artifact format (:mod:`neuron_build.project.keys`), the device kind of an artifact
(:func:`neuron_build.evaluate.validate_setup.artifact_device_kind`) and the compiler loader
(:func:`neuron_build.compilers.base.load_compiler`) are derived from :data:`BACKENDS`.

A new backend is one record here, one compiler module (a :class:`~neuron_build.compilers.base.CompilerBase`
subclass) and one case of ``tests/compilers/test_backend_contract.py`` (``docs/architecture.md``).

Neuron facts: the hardware targets are neuronx-cc's ``--target`` values [doc: toolchain notes];
TorchNeuron (public beta in Neuron 2.33) serves trn2 and trn3 only [doc]; the XLA torch-neuronx
(``torch_neuronx.trace``) serves every target [doc].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = ["AUTO", "AUTO_FALLBACK", "BACKENDS", "BACKEND_CHOICES", "BACKEND_NAMES", "DEVICES", "DEVICE_KINDS",
           "NEURON_TARGETS", "TEXTGEN_BACKENDS", "TORCHNEURON_TARGETS", "BackendSpec", "auto_choice", "find_backend",
           "get_backend"]

#: The Neuron hardware targets ``[build] target`` accepts (neuronx-cc ``--target``) [doc: toolchain notes].
NEURON_TARGETS = ("trn1", "trn1n", "trn2", "trn3", "inf2")
#: The devices ``[build] device`` accepts: where the backends without the Neuron toolchain compile for.
DEVICES = ("cpu", "cuda")
#: Where an artifact is validated, benchmarked and served (:mod:`neuron_build.release.gates`).
DEVICE_KINDS = ("cpu", "cuda", "neuron")
#: Neuron targets TorchNeuron serves (public beta in Neuron 2.33: trn2 and trn3 only) [doc].
TORCHNEURON_TARGETS = ("trn2", "trn3")
#: The ``[build] backend`` value resolved per host (:func:`neuron_build.project.toolchain.resolve_backend`).
AUTO = "auto"
#: What ``auto`` resolves to without a usable Neuron toolchain.
AUTO_FALLBACK = "inductor"

#: When a backend makes its graph key (:mod:`neuron_build.compilers.graph_key`): ``before`` the compile
#: from a capture of the graph (a hit compiles nothing); ``after``: from what the compile itself lowers
#: (the neuron backend's HLO module, seen inside ``torch_neuronx.trace``: a hit stops before neuronx-cc
#: when torch-neuronx has the split functions, else the key is recorded after the compile for the next
#: build); ``none``: no graph to key on (the reason is :attr:`BackendSpec.graph_key_why`).
GraphKeySupport = Literal["before", "after", "none"]
#: How a release of the backend is served: ``artifact`` (the compiled file is loaded: AOTInductor package,
#: TorchScript module) or ``caches`` (the caches are installed, then the eager model is ``torch.compile``'d
#: with the recorded settings: :func:`neuron_build.compilers.compile_cache.compile_from_caches`).
Serving = Literal["artifact", "caches"]


def _frozen(d: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class BackendSpec:
    """One backend's facts (see the module docstring). Strings, tuples and read-only mappings only.

    Attributes:
        name: the ``[build] backend`` value.
        summary: one line for the docs and ``doctor``.
        compiler: ``"module:Class"`` of its forward-graph compiler (run in the worker).
        neuron_toolchain: compiles with the Neuron toolchain for ``[build] target`` (a Neuron hardware
            target; its versions are in the key); else for ``[build] device`` (``cpu``, ``cuda``).
        device_kinds: hardware target -> device kind (:data:`DEVICE_KINDS`) of its artifacts.
        graph_key: :data:`GraphKeySupport`; ``graph_key_why``: one line saying how or why not.
        graph_capture: how :func:`neuron_build.compilers.graph_key.capture_document` captures its graph
            outside a compile (``torch.export``, ``torch.jit.trace``), or None (no capture outside it).
        textgen_compiler: ``"module:Class"`` of its text-generation compiler, or None.
        textgen_engine: what serves its text-generation releases: ``aoti-graphs`` (the prefill and decode
            AOTInductor packages), ``compiled-graphs`` (``torch.compile`` of the static-cache wrapper from
            the caches), ``nxdi`` (NxDI's own application class); None with ``textgen_reason``.
        textgen_reason: one line: why it builds no text-generation model (None when it does).
        textgen_per_batch: one text-generation target per batch size (NxDI compiles every prefill and
            decode bucket of it at once), not one per graph and bucket.
        decode_buckets: takes a text-generation model's ``decode_buckets`` (NxDI's token-generation buckets).
        serving: :data:`Serving`.
        artifact: the file it writes as the artifact (what a bucket's ``artifact`` names).
        artifact_kind: its :data:`neuron_build.artifact.LOAD_RULES` kind (which installed versions load it).
        jit_registers: the module imported before ``torch.jit.load`` of its artifact (registers its
            TorchScript classes, loads onto the device it was saved for), or None.
        torch_compile_backend: the ``torch.compile`` backend of a ``caches`` backend, else None.
        native_device: runs on TorchNeuron's eager ``neuron`` device (PrivateUse1): its profiler waits with
            ``torch.neuron.synchronize`` and still runs (on CPU tensors) without a NeuronCore.
        auto_apis: the torch-neuronx APIs (:class:`neuron_build.project.toolchain.TorchNeuronxApi` kinds)
            for which ``auto`` picks it on a host with a usable Neuron toolchain; ``auto_targets`` the
            hardware targets it serves then (empty: all).
        isa_bound: hardware targets whose artifacts are compiled for the build host's CPU
            (``-march=native``): the key holds the host's CPU ISA.
        artifact_format: bumped when the files it writes for the same model change (in the key).
        key_env: environment variable -> why it changes the compiled artifact (the key's allow-list).
        compiler_stage: the failure stage named when its compiler tool ran and failed (``neuronx-cc``),
            or None (the worker log's last stage).
        weights_apart: its compilers keep the weights apart from the compiled artifact when a profile asks
            (``weights = "external"``: :mod:`neuron_build.compilers.weights`); False: they compile them in, and
            the config refuses such a profile (:mod:`neuron_build.project.weights_checks`).
        textgen_weights_apart: its text-generation compiler keeps the weights apart whatever the profile says
            (NxDI's sharded checkpoint): the profile's choice is left out of those targets' keys.
    """

    name: str
    summary: str
    compiler: str
    neuron_toolchain: bool
    device_kinds: Mapping[str, str]
    graph_key: GraphKeySupport
    graph_key_why: str
    serving: Serving
    artifact: str
    artifact_kind: str
    graph_capture: str | None = None
    textgen_compiler: str | None = None
    textgen_engine: str | None = None
    textgen_reason: str | None = None
    textgen_per_batch: bool = False
    decode_buckets: bool = False
    jit_registers: str | None = None
    torch_compile_backend: str | None = None
    native_device: bool = False
    auto_apis: tuple[str, ...] = ()
    auto_targets: tuple[str, ...] = ()
    isa_bound: tuple[str, ...] = ()
    artifact_format: int = 1
    key_env: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    compiler_stage: str | None = None
    weights_apart: bool = False
    textgen_weights_apart: bool = False

    @property
    def hardware_targets(self) -> tuple[str, ...]:
        """The hardware targets the config accepts for it: :data:`NEURON_TARGETS` or :data:`DEVICES`."""
        return NEURON_TARGETS if self.neuron_toolchain else DEVICES

    @property
    def builds_textgen(self) -> bool:
        """Does it build text-generation models (``task = "text-generation"``)?"""
        return self.textgen_compiler is not None

    def device_kind(self, hardware_target: str) -> str:
        """The device kind (:data:`DEVICE_KINDS`) of its artifacts built for ``hardware_target``. A target the
        record does not list (an old or foreign manifest) is ``neuron`` for a Neuron backend, else ``cpu``."""
        return self.device_kinds.get(hardware_target, "neuron" if self.neuron_toolchain else "cpu")


_ON_NEURON = _frozen({t: "neuron" for t in NEURON_TARGETS})
_ON_DEVICE = _frozen({d: d for d in DEVICES})
_STATIC_CACHE = "neuron_build.compilers.textgen"

#: The environment variables that change the compiled artifact, per backend, each with the reason. Only
#: these are in the key (an allow-list): everything else (``TORCH_LOGS``, ``PYTORCH_JIT_LOG_LEVEL``,
#: ``TORCH_COMPILE_DEBUG``, ``NEURON_RT_*``, cache folders, thread counts) changes logs, debug output, where
#: caches live or how an artifact runs, never what is compiled. README "What is in the key" lists them.
_INDUCTOR_ENV = _frozen({
    "TORCHINDUCTOR_MAX_AUTOTUNE": "autotuning picks other kernels (torch._inductor.config.max_autotune)",
    "TORCHINDUCTOR_FREEZING": "constant-folds weights into the graph (torch._inductor.config.freezing)",
    "TORCHINDUCTOR_CPP_WRAPPER": "generates a C++ wrapper instead of Python (config.cpp_wrapper)",
    "TORCHINDUCTOR_LAYOUT_OPTIMIZATION": "changes tensor layouts in the graph (config.layout_optimization)",
})

#: Every backend, in the order the config's error messages list them.
BACKENDS: Mapping[str, BackendSpec] = MappingProxyType({b.name: b for b in (
    BackendSpec(
        name="neuron", summary="torch_neuronx.trace (XLA) and neuronx-cc: a TorchScript module with the NEFF",
        compiler="neuron_build.compilers.neuron:NeuronCompiler", neuron_toolchain=True, device_kinds=_ON_NEURON,
        graph_key="after",
        graph_key_why="keyed on the HLO module torch_neuronx.trace lowers: a hit stops before neuronx-cc when "
                      "torch-neuronx has the split functions, else the key is recorded after the compile",
        serving="artifact", artifact="model.pt", artifact_kind="neuron", jit_registers="torch_neuronx",
        textgen_compiler="neuron_build.compilers.neuron.nxdi:NxDICompiler", textgen_engine="nxdi",
        textgen_per_batch=True, decode_buckets=True, auto_apis=("xla", "none"), compiler_stage="neuronx-cc",
        weights_apart=True, textgen_weights_apart=True,
        key_env=_frozen({
            "NEURON_CC_FLAGS": "extra neuronx-cc flags added to every compile [doc: toolchain notes, Environment]",
            "XLA_USE_BF16": "casts float tensors to bf16 in the traced graph [doc: toolchain notes, Environment]",
            "XLA_DOWNCAST_BF16": "downcasts fp32 to bf16 in the traced graph [doc: toolchain notes, Environment]",
            "NEURON_COMPILER_OPT_LEVEL": "the opt level torch.compile(backend='neuron') passes [code: toolchain "
                                         "notes]",
            "NEURON_LOGICAL_NC_CONFIG": "logical NeuronCore size (LNC) the NEFF is compiled for [code: toolchain "
                                        "notes]",
            "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "whether a graph that fails to compile raises or runs "
                                                        "eagerly [doc, code: toolchain notes]",
        })),
    BackendSpec(
        name="torchneuron", summary="TorchNeuron's torch.compile(backend=\"neuron\"): its NEFF and compile caches",
        compiler="neuron_build.compilers.neuron.torchneuron:TorchNeuronCompiler", neuron_toolchain=True,
        device_kinds=_ON_NEURON, graph_key="none",
        graph_key_why="torch.compile(backend='neuron') hands its graph to the backend inside Dynamo; "
                      "there is no graph to key on before the compile",
        serving="caches", artifact="compile_cache.bin", artifact_kind="compile-cache",
        torch_compile_backend="neuron", native_device=True, auto_apis=("native",),
        auto_targets=TORCHNEURON_TARGETS,
        textgen_reason="text-generation models on Neuron build with NxDI (backend neuron); TorchNeuron has no "
                       "static-cache text-generation path here",
        # NEURON_CC_FLAGS is appended to the profile's flags; the opt level, the LNC and the fallback switch
        # are set by the backend from the profile (so they are in the key through the compiler args)
        key_env=_frozen({
            "NEURON_CC_FLAGS": "extra neuronx-cc flags, appended to the profile's; the literal string is part of "
                               "TorchNeuron's NEFF cache key [code: toolchain notes]",
            "NEURON_PLATFORM_TARGET_OVERRIDE": "the platform target TorchNeuron compiles for [guess: toolchain "
                                               "notes, vLLM's override]",
        })),
    BackendSpec(
        name="inductor", summary="torch.export and AOTInductor: a .pt2 package (CPU or CUDA)",
        compiler="neuron_build.compilers.inductor:InductorCompiler", neuron_toolchain=False,
        device_kinds=_ON_DEVICE, graph_key="before", graph_capture="torch.export",
        graph_key_why="keyed on the torch.export graph before AOTInductor compiles it",
        serving="artifact", artifact="model.pt2", artifact_kind="aoti",
        textgen_compiler=f"{_STATIC_CACHE}:TextGenInductorCompiler", textgen_engine="aoti-graphs",
        isa_bound=("cpu",), key_env=_INDUCTOR_ENV, weights_apart=True),
    BackendSpec(
        name="compile-cache", summary="torch.compile (Inductor) warmed on the bucket: its caches",
        compiler="neuron_build.compilers.compile_cache:CompileCacheCompiler", neuron_toolchain=False,
        device_kinds=_ON_DEVICE, graph_key="before", graph_capture="torch.export",
        graph_key_why="keyed on the torch.export graph of the model before torch.compile warms it",
        serving="caches", artifact="compile_cache.bin", artifact_kind="compile-cache",
        torch_compile_backend="inductor",
        textgen_compiler=f"{_STATIC_CACHE}:TextGenCompileCacheCompiler", textgen_engine="compiled-graphs",
        key_env=_INDUCTOR_ENV),
    BackendSpec(
        name="torchscript", summary="torch.jit.trace and torch.jit.freeze: a TorchScript module (CPU or CUDA)",
        compiler="neuron_build.compilers.torchscript:TorchScriptCompiler", neuron_toolchain=False,
        device_kinds=_ON_DEVICE, graph_key="before", graph_capture="torch.jit.trace",
        graph_key_why="keyed on the frozen TorchScript graph before it is saved",
        serving="artifact", artifact="model.pt", artifact_kind="torchscript",
        textgen_reason="transformers' static-cache export is a torch.export graph; TorchScript has none",
        key_env=_frozen({"PYTORCH_JIT": "PYTORCH_JIT=0 turns torch.jit.script/trace into no-ops, a different "
                                        "artifact"})),
)})

#: Every backend name, in :data:`BACKENDS` order.
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
#: The ``[build] backend`` values: ``auto`` and every backend.
BACKEND_CHOICES: tuple[str, ...] = (AUTO, *BACKEND_NAMES)
#: The ``[build] backend`` values that build text-generation models (``auto`` included: it resolves to one).
TEXTGEN_BACKENDS: tuple[str, ...] = (AUTO, *(b.name for b in BACKENDS.values() if b.builds_textgen))


def get_backend(name: str) -> BackendSpec:
    """The record of backend ``name`` (``auto`` is resolved first:
    :func:`neuron_build.project.toolchain.resolve_backend`).

    Raises:
        KeyError: no such backend (the message lists them).
    """
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; one of {', '.join(BACKEND_NAMES)}") from None


def find_backend(name: str | None) -> BackendSpec | None:
    """The record of ``name``, or None (``auto``, an unknown name from an untrusted manifest, None)."""
    return BACKENDS.get(name) if isinstance(name, str) else None


def auto_choice(api_kind: str, hardware_target: str | None) -> str | None:
    """The backend ``auto`` picks on a host with a usable Neuron toolchain whose torch-neuronx has API
    ``api_kind`` (``xla``, ``native``, ``none``), or None when that backend does not serve ``hardware_target``
    (the caller falls back to :data:`AUTO_FALLBACK`)."""
    for b in BACKENDS.values():
        if api_kind in b.auto_apis:
            return b.name if not b.auto_targets or hardware_target in b.auto_targets else None
    return None


__all__ = ["AUTO", "AUTO_FALLBACK", "BACKENDS", "BACKEND_CHOICES", "BACKEND_NAMES", "DEVICES", "DEVICE_KINDS",
           "NEURON_TARGETS", "TEXTGEN_BACKENDS", "TORCHNEURON_TARGETS", "BackendSpec", "GraphKeySupport", "Serving",
           "auto_choice", "find_backend", "get_backend"]
