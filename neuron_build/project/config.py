"""``buckets.toml``: the build matrix, parsed into frozen, strict pydantic models.

Every fault is reported once, with the file, the TOML path (``models.minilm.buckets.seq[2]``), what is
wrong and what is allowed; unknown keys get a "did you mean" hint. Checks that need the file system
(the factory module exists and defines the function, declared weight files exist) are done here too,
statically: loading a config never imports torch or the model's code.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import typing
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from neuron_build.errors import ConfigError
from neuron_build.project.compiler_args import normalize_compiler_args
from neuron_build.project.config_file import DEFAULT_STATE_DIR, parse_config
from neuron_build.util import sha256_hex

DEFAULT_CONFIG = "buckets.toml"

Dtype = Literal["fp32", "bf16", "fp16"]
InputDtype = Literal["int64", "int32", "int16", "int8", "uint8", "bool", "fp32", "bf16", "fp16"]
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
Backend = Literal["auto", "neuron", "torchneuron", "inductor", "compile-cache", "torchscript"]
NeuronTarget = Literal["trn1", "trn1n", "trn2", "trn3", "inf2"]
Device = Literal["cpu", "cuda"]
Executor = Literal["local", "dask"]
#: ``task`` of a model table: ``forward`` (the default: one graph, the model's forward) or
#: ``text-generation`` (a decoder LM: prefill and decode graphs over one static KV cache).
Task = Literal["forward", "text-generation"]
TEXT_GENERATION = "text-generation"
#: The auto class a text-generation hf model loads with (the default for ``task = "text-generation"``).
CAUSAL_LM = "AutoModelForCausalLM"
#: The backends that build text-generation models (the static-cache export of transformers).
TEXTGEN_BACKENDS = ("auto", "inductor", "compile-cache", "neuron")
#: Where an artifact is validated, benchmarked and served (see :mod:`neuron_build.release.gates`).
DeviceKind = Literal["cpu", "cuda", "neuron"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: The longest model, profile or channel name, in characters: each becomes part of a file name in the store
#: (a file name is at most 255 bytes on Linux and macOS; a target id joins four names in one).
MAX_NAME_CHARS = 64


def long_name_fault(kind: str, name: str) -> str | None:
    """The fault of a ``kind`` name (``"model"``, ``"channel"``) longer than :data:`MAX_NAME_CHARS`, or None."""
    if len(name) <= MAX_NAME_CHARS:
        return None
    return (f"{kind} name {name[:20]!r}... is {len(name)} characters; at most {MAX_NAME_CHARS} (it becomes a file "
            f"name in the store)")
_DIM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):  # TOML true/false would pass as 1.0/0.0 where ints are allowed for floats
        raise ValueError("must be a number, not true/false")
    return v


#: A float setting that also takes an integer (``timeout_s = 600``), never a boolean.
Number = Annotated[float, BeforeValidator(_not_bool)]


def _no_duplicates(v: tuple[str, ...]) -> tuple[str, ...]:
    """``v`` unchanged; a value listed twice is a ValueError naming it (pydantic reports it at its TOML path)."""
    dup = sorted({x for x in v if v.count(x) > 1})
    if dup:
        raise ValueError(f"lists {', '.join(dup)} more than once")
    return v


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BuildSettings(_Frozen):
    """``[build]``: where artifacts go and which compiler runs.

    ``target`` is the Neuron hardware target passed as ``--target`` to neuronx-cc [doc]; ``device`` is
    where the inductor and torchscript backends compile for. ``timeout_s`` bounds one compile, in seconds;
    ``transient_retries`` is how often a compile that exits with the transient status 70 is retried within
    a build; ``heartbeat_s`` is the interval, in seconds, of the "still compiling" progress events.

    ``max_host_memory_gb`` (GB = 1e9 bytes, optional) bounds the summed expected peak resident memory of
    the compiles running at once on this host, across ``-n`` workers and separate builder processes
    sharing the store; a compile's expected peak is the last recorded ``peak_rss_bytes`` of its model and
    bucket, else ``default_compile_memory_gb``. A compile waits while it would exceed the bound, and
    always runs when nothing else is running.

    ``executor`` is where compiles run: ``local`` (worker subprocesses on this host, ``-n`` at once) or
    ``dask`` (one task per target on the Dask distributed cluster whose scheduler is ``scheduler``, e.g.
    ``tcp://build-sched:8786``; unset: Dask's own ``DASK_SCHEDULER_ADDRESS``). Dask workers publish
    straight into the store, so it must be one every worker reaches at the same location.
    ``scheduler_timeout_s`` is how long, in seconds, the client waits for the scheduler to answer and
    for a first worker to join.
    ``store`` is the local store folder (relative to the config's folder; a ``file://`` URL is taken as its
    path; any other URL is refused: remote stores go in ``remote``). ``remote`` (a URL: ``s3://``, ``gs://``, ``file://``, any fsspec
    protocol) is a shared store the local one caches: a build looks up locally, then on the remote, and
    pushes what it compiled. ``remote_options`` are passed to fsspec as storage options (e.g.
    ``{profile = "ci"}`` or ``{client_kwargs = {region_name = "us-west-2"}}``); the standard AWS variables
    (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``, ...) apply as s3fs and boto3 read them.
    Three of them are neuron-build's and bound every call to S3 (``neuron_build.store.wire``, which checks
    them): ``connect_timeout_s`` (5), ``read_timeout_s`` (30) and ``attempts`` (4).
    ``graph_key`` (default true) turns on the second level of the key: on a source-key miss the worker
    captures the graph and reuses an artifact compiled from the same graph instead of compiling
    (``NEURON_BUILD_GRAPH_KEY=0`` in the environment turns it off for one build).
    """

    store: StrictStr = "artifacts"
    backend: Backend = "auto"
    target: NeuronTarget = "trn1"
    device: Device = "cpu"
    timeout_s: Number = Field(default=3600.0, gt=0, strict=False)
    transient_retries: int = Field(default=2, ge=0, le=10, strict=True)
    heartbeat_s: Number = Field(default=15.0, gt=0, strict=False)
    state_dir: StrictStr = DEFAULT_STATE_DIR
    max_host_memory_gb: Number | None = Field(default=None, gt=0, strict=False)
    default_compile_memory_gb: Number = Field(default=4.0, gt=0, strict=False)
    graph_key: StrictBool = True
    executor: Executor = "local"
    scheduler: StrictStr | None = None
    scheduler_timeout_s: Number = Field(default=10.0, gt=0, strict=False)

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[a-z][a-z0-9+.-]*://[^/\s]+$", v):
            raise ValueError(f"{v!r} is not a scheduler address; give one such as \"tcp://build-sched:8786\"")
        return v
    remote: StrictStr | None = None
    remote_options: dict[str, Any] = {}

    @field_validator("store")
    @classmethod
    def _store_location(cls, v: str) -> str:
        if "://" in v and not v.startswith("file://"):
            check_store_url(v)
        return v

    @field_validator("remote")
    @classmethod
    def _remote_url(cls, v: str | None) -> str | None:
        if v is not None:
            if "://" not in v:
                raise ValueError(f"{v!r} is not a URL; give one such as \"s3://bucket/prefix\" (a local folder "
                                 "goes in [build] store)")
            check_store_url(v)
        return v


#: URL schemes of the stores the tool knows how to reach (any other fsspec protocol works too when its
#: package is installed; these are the ones named in messages).
STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "file", "memory")


def check_store_url(url: str) -> None:
    """Raise ValueError (one line with the fix) when ``url`` is not a store URL this tool can use: an
    unknown scheme, or an ``s3://`` URL without a valid bucket name (3-63 characters of lowercase letters,
    digits, dots and hyphens [AWS doc])."""
    scheme, _, rest = url.partition("://")
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
        raise ValueError(f"{url!r} has no valid URL scheme; use e.g. \"s3://bucket/prefix\"")
    if scheme not in STORE_SCHEMES:
        from fsspec.registry import known_implementations
        if scheme not in known_implementations:
            raise ValueError(f"unknown store URL scheme {scheme!r} in {url!r}; use one of "
                             + ", ".join(f"{s}://" for s in STORE_SCHEMES))
    if scheme == "s3":
        bucket = rest.split("/", 1)[0]
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise ValueError(f"{url!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
                             "dots and hyphens); write \"s3://<bucket>/<prefix>\"")


class Profile(_Frozen):
    """``[profiles.NAME]``: compiler args and options.

    ``compiler_args`` are stored normalised (see :func:`neuron_build.project.compiler_args.normalize_compiler_args`).
    ``tp_degree`` is the tensor-parallel degree (NeuronCores per model replica).
    """

    compiler_args: tuple[str, ...] = ()
    inline_weights_to_neff: StrictBool = True
    tp_degree: PositiveInt = Field(default=1, strict=True)

    @field_validator("compiler_args", mode="before")
    @classmethod
    def _normalise(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (str, list, tuple)):
            raise ValueError("must be a list of strings such as [\"--optlevel=2\"]")
        return normalize_compiler_args(v)


class InputSpec(_Frozen):
    """One model input: its name, symbolic shape, dtype and value range.

    ``shape`` holds positive ints and bucket dim names (``["batch", "seq", 1024]``). ``dtype`` defaults to
    the target's dtype (float inputs). ``range`` is ``[low, high)`` for integer inputs (required), and
    optional for float inputs (default: standard normal values). ``pad`` is the value the runtime fills
    padded positions with when it routes a smaller input to a bigger bucket (default 0: the pad token id
    of BERT-style vocabularies and "masked out" for attention masks); it is a serving setting, not part
    of the key.
    """

    name: StrictStr
    shape: tuple[Any, ...]
    dtype: InputDtype | None = None
    range: tuple[float, float] | None = None
    pad: float | None = None

    @field_validator("pad", mode="before")
    @classmethod
    def _pad(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (bool, int, float)):
            raise ValueError(f"pad is {v!r}; it must be a number, the value padded positions get (e.g. 0)")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"{v!r} is not a valid input name; use a Python identifier such as 'input_ids'")
        return v

    @field_validator("shape", mode="before")
    @classmethod
    def _shape(cls, v: Any) -> tuple[Any, ...]:
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError("must be a non-empty list of dims, each a positive int or a bucket dim name")
        for i, d in enumerate(v):
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise ValueError(f"dim {i} is {d!r}; each dim is a positive int or a bucket dim name")
            if isinstance(d, int) and d <= 0:
                raise ValueError(f"dim {i} is {d}; sizes must be positive")
            if isinstance(d, str) and not _DIM.match(d):
                raise ValueError(f"dim {i} is {d!r}; a bucket dim name is an identifier such as 'seq'")
        return tuple(v)

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        if v is None:
            return v
        if (not isinstance(v, (list, tuple)) or len(v) != 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v)):
            raise ValueError("must be [low, high], two numbers")
        if not v[0] < v[1]:
            raise ValueError(f"low {v[0]} must be below high {v[1]} (the range is [low, high))")
        return tuple(v)

    @model_validator(mode="after")
    def _integer_range(self) -> InputSpec:
        if self.dtype in INTEGER_DTYPES and self.dtype != "bool" and self.range is None:
            raise ValueError(f"integer input {self.name!r} needs range = [low, high), e.g. [0, 30522] for token ids")
        if self.pad is not None and self.dtype in INTEGER_DTYPES and float(self.pad) != int(self.pad):
            raise ValueError(f"input {self.name!r} is {self.dtype} but pad = {self.pad}; give a whole number")
        if self.pad is not None and self.dtype == "bool" and self.pad not in (0, 1):
            raise ValueError(f"input {self.name!r} is bool but pad = {self.pad}; give 0 or 1")
        return self

    @property
    def pad_value(self) -> float | int | bool:
        """The pad value with the input's kind: an int for integer inputs, a bool for bool, else a float."""
        v = 0 if self.pad is None else self.pad
        if self.dtype == "bool":
            return bool(v)
        if self.dtype in INTEGER_DTYPES:
            return int(v)
        return float(v)

    @property
    def dims(self) -> tuple[str, ...]:
        """The bucket dim names this input's shape uses."""
        return tuple(d for d in self.shape if isinstance(d, str))


