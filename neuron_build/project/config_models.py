"""``buckets.toml``'s per-model tables: ``[models.NAME]`` (:class:`ModelSpec`) and its ``inputs``
(:class:`InputSpec`), with their validators, plus the frozen base model and the dtype words the other tables
share. Split out of :mod:`neuron_build.project.config`, which re-exports every public name here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from neuron_build.project.config_terms import CAUSAL_LM, TEXT_GENERATION

__all__ = ["DIM_NAME", "INTEGER_DTYPES", "Frozen", "InputSpec", "ModelSpec", "no_duplicates"]

Dtype = Literal["fp32", "bf16", "fp16"]
InputDtype = Literal["int64", "int32", "int16", "int8", "uint8", "bool", "fp32", "bf16", "fp16"]
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
#: ``task`` of a model table: ``forward`` (the default: one graph, the model's forward) or
#: ``text-generation`` (a decoder LM: prefill and decode graphs over one static KV cache).
Task = Literal["forward", "text-generation"]

#: A dynamic dimension's name (an identifier): ``seq``, ``batch_size``.
DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def no_duplicates(v: tuple[str, ...]) -> tuple[str, ...]:
    """``v`` unchanged; a value listed twice is a ValueError naming it (pydantic reports it at its TOML path)."""
    dup = sorted({x for x in v if v.count(x) > 1})
    if dup:
        raise ValueError(f"lists {', '.join(dup)} more than once")
    return v


class Frozen(BaseModel):
    """The base of every table of ``buckets.toml``: immutable, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(Frozen):
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
            if isinstance(d, str) and not DIM_NAME.match(d):
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


class ModelSpec(Frozen):
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

    What the factory reads that no recorder sees (:mod:`neuron_build.project.declared`): ``inputs_from``
    are globs (``~`` expanded, absolute or relative to the config's folder) of files whose content is part
    of the key; ``env`` names environment variables whose values are part of the key; ``always_rebuild``
    never serves the model's targets from the cache.
    """

    factory: StrictStr | None = None
    hf: StrictStr | None = None
    auto_class: StrictStr | None = None
    output: StrictStr | int | None = None
    kwargs: dict[str, Any] = {}
    dtypes: tuple[Dtype, ...] = Field(min_length=1)
    profiles: tuple[StrictStr, ...] = Field(min_length=1)
    inputs: tuple[InputSpec, ...] = ()
    buckets: dict[str, tuple[Annotated[int, Field(gt=0, strict=True)], ...]] = {}
    weights: tuple[StrictStr, ...] = ()
    sources: tuple[StrictStr, ...] = ()
    packages: tuple[StrictStr, ...] = ()
    tolerance: dict[Dtype, Annotated[float, Field(strict=True)]] = {}
    truncate: StrictBool = False
    convert_dtypes: StrictBool = False
    reference: StrictStr | None = None
    task: Task | None = None
    max_seq_len: PositiveInt | None = Field(default=None, strict=True)
    decode_buckets: tuple[Annotated[int, Field(gt=0, strict=True)], ...] = ()
    inputs_from: tuple[StrictStr, ...] = ()
    env: tuple[StrictStr, ...] = ()
    always_rebuild: StrictBool = False

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

    @field_validator("weights", mode="before")
    @classmethod
    def _weights_files(cls, v: Any, info: ValidationInfo) -> Any:
        """``weights = "external"`` (or ``"inline"``) is a profile's option, written in the wrong table."""
        if v in ("inline", "external"):
            profiles = info.data.get("profiles") or ("NAME",)
            where = " and ".join(f"[profiles.{p}]" for p in profiles)
            raise ValueError(f"weights = \"{v}\" is a profile's option: put it under {where} (the profile"
                             f"{'s' if len(profiles) > 1 else ''} this model builds with); in a [models.NAME] table, "
                             f"weights lists extra weight files whose content is part of the key")
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
            if not DIM_NAME.match(dim):
                raise ValueError(f"dim name {dim!r} is not an identifier such as 'seq'")
            if not sizes:
                raise ValueError(f"dim {dim!r} has no sizes; give at least one")
            if len(set(sizes)) != len(sizes):
                raise ValueError(f"dim {dim!r} lists a size twice: {list(sizes)}")
        return v

    @field_validator("dtypes", "profiles")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return no_duplicates(v)

    @field_validator("inputs_from")
    @classmethod
    def _inputs_from(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not x.strip() for x in v):
            raise ValueError("holds an empty string; give a path or glob such as \"data/*.json\"")
        return no_duplicates(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [x for x in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an environment variable name (e.g. \"MY_VAR\")")
        return no_duplicates(v)

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
