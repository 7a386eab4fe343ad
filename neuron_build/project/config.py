"""``buckets.toml``: the build matrix, parsed into frozen, strict pydantic models.

Every fault is reported once, with the file, the TOML path (``models.minilm.buckets.seq[2]``), what is
wrong and what is allowed; unknown keys get a "did you mean" hint (the renderer:
:mod:`neuron_build.project.config_errors`). Checks across tables and against the file system (the factory
module exists and defines the function, declared weight files exist) run after the schema, statically, one
function per check (:mod:`neuron_build.project.config_checks`): loading a config never imports torch or the
model's code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PositiveInt,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from neuron_build.backends import BACKEND_CHOICES, DEVICE_KINDS, DEVICES, NEURON_TARGETS
from neuron_build.errors import STORE_SCHEMES, ConfigError
from neuron_build.project.compiler_args import normalize_compiler_args
from neuron_build.project.config_checks import cross_checks
from neuron_build.project.config_dask import DaskSettings
from neuron_build.project.config_errors import validation_faults
from neuron_build.project.config_file import DEFAULT_STATE_DIR, parse_config
from neuron_build.project.config_models import INTEGER_DTYPES, Frozen, ModelSpec, no_duplicates
from neuron_build.project.config_terms import (  # noqa: F401 (re-exported: public names of this module)
    DEFAULT_CONFIG,
    MAX_NAME_CHARS,
    NAME_RULE,
    TEXTGEN_BACKENDS,
    long_name_fault,
)
from neuron_build.project.config_terms import NAME as _NAME
from neuron_build.util import sha256_hex

__all__ = ["INTEGER_DTYPES", "BuildSettings", "check_store_url", "Profile", "ModelSpec",
           "ReleaseSettings", "MonitoringSettings", "ConfigFile", "Project", "find_config", "load_project"]

#: ``auto`` and every backend of :data:`neuron_build.backends.BACKENDS`, in its order (error messages list them).
Backend = Literal[BACKEND_CHOICES]  # type: ignore[valid-type]
NeuronTarget = Literal[NEURON_TARGETS]  # type: ignore[valid-type]
Device = Literal[DEVICES]  # type: ignore[valid-type]
Executor = Literal["local", "dask"]
#: Where an artifact is validated, benchmarked and served (see :mod:`neuron_build.release.gates`).
DeviceKind = Literal[DEVICE_KINDS]  # type: ignore[valid-type]


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):  # TOML true/false would pass as 1.0/0.0 where ints are allowed for floats
        raise ValueError("must be a number, not true/false")
    if isinstance(v, str):  # "900" would pass as 900.0 in pydantic's lax mode
        raise ValueError(f"{v!r} is a string; write the number without quotes")
    if isinstance(v, float) and v in (float("inf"), float("-inf")):  # TOML inf: an endless timeout, no bound
        raise ValueError(f"{v} is not a finite number; give one such as 600")
    return v


#: A float setting that also takes an integer (``timeout_s = 600``), never a boolean or a string.
Number = Annotated[float, BeforeValidator(_not_bool)]


class BuildSettings(Frozen):
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
    Seven of them are neuron-build's (:mod:`neuron_build.remote_options`, checked with every other key when
    the file loads, all faults at once): ``connect_timeout_s`` (5), ``read_timeout_s`` (30) and ``attempts``
    (4) bound every call to S3 (``neuron_build.store.wire``); ``multipart_threshold``, ``multipart_chunksize``,
    ``max_concurrency`` and ``multipart_copy_threshold`` shape large transfers, within S3's limits.
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


class Profile(Frozen):
    """``[profiles.NAME]``: compiler args and options.

    ``compiler_args`` are stored normalised (see :func:`neuron_build.project.compiler_args.normalize_compiler_args`).
    ``tp_degree`` is the tensor-parallel degree (NeuronCores per model replica).
    ``weights``: ``"inline"`` (the default: weights compiled into the artifact) or ``"external"`` (the
    compiled part is weight-free and the weights travel beside it, so a change of weight values alone is
    relinked, not compiled: :mod:`neuron_build.compilers.weights`). ``inline_weights_to_neff`` is the Neuron
    spelling of the same choice: either may be given, both are set from it, and a pair that disagrees is
    one config error naming the profile.
    A flag that is not documented for neuronx-cc (:data:`~neuron_build.project.compiler_args.DOCUMENTED`) is
    refused unless ``unchecked_args`` names it (the escape hatch for a flag a newer compiler takes).
    """

    compiler_args: tuple[str, ...] = ()
    weights: Literal["inline", "external"] = "inline"
    inline_weights_to_neff: StrictBool = True
    tp_degree: PositiveInt = Field(default=1, strict=True)
    unchecked_args: tuple[StrictStr, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _one_weights_answer(cls, v: Any) -> Any:
        if not isinstance(v, dict) or v.get("weights") not in ("inline", "external"):
            return v
        inline = v["weights"] == "inline"
        given = v.get("inline_weights_to_neff")
        if isinstance(given, bool) and given != inline:
            raise ValueError(f"weights = \"{v['weights']}\" but inline_weights_to_neff = {str(given).lower()} "
                             "(its Neuron spelling); keep one of the two")
        return {**v, "inline_weights_to_neff": inline}

    @model_validator(mode="after")
    def _weights_from_neuron_spelling(self) -> Profile:
        if "weights" not in self.model_fields_set and not self.inline_weights_to_neff:
            object.__setattr__(self, "weights", "external")
        return self

    @field_validator("compiler_args", mode="before")
    @classmethod
    def _normalise(cls, v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            raise ValueError("must be a list of strings such as [\"--optlevel=2\"], not a string")
        if not isinstance(v, (list, tuple)):
            raise ValueError("must be a list of strings such as [\"--optlevel=2\"]")
        return normalize_compiler_args(v)


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


class ReleaseSettings(Frozen):
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
                raise ValueError(f"channel name {c!r} {NAME_RULE}")
        return no_duplicates(v)

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


class MonitoringSettings(Frozen):
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


class ConfigFile(Frozen):
    """The whole ``buckets.toml``."""

    build: BuildSettings = BuildSettings()
    dask: DaskSettings = DaskSettings()
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
        ConfigError: the file is missing or unreadable, is not valid TOML, or breaks the schema; one line per fault,
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
    try:
        raw = p.read_bytes()
    except OSError as e:  # unreadable (permissions, an I/O error): one line naming the file, not a traceback
        raise ConfigError(shown, [f"cannot read it ({e.strerror or e}); make it readable by this user "
                                  f"(chmod u+r {p}) or pass -c PATH of a readable buckets.toml"]) from None
    data = parse_config(shown, raw)
    if not data:
        raise ConfigError(shown, ["the file is empty; it needs at least one [profiles.NAME] and one "
                                  "[models.NAME] table (see buckets.toml in the neuron-build repository)"])
    try:
        cfg = ConfigFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(shown, validation_faults(e, ConfigFile)) from None
    faults = cross_checks(cfg, p.resolve().parent)
    if faults:
        raise ConfigError(shown, faults)
    return Project(path=p.resolve(), config=cfg, config_sha256=sha256_hex(raw))