class ModelSpec(_Frozen):
    """``[models.NAME]``: a factory (or a Hugging Face model), its inputs, its buckets and what it is built for.

    ``factory`` is ``module.path:function`` relative to the folder of ``buckets.toml``, called with
    ``kwargs``. Instead of a factory, ``hf`` names a Hugging Face model folder (relative to the config's
    folder, or absolute) or an installed package that ships one, loaded offline with the transformers
    ``auto_class`` (default ``AutoModel``), ``kwargs`` passed to ``from_pretrained``, and ``output`` (a
    field name or a tuple index) selecting what the module returns (see :mod:`neuron_build.hf`); exactly one
    of ``factory`` and ``hf`` is given. ``buckets`` maps
    each bucket dim to its values; a model's buckets are their product. ``weights`` are extra files
    or folders (paths relative to the config's folder, or absolute) whose content is part of the key (a folder:
    every file under it); ``sources`` are globs (relative to the config's folder, ``**`` recursing) of
    further files whose content is part of the key, for code the factory runs that no import statement
    names (see :mod:`neuron_build.project.sources`); ``packages`` are installed distributions whose
    versions, and whose shipped weight files, are part of the key. ``tolerance`` is the relative L2 error
    allowed against the fp32 CPU reference, per dtype (defaults: fp32 1e-4, bf16 and fp16 2e-2; see
    :mod:`neuron_build.evaluate.validate`). ``reference`` names another model whose eager fp32 CPU outputs this
    model is validated against (e.g. a fused variant against its written-out version); it must take the
    same inputs (names, shapes, dtypes, ranges). Neither is part of the key.

    ``task = "text-generation"`` makes a decoder LM (an ``hf`` model loaded with ``AutoModelForCausalLM``,
    or a factory returning a transformers causal LM) two kinds of graph over one static KV cache of
    ``max_seq_len`` positions: ``buckets = { batch = [...], seq = [...] }`` are the prefill (context
    encoding) buckets, and one decode (token generation) graph per batch size runs against the cache
    (:mod:`neuron_build.compilers.textgen`). Such a model has no ``inputs`` (they follow from the task);
    ``decode_buckets`` (cache lengths, NxDI's token-generation buckets) apply to the neuron backend, where
    NxDI compiles all buckets of one batch size in one target (:mod:`neuron_build.project.textgen`).
    ``tolerance.bf16`` is then the relative L2 error allowed on the logits of the first generated token.

    Serving options, read by :class:`neuron_build.runtime.BucketedModel` and recorded in each release
    (never part of the key): ``truncate`` lets an input longer than the largest bucket be cut to it
    (default: a clear error); ``convert_dtypes`` lets an input of another dtype than the artifact's be
    converted (default: a clear error, because a bf16 artifact silently fed fp32 is a classic slow or
    wrong path).
    """

    factory: StrictStr | None = None
    hf: StrictStr | None = None
    auto_class: StrictStr | None = None
    output: StrictStr | int | None = None
    kwargs: dict[str, Any] = {}
    dtypes: tuple[Dtype, ...] = Field(min_length=1)
    profiles: tuple[StrictStr, ...] = Field(min_length=1)
    inputs: tuple[InputSpec, ...] = ()
    buckets: dict[str, tuple[PositiveInt, ...]] = {}
    weights: tuple[StrictStr, ...] = ()
    sources: tuple[StrictStr, ...] = ()
    packages: tuple[StrictStr, ...] = ()
    tolerance: dict[Dtype, float] = {}
    truncate: StrictBool = False
    convert_dtypes: StrictBool = False
    reference: StrictStr | None = None
    task: Task | None = None
    max_seq_len: PositiveInt | None = Field(default=None, strict=True)
    decode_buckets: tuple[PositiveInt, ...] = ()

    @property
    def is_textgen(self) -> bool:
        """True for a text-generation model (``task = "text-generation"``): prefill and decode graphs."""
        return self.task == TEXT_GENERATION

    @field_validator("factory")
    @classmethod
    def _factory(cls, v: str | None) -> str | None:
        if v is None:
            return v
        mod, sep, fn = v.partition(":")
        if not sep or not fn.isidentifier() or not all(p.isidentifier() for p in mod.split(".")):
            raise ValueError(f"{v!r} is not 'module.path:function' (e.g. 'models.minilm:build')")
        return v

    @field_validator("buckets", mode="before")
    @classmethod
    def _buckets(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("must be a table of dim = [sizes], e.g. { batch = [1, 8], seq = [128, 512] }")
        return v

    @field_validator("buckets")
    @classmethod
    def _bucket_values(cls, v: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        for dim, sizes in v.items():
            if not _DIM.match(dim):
                raise ValueError(f"dim name {dim!r} is not an identifier such as 'seq'")
            if not sizes:
                raise ValueError(f"dim {dim!r} has no sizes; give at least one")
            if len(set(sizes)) != len(sizes):
                raise ValueError(f"dim {dim!r} lists a size twice: {list(sizes)}")
        return v

    @field_validator("dtypes", "profiles")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _no_duplicates(v)

    @field_validator("tolerance")
    @classmethod
    def _tol(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not 0 < x < 1:
                raise ValueError(f"{k} = {x}: a relative L2 tolerance is between 0 and 1 (e.g. 2e-2)")
        return v

    @field_validator("auto_class")
    @classmethod
    def _auto_class(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"Auto[A-Za-z0-9]*", v):
            raise ValueError(f"{v!r} is not a transformers auto class; give one such as \"AutoModel\" or "
                             f"\"AutoModelForSequenceClassification\"")
        return v

    @field_validator("output")
    @classmethod
    def _output(cls, v: str | int | None) -> str | int | None:
        if isinstance(v, int) and v < 0 or isinstance(v, str) and not v.isidentifier():
            raise ValueError(f"{v!r} is not an output field name (e.g. \"last_hidden_state\") or a tuple index "
                             f"(0, 1, ...)")
        return v

    @model_validator(mode="after")
    def _factory_or_hf(self) -> ModelSpec:
        if self.factory is None and self.hf is None:
            raise ValueError("gives neither factory nor hf; add factory = \"module.path:function\" or "
                             "hf = \"<model folder or installed package>\"")
        if self.factory is not None and self.hf is not None:
            raise ValueError("gives both factory and hf; keep one (factory builds the module itself, hf loads "
                             "a Hugging Face model folder)")
        if self.factory is not None:
            given = [k for k in ("auto_class", "output") if getattr(self, k) is not None]
            if given:
                many = len(given) > 1
                raise ValueError(f"{' and '.join(given)} {'apply' if many else 'applies'} to hf models only; "
                                 f"remove {'them' if many else 'it'} or replace factory with hf")
        return self

    @property
    def module(self) -> str:
        """The factory's module (``models.minilm``); empty for an hf model."""
        return (self.factory or "").partition(":")[0]

    @property
    def function(self) -> str:
        return (self.factory or "").partition(":")[2]

    def hf_spec(self) -> dict[str, Any] | None:
        """The ``hf`` record of an hf model (:func:`neuron_build.hf.spec`: source, auto class, output, input
        names), None for a factory model."""
        if self.hf is None:
            return None
        from neuron_build import hf

        if self.is_textgen:
            return hf.spec(self.hf, self.auto_class or CAUSAL_LM, "logits", ["input_ids", "cache_position"])
        return hf.spec(self.hf, self.auto_class, self.output, [i.name for i in self.inputs])


def _specifiers(v: dict[str, str], where: str = "") -> dict[str, str]:
    """Package -> version specifier, a bare version (``2.13.*``) read as ``==2.13.*``; a ValueError names a
    specifier that is not PEP 440."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    out = {}
    for pkg, spec in v.items():
        text = spec.strip()
        if text and text[0].isdigit():
            text = "==" + text
        try:
            SpecifierSet(text)
        except InvalidSpecifier:
            raise ValueError(f"{where}{pkg} = {spec!r} is not a version specifier; write e.g. \"2.13.*\" or "
                             f"\">=2.13,<2.14\"") from None
        out[pkg] = text
    return out


class ReleaseSettings(_Frozen):
    """``[release]``: channels and the gates a promotion must pass (:mod:`neuron_build.release`).

    ``channels`` are in promotion order: a release enters the first from a release id, and channel ``i``
    only from channel ``i - 1`` unless ``allow_skip``. Gates: at most ``max_artifacts_per_model`` artifacts
    in a release (load time and device memory grow with every bucket); each bucket's op count at most
    ``max_op_count_regression`` (a fraction: 0.10 = 10 %) above the same bucket's in the channel's current
    release; each bucket's median latency at most ``max_latency_ratio`` times the current release's, at
    confidence ``latency_confidence`` (the gate refuses when the lower bound of the ratio's interval is
    above it; ``max_p99_ratio``, the old name, is read as ``max_latency_ratio``); the p95 of the
    release's compile times at most ``max_compile_time_p95_s`` seconds; every artifact validated on the
    device kind that serves the channel: ``serving_device_kind`` for every channel, unless
    ``channel_device_kind`` names another for a channel (``{ prod = "neuron" }``); and the release built
    with versions the channel's serving hosts run: ``serving`` declares them for every channel
    (``{ torch = "2.13.*" }``: package -> PEP 440 specifier, a bare version meaning ``==``) and
    ``channel_serving`` per channel (``{ prod = { torch = "2.13.*", torch-neuronx = ">=2.13" } }``, on top
    of ``serving``); a channel with neither is not gated on versions.
    """

    channels: tuple[StrictStr, ...] = Field(default=("dev", "staging", "prod"), min_length=1)
    allow_skip: StrictBool = False
    max_artifacts_per_model: int = Field(default=3, ge=1, strict=True)
    max_op_count_regression: Number = Field(default=0.10, ge=0, strict=False)
    max_latency_ratio: Number = Field(default=1.3, gt=0, strict=False)
    latency_confidence: Number = Field(default=0.95, gt=0, lt=1, strict=False)
    max_compile_time_p95_s: Number = Field(default=400.0, gt=0, strict=False)
    serving_device_kind: DeviceKind = "cpu"
    channel_device_kind: dict[str, DeviceKind] = {}
    serving: dict[StrictStr, StrictStr] = {}
    channel_serving: dict[StrictStr, dict[StrictStr, StrictStr]] = {}

    @field_validator("serving")
    @classmethod
    def _serving(cls, v: dict[str, str]) -> dict[str, str]:
        return _specifiers(v)

    @field_validator("channel_serving")
    @classmethod
    def _channel_serving(cls, v: dict[str, dict[str, str]], info: ValidationInfo) -> dict[str, dict[str, str]]:
        channels = info.data.get("channels")
        for c in v:
            if channels is not None and c not in channels:
                raise ValueError(f"names channel '{c}', which is not in channels ({', '.join(channels)})")
        return {c: _specifiers(pkgs, f"{c}.") for c, pkgs in v.items()}

    def serving_for(self, channel: str) -> dict[str, str]:
        """Package -> PEP 440 specifier of the versions the hosts serving ``channel`` run: ``serving``,
        with ``channel_serving[channel]`` on top (empty: nothing declared, nothing gated)."""
        return {**self.serving, **self.channel_serving.get(channel, {})}

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """``max_p99_ratio`` (the gate compared p99s before it compared medians) is ``max_latency_ratio``."""
        if isinstance(data, dict) and "max_p99_ratio" in data:
            data = dict(data)
            old = data.pop("max_p99_ratio")
            if "max_latency_ratio" in data:
                raise ValueError("max_p99_ratio is the old name of max_latency_ratio; give only max_latency_ratio")
            data["max_latency_ratio"] = old
        return data

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for c in v:
            if long_name_fault("channel", c):
                raise ValueError(long_name_fault("channel", c))
            if not _NAME.match(c):
                raise ValueError(f"channel name {c!r} may hold only letters, digits, '_', '.', '-'")
        return _no_duplicates(v)

    @field_validator("channel_device_kind")
    @classmethod
    def _known_channels(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        channels = info.data.get("channels")
        for c in v:
            if channels is not None and c not in channels:
                raise ValueError(f"names channel '{c}', which is not in channels ({', '.join(channels)})")
        return v

    def device_kind(self, channel: str) -> str:
        """The device kind that serves ``channel`` (where its artifacts must have been validated)."""
        return self.channel_device_kind.get(channel, self.serving_device_kind)


class MonitoringSettings(_Frozen):
    """``[monitoring]``: the thresholds of the compile monitoring checklist (``neuron-build report`` and
    ``metrics``, :mod:`neuron_build.store.ledger`) and the bounds of the kept failure workdirs.

    Thresholds (each signal passes when its figure is at most the limit; utilisation when at least):
    ``max_failure_rate`` (a fraction of compile attempts, 0.05 = 5 %); ``max_compile_time_p95_s``
    (nearest-rank p95 of passing compiles, seconds); ``max_recompiles_per_hour`` (compiles of a target
    whose key changed since its last build, the most within any 60 minutes of the window);
    ``max_artifacts_per_model`` (passing artifacts per model, dtype, profile and backend);
    ``max_hbm_fraction`` of ``neuroncore_hbm_gb`` (one NeuronCore's HBM, GB = 1e9 bytes; 16 on trn1 and
    inf2, per the toolchain notes); ``max_p99_ratio`` (p99 latency over the previous artifact's on the same
    device kind); ``min_neuroncore_utilisation`` (a fraction, needs a Neuron device).

    Kept failure workdirs: the last ``keep_failed_workdirs`` per target, at most ``failed_workdirs_max_mb``
    (MB = 1e6 bytes) in all; the oldest go first.
    """

    max_failure_rate: Number = Field(default=0.05, ge=0, le=1, strict=False)
    max_compile_time_p95_s: Number = Field(default=400.0, gt=0, strict=False)
    max_recompiles_per_hour: Number = Field(default=2, ge=0, strict=False)
    max_artifacts_per_model: int = Field(default=3, ge=1, strict=True)
    max_hbm_fraction: Number = Field(default=0.60, gt=0, le=1, strict=False)
    neuroncore_hbm_gb: Number = Field(default=16.0, gt=0, strict=False)
    max_p99_ratio: Number = Field(default=1.3, gt=0, strict=False)
    min_neuroncore_utilisation: Number = Field(default=0.40, ge=0, le=1, strict=False)
    keep_failed_workdirs: int = Field(default=3, ge=0, strict=True)
    failed_workdirs_max_mb: Number = Field(default=1000.0, ge=0, strict=False)


class ConfigFile(_Frozen):
    """The whole ``buckets.toml``."""

    build: BuildSettings = BuildSettings()
    release: ReleaseSettings = ReleaseSettings()
    monitoring: MonitoringSettings = MonitoringSettings()
    profiles: dict[str, Profile] = Field(min_length=1)
    models: dict[str, ModelSpec] = Field(min_length=1)


@dataclass(frozen=True)
class Project:
    """A loaded ``buckets.toml`` and the folder it lives in (against which relative paths resolve).
    ``config_sha256``: the sha256 (hex) of the bytes that were parsed (the plan cache keys on it)."""

    path: Path
    config: ConfigFile
    config_sha256: str = ""

    @property
    def root(self) -> Path:
        return self.path.parent

    @cached_property
    def state_dir(self) -> Path:
        """Folder for the build log and digest cache (``.neuron-build`` beside the config)."""
        return self.root / self.config.build.state_dir

    def make_state_dir(self) -> Path:
        """Create :attr:`state_dir` (and the folders above it) when missing; returns it.

        Raises:
            ConfigError: it cannot be created (a read-only or virtual file system such as ``/proc``, no
                permission, a file in the way); the fault names ``build.state_dir`` and the fix.
        """
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(str(self.path), [
                f"build.state_dir: {self.config.build.state_dir!r} ({self.state_dir}): cannot create it "
                f"({e.strerror or type(e).__name__}); set it to a folder this user may write "
                f"(default \".neuron-build\")"]) from None
        return self.state_dir

    def store_url(self) -> str:
        """``[build] store``: a local path (or ``file://`` URL) resolved against the config's folder (the
        config check refuses any other URL; one would be returned as given)."""
        s = self.config.build.store
        if "://" in s and not s.startswith("file://"):
            return s
        return str((self.root / s.removeprefix("file://")).resolve())

    def remote_url(self) -> str | None:
        """``[build] remote``, the shared store the local one caches (a URL), or None."""
        return self.config.build.remote

    def factory_file(self, model: str) -> Path:
        """The source file of a model's factory module (``models.minilm`` -> ``<root>/models/minilm.py``).

        Raises:
            ValueError: the model is an hf model (it has no factory).
        """
        if self.config.models[model].factory is None:
            raise ValueError(f"model {model!r} is an hf model; it has no factory file")
        mod = self.config.models[model].module
        base = self.root.joinpath(*mod.split("."))
        pkg = base / "__init__.py"
        return pkg if pkg.exists() else base.with_suffix(".py")


# --------------------------------------------------------------------------------------------------
# error reporting

def toml_path(loc: tuple[Any, ...]) -> str:
    """Format a pydantic error location as a TOML path: ``("models", "m", "buckets", "seq", 2)`` ->
    ``models.m.buckets.seq[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            s = str(part)
            s = s if re.match(r"^[A-Za-z0-9_-]+$", s) else f'"{s}"'
            out += ("." if out else "") + s
    return out or "(top level)"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed in the table at ``loc`` (for "did you mean")."""
    tp: Any = ConfigFile
    parts = list(loc)
    while parts:
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            name = parts.pop(0)
            if name not in tp.model_fields:
                return []
            tp = tp.model_fields[name].annotation
        elif origin in (dict,):
            parts.pop(0)
            tp = typing.get_args(tp)[1]
        elif origin in (tuple, list):
            parts.pop(0)
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union:
            tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
        else:
            return []
    while typing.get_origin(tp) is typing.Union:
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _describe(err: dict[str, Any]) -> str:
    loc = tuple(p for p in err["loc"] if p != "[key]")
    typ, msg = err["type"], err["msg"]
    if typ == "extra_forbidden":
        key = str(loc[-1])
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"{toml_path(loc)}: unknown key '{key}'; {hint}allowed keys: {', '.join(allowed)}"
    if typ == "missing":
        return f"{toml_path(loc)}: required key is missing; add it"
    if typ == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        allowed = re.findall(r"'([^']*)'", expected)
        got = str(err.get("input"))
        close = difflib.get_close_matches(got, allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"{toml_path(loc)}: {got!r} is not allowed; allowed: {', '.join(allowed)}{hint}"
    if typ == "too_short":
        n = err.get("ctx", {}).get("min_length", 1)
        return f"{toml_path(loc)}: is empty; give at least {n} item{'s' if n != 1 else ''}"
    if typ in ("int_type", "int_parsing", "bool_type", "bool_parsing", "string_type", "float_type",
               "float_parsing", "list_type", "tuple_type", "dict_type", "model_type"):
        want = {"int": "a whole number", "bool": "true or false", "string": "a string", "float": "a number",
                "list": "a list", "tuple": "a list", "dict": "a table", "model": "a table"}[typ.split("_")[0]]
        return f"{toml_path(loc)}: {err.get('input')!r} is not allowed; it must be {want}"
    if typ in ("greater_than", "greater_than_equal"):
        return f"{toml_path(loc)}: {err.get('input')!r} is not allowed; it must be {msg.removeprefix('Input should be ')}"
    if typ == "value_error":
        return f"{toml_path(loc)}: {msg.removeprefix('Value error, ')}"
    return f"{toml_path(loc)}: {msg} (got {err.get('input')!r})"


def _validation_faults(exc: ValidationError) -> list[str]:
    errors = exc.errors(include_url=False)
    locs = [tuple(e["loc"]) for e in errors]
    faults: list[str] = []
    # an unknown key whose "did you mean" is a missing required key is one fault (a typo), not two
    typo_of = {}
    for e in errors:
        if e["type"] == "extra_forbidden":
            parent = tuple(e["loc"][:-1])
            close = difflib.get_close_matches(str(e["loc"][-1]), _fields_at(parent), n=1)
            if close:
                typo_of[parent + (close[0],)] = e["loc"][-1]
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in typo_of:
            continue
        # a list left short because one of its items failed is the same fault, reported once
        if e["type"] == "too_short" and any(len(o) > len(loc) and o[:len(loc)] == loc for o in locs):
            continue
        line = _describe(e)
        if line not in faults:
            faults.append(line)
    return faults


# --------------------------------------------------------------------------------------------------
# checks across tables and against the file system

def _cross_checks(cfg: ConfigFile, root: Path) -> list[str]:
    faults: list[str] = []
    profiles = list(cfg.profiles)
    if "://" in cfg.build.store and not cfg.build.store.startswith("file://"):
        faults.append(f"build.store: {cfg.build.store!r} is a URL; [build] store is the local folder (such as "
                      f"\"artifacts\"; a shared file system mount works) and a shared store goes in "
                      f"[build] remote = {cfg.build.store!r}")
    state = root / cfg.build.state_dir
    for p in (state, *state.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == state else f"is inside {p}, a file"
                faults.append(f"build.state_dir: {cfg.build.state_dir!r} ({state}) {where}, not a folder; set "
                              f"it to a folder (default \".neuron-build\")")
            break
    for name in [*cfg.profiles, *cfg.models]:
        kind = "model" if name in cfg.models else "profile"
        if long_name_fault(kind, name):
            faults.append(f"{kind}s.{name[:20]}...: {long_name_fault(kind, name)}")
        elif not _NAME.match(name):
            faults.append(f"{toml_path((name,))}: name {name!r} may hold only letters, digits, '_', '.', '-'")
    for mname, m in cfg.models.items():
        at = ("models", mname)
        for i, p in enumerate(m.profiles):
            if p not in cfg.profiles:
                close = difflib.get_close_matches(p, profiles, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                faults.append(f"{toml_path(at + ('profiles', i))}: unknown profile '{p}'; {hint}"
                              f"defined profiles: {', '.join(profiles)}")
        if m.is_textgen or m.max_seq_len is not None or m.decode_buckets:
            faults.extend(_check_textgen(cfg, m, at))
        # without inputs, max_seq_len says the table meant task = "text-generation" (the one fault above)
        meant_textgen = m.is_textgen or (not m.inputs and (m.max_seq_len is not None or bool(m.decode_buckets)))
        if not m.inputs and not meant_textgen:
            faults.append(f"{toml_path(at + ('inputs',))}: required key is missing; add it")
        used: list[str] = list(m.buckets) if meant_textgen else []
        for i, inp in enumerate(m.inputs):
            for d in inp.dims:
                if d not in m.buckets:
                    faults.append(f"{toml_path(at + ('inputs', i, 'shape'))}: dim '{d}' has no sizes; "
                                  f"add it to {toml_path(at + ('buckets',))} (e.g. {d} = [128])")
                used.append(d)
        names = [inp.name for inp in m.inputs]
        for n in sorted({n for n in names if names.count(n) > 1}):
            faults.append(f"{toml_path(at + ('inputs',))}: input name '{n}' is used twice")
        for d in m.buckets:
            if d not in used:
                faults.append(f"{toml_path(at + ('buckets', d))}: no input uses dim '{d}'; "
                              f"remove it or use it in an input's shape")
        for i, w in enumerate(m.weights):
            wp = root / w
            if wp.is_dir():
                if not any(f.is_file() for f in wp.rglob("*")):
                    faults.append(f"{toml_path(at + ('weights', i))}: folder '{w}' holds no files; "
                                  f"put the weight files in it or remove the entry")
            elif not wp.is_file():
                where = "" if Path(w).is_absolute() else f" (relative to {root})"
                faults.append(f"{toml_path(at + ('weights', i))}: '{w}' not found{where}; "
                              f"give an existing file or folder")
        for i, g in enumerate(m.sources):
            if Path(g).is_absolute() or ".." in Path(g).parts:
                faults.append(f"{toml_path(at + ('sources', i))}: '{g}' must be a glob relative to {root} "
                              f"(e.g. \"kernels/**/*.py\"), inside the project folder")
            elif not any(p.is_file() for p in root.glob(g)):
                faults.append(f"{toml_path(at + ('sources', i))}: '{g}' matches no file under {root}; "
                              f"fix the pattern or remove it")
        for i, pkg in enumerate(m.packages):
            try:
                import importlib.metadata as md
                md.distribution(pkg)
            except Exception:
                faults.append(f"{toml_path(at + ('packages', i))}: package '{pkg}' is not installed; "
                              f"install it (pip install {pkg}) or remove it")
        faults.extend(_check_reference(cfg, mname, m, at))
        faults.extend(_check_factory(m, root, at) if m.factory is not None else _check_hf(m, root, at))
    return faults


def _check_textgen(cfg: ConfigFile, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    """The keys of a text-generation model (or those given without ``task = "text-generation"``)."""
    w = lambda *k: toml_path(at + k)  # noqa: E731
    if not m.is_textgen:
        given = "max_seq_len" if m.max_seq_len is not None else "decode_buckets"
        return [f"{w(given)}: applies to task = \"text-generation\" only; remove it or add "
                f"task = \"text-generation\" to {toml_path(at)}"]
    faults = []
    if m.max_seq_len is None:
        faults.append(f"{w('max_seq_len')}: required for task = \"text-generation\" (the KV cache length in "
                      f"tokens: prompt plus new tokens); add it, e.g. max_seq_len = 2048")
    if m.inputs:
        faults.append(f"{w('inputs')}: a text-generation model's inputs follow from the task (token ids, cache "
                      f"positions, the KV cache); remove it")
    dims = list(m.buckets)
    if sorted(dims) != ["batch", "seq"]:
        faults.append(f"{w('buckets')}: a text-generation model's buckets are the prefill buckets "
                      f"{{ batch = [...], seq = [...] }}; got {{ {', '.join(dims) or 'nothing'} }}: "
                      f"give exactly batch and seq")
    elif m.max_seq_len is not None:
        for i, s in enumerate(m.buckets["seq"]):
            if s >= m.max_seq_len:
                faults.append(f"{w('buckets', 'seq', i)}: a prompt of {s} tokens leaves no room in the KV "
                              f"cache of max_seq_len = {m.max_seq_len} for a new token; lower it below "
                              f"{m.max_seq_len} or raise max_seq_len")
    for i, c in enumerate(m.decode_buckets):
        if m.max_seq_len is not None and c > m.max_seq_len:
            faults.append(f"{w('decode_buckets', i)}: {c} is longer than max_seq_len = {m.max_seq_len}; "
                          f"lower it or raise max_seq_len")
    if m.decode_buckets and cfg.build.backend != "neuron":
        faults.append(f"{w('decode_buckets')}: the {cfg.build.backend} backend decodes against the whole KV "
                      f"cache (max_seq_len); remove it (token-generation buckets over cache length are NxDI's, "
                      f"for backend = \"neuron\")")
    if cfg.build.backend not in TEXTGEN_BACKENDS:
        faults.append(f"{w('task')}: text-generation models build with backend inductor or compile-cache "
                      f"(transformers' static-cache export) or neuron (NxDI); [build] backend is "
                      f"\"{cfg.build.backend}\": set backend = \"inductor\" or \"neuron\"")
    if m.hf is not None and m.auto_class not in (None, CAUSAL_LM):
        faults.append(f"{w('auto_class')}: a text-generation model loads with {CAUSAL_LM}; remove "
                      f"auto_class or set it to \"{CAUSAL_LM}\"")
    if m.output is not None:
        faults.append(f"{w('output')}: a text-generation model's graphs return the logits; remove output")
    if m.reference is not None:
        faults.append(f"{w('reference')}: a text-generation model is validated against its own eager "
                      f"generate(); remove reference")
    if m.truncate:
        faults.append(f"{w('truncate')}: a prompt is never cut; remove truncate (a prompt longer than every "
                      f"seq bucket is refused with the fix)")
    return faults


def _check_reference(cfg: ConfigFile, mname: str, m: ModelSpec, at: tuple[Any, ...]) -> list[str]:
    """A declared ``reference`` names another model that takes the same inputs (name, symbolic shape,
    dtype, range, in order). Its buckets do not matter: the reference runs eagerly on this model's inputs."""
    if m.reference is None:
        return []
    where = toml_path(at + ("reference",))
    ref = cfg.models.get(m.reference)
    if ref is None:
        others = [n for n in cfg.models if n != mname]
        close = difflib.get_close_matches(m.reference, others, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return [f"{where}: unknown model '{m.reference}'; {hint}defined models: {', '.join(others) or 'none'}"]
    if m.reference == mname:
        return [f"{where}: a model is its own reference by default; remove the line or name another model"]

    def sig(spec: ModelSpec) -> list[str]:
        return [f"{i.name}{list(i.shape)}" + (f" {i.dtype}" if i.dtype else "")
                + (f" range {list(i.range)}" if i.range else "") for i in spec.inputs]

    if sig(m) != sig(ref):
        return [f"{where}: model '{m.reference}' takes other inputs ({'; '.join(sig(ref))}) than "
                f"'{mname}' ({'; '.join(sig(m))}); a reference must take the same input names, shapes, "
                f"dtypes and ranges"]
    return []


def _unknown_kwargs(m: ModelSpec, tree: ast.Module, at: tuple[Any, ...]) -> list[str]:
    """``kwargs`` the factory function does not take (read from its ``def``; with a ``**kwargs`` parameter, a
    class, an assigned or a decorated factory is not checked), each with the closest parameter name."""
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == m.function), None)
    if fn is None or fn.args.kwarg is not None or fn.decorator_list:  # a decorator may change the signature
        return []
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    out = []
    for k in m.kwargs:
        if k not in params:
            close = difflib.get_close_matches(k, params, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it takes: {', '.join(params) or 'no arguments'}"
            out.append(f"{toml_path(at + ('kwargs', k))}: {m.factory} takes no argument '{k}'; {hint}")
    return out


def _check_factory(m: ModelSpec, root: Path, at: tuple[Any, ...]) -> list[str]:
    """Statically check that a factory will import: the module file exists under ``root``, parses, defines
    the function, and every module it imports is findable. Nothing is imported or executed."""
    where = toml_path(at + ("factory",))
    base = root.joinpath(*m.module.split("."))
    path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
    if not path.is_file():
        return [f"{where}: module '{m.module}' not found: expected {path.relative_to(root)} "
                f"beside {DEFAULT_CONFIG} (factory paths are relative to its folder)"]
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        return [f"{where}: {path.relative_to(root)} does not import: syntax error at line {e.lineno}: {e.msg}"]
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    faults = []
    if m.function not in defined:
        faults.append(f"{where}: {path.relative_to(root)} defines no '{m.function}'; "
                      f"defined: {', '.join(sorted(defined)) or 'nothing'}")
    faults.extend(_unknown_kwargs(m, tree, at))
    faults.extend(_missing_imports(tree, path, root, where))
    # modules under the models folder that the factory imports must import too
    from neuron_build.project.sources import local_imports

    for dep in local_imports(path, root, module=m.module):
        if dep == path:
            continue
        try:
            dep_tree = ast.parse(dep.read_bytes(), filename=str(dep))
        except SyntaxError as e:
            faults.append(f"{where}: {dep.relative_to(root)} (imported by {path.relative_to(root)}) does not "
                          f"import: syntax error at line {e.lineno}: {e.msg}")
            continue
        faults.extend(_missing_imports(dep_tree, dep, root, where, via=path))
    return faults


def _check_hf(m: ModelSpec, root: Path, at: tuple[Any, ...]) -> list[str]:
    """Statically check an hf model: its folder (or package) resolves to a folder with config.json and
    weights, transformers is installed and defines the auto class. Nothing is imported."""
    from neuron_build import hf

    faults = []
    try:
        hf.resolve(m.hf or "", root)
    except hf.HFSourceError as e:
        faults.append(f"{toml_path(at + ('hf',))}: {e}")
    known = hf.auto_classes()
    if known is None:
        faults.append(f"{toml_path(at + ('hf',))}: transformers is not installed; install it (pip install "
                      f"transformers) to load hf models")
    else:
        name = m.auto_class or hf.DEFAULT_AUTO_CLASS
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            faults.append(f"{toml_path(at + ('auto_class',))}: transformers has no auto class '{name}'; {hint}"
                          f"e.g. AutoModel, AutoModelForSequenceClassification, AutoModelForCausalLM")
    return faults


def _missing_imports(tree: ast.AST, path: Path, root: Path, where: str, via: Path | None = None) -> list[str]:
    """Faults for absolute imports in ``tree`` that resolve neither under ``root`` nor to an installed
    module (found with ``importlib.util.find_spec``; nothing is imported)."""
    faults = []
    shown = f"{path.relative_to(root)}" + (f" (imported by {via.relative_to(root)})" if via else "")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            local = root.joinpath(*node.module.split("."))
            if local.is_dir():
                for a in node.names:
                    if a.name != "*" and not (local / f"{a.name}.py").exists() and not (local / a.name).is_dir():
                        init = local / "__init__.py"
                        if not init.exists() or a.name not in init.read_text(errors="replace"):
                            faults.append(f"{where}: {shown} does not import: '{node.module}.{a.name}' "
                                          f"(line {node.lineno}) not found under {local.relative_to(root)}/")
        for name in names:
            top = name.split(".")[0]
            if (root / top).exists() or (root / f"{top}.py").exists():
                continue
            if importlib.util.find_spec(top) is None:
                faults.append(f"{where}: {shown} does not import: module '{top}' "
                              f"(line {node.lineno}) is not installed")
    return faults


def find_config(start: str | Path | None = None) -> Path | None:
    """The ``buckets.toml`` a command uses when no ``-c`` is given: ``$NEURON_BUILD_CONFIG`` when set,
    else the first ``buckets.toml`` in ``start`` (default: the current folder) or one of its parents,
    the way git and DVC find their repository. None when there is none."""
    import os

    env = os.environ.get("NEURON_BUILD_CONFIG")
    if env:
        return Path(env)
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / DEFAULT_CONFIG).is_file():
            return d / DEFAULT_CONFIG
    return None


def load_project(path: str | Path | None = None) -> Project:
    """Load and check a ``buckets.toml``.

    Args:
        path: the config file; default :func:`find_config` (``$NEURON_BUILD_CONFIG``, else ``buckets.toml``
            in the current folder or the nearest parent that has one).

    Returns:
        The :class:`Project`.

    Raises:
        ConfigError: the file is missing, is not valid TOML, or breaks the schema; one line per fault,
            each naming the TOML path, what is wrong and what is allowed.
    """
    p = Path(path) if path is not None else (find_config() or Path(DEFAULT_CONFIG))
    shown = str(p)
    if p.is_dir():
        raise ConfigError(shown, [f"is a folder; pass the config file itself (e.g. -c {p / DEFAULT_CONFIG})"])
    if not p.is_file():
        where = (f"looked in {p.resolve().parent} and its parents" if path is None
                 else f"looked in {p.resolve().parent}")
        raise ConfigError(shown, [f"file not found; create it, pass -c PATH or set NEURON_BUILD_CONFIG ({where})"])
    raw = p.read_bytes()
    data = parse_config(shown, raw)
    if not data:
        raise ConfigError(shown, ["the file is empty; it needs at least one [profiles.NAME] and one "
                                  "[models.NAME] table (see buckets.toml in the neuron-build repository)"])
    try:
        cfg = ConfigFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(shown, _validation_faults(e)) from None
    root = p.resolve().parent
    faults = _cross_checks(cfg, root)
    if faults:
        raise ConfigError(shown, faults)
    return Project(path=p.resolve(), config=cfg, config_sha256=sha256_hex(raw))
