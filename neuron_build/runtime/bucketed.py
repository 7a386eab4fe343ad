"""Serving a pulled release: route each call to the smallest static-shape bucket that fits.

``BucketedModel.load(DIR)`` reads ``DIR/release.json`` (written by ``neuron-build pull``) and loads every
bucket's artifact with its loader (:func:`neuron_build.artifact.load_artifact`): ``torch.jit.load`` for
``.pt`` (TorchScript, and Neuron artifacts, which are TorchScript modules holding the NEFF and are placed on
a NeuronCore when loaded [doc: toolchain notes]), ``torch._inductor.aoti_load_package`` for ``.pt2``
(AOTInductor).

Routing rules, per call:

1. **Sizes.** Each input's shape is matched against its symbolic shape (``["batch", "seq"]``): the rank
   and every fixed dim must match, and a bucket dim used by several inputs must have one size in all of
   them. That gives the request's size per bucket dim (``batch=3, seq=40``).
2. **Bucket.** Buckets are ordered by total size (the product of their dim sizes; ties by the sizes in
   dim order), and the first whose every dim is at least the request's is chosen: the smallest bucket
   that fits. ``choose(shapes)`` returns its id without running anything.
3. **Too large.** A batch larger than the largest batch bucket is split into chunks of the largest
   batch size that fits, each chunk routed and run on its own, and the outputs put back together along
   the batch dim: 9 inputs with batch buckets up to 8 give 9 outputs (a chunk of 8 and one of 1). The
   batch dim is the bucket dim named ``batch`` when it leads every input's shape (:attr:`BucketedModel.batch_dim`).
   A request larger than every bucket along a sequence dim (any other bucket dim) is an error naming the
   buckets and the fixes, unless the model's config says ``truncate = true``: then each such dim is cut to
   the largest size any bucket has (the leading part is kept), and the outputs have the cut size. The
   batch dim is never truncated.
4. **Dtypes.** An input whose dtype differs from the artifact's is an error naming the input, its dtype
   and the expected one, unless the config says ``convert_dtypes = true`` (then it is converted).
5. **Padding.** Each input is padded at the end of every bucket dim up to the bucket's size with its
   ``pad`` value (config; default 0, which for BERT-style models is the pad token id and, for an
   attention mask, "masked out").
6. **Outputs.** Each output tensor is sliced back to the request's sizes along the dims that match a
   padded input: the input whose padded shape shares the longest leading prefix with the output's shape
   (at least one dim, including a bucket dim) decides, and positions of that prefix that are bucket dims
   are sliced (``[8, 64, 384]`` from inputs ``[8, 64]`` -> ``[3, 40, 384]``; a pooled ``[8, 384]`` ->
   ``[3, 384]``). Outputs that share no such prefix with any input are returned as they are.
7. **Chunks.** With a split batch, each output that leads with the chunk's batch size is concatenated
   along dim 0 across chunks; any other output is the first chunk's.
8. **Traffic.** Every call is counted per request shape (as asked) and bucket, with the padding it cost
   (:mod:`neuron_build.traffic`; bounded memory): :meth:`BucketedModel.traffic`,
   :meth:`BucketedModel.save_traffic`, and Prometheus metrics when loaded with ``metrics=REGISTRY``.

Serving safety (what a server behind an endpoint needs):

- **Inputs checked before any kernel runs** (:meth:`BucketedModel.check_inputs`): each input must be a tensor of
  the declared dtype (or convertible, with ``convert_dtypes``; a float converted to an integer dtype must hold
  whole numbers), the shapes must match (rule 1), an integer input with a recorded ``range`` ``[low, high)``
  may hold only values in it or its ``pad`` value (what the runtime itself pads with), and a float input may
  not hold NaN. A violation is one :class:`BucketError` naming the input, the value, where it is and what is
  allowed; the process goes on. (A compiled kernel's own index check is no substitute: AOTInductor's aborts
  the process with SIGABRT [measured].) Releases recorded before ranges were part of the release carry none:
  release them again to have integer inputs checked.
- **Thread-safe**: calls of one ``BucketedModel`` from several threads each get their own answer. Plain
  calls keep no state between calls (AOTInductor runners and TorchScript modules serve concurrent calls);
  text generation holds one lock per batch size's KV state for a whole ``generate``
  (:mod:`neuron_build.compilers.textgen_serve`); the traffic counts take their own lock.
- **Verified loads**: :meth:`BucketedModel.load` checks every file ``release.json`` lists, its size always
  and its sha256 unless ``verify="size"`` (for hosts that verified the files at pull and load often).

The serving options (``pad``, ``truncate``, ``convert_dtypes``, the inputs and buckets) are read from the
pulled ``release.json``, which ``neuron-build release`` recorded from ``buckets.toml``: changing them in
``buckets.toml`` takes effect on a serving host after ``release``, ``promote`` and ``pull`` again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.artifact import load_artifact, release_version_problem
from neuron_build.cpu_isa import isa_problem, package_cpu_isa
from neuron_build.errors import FactoryNotImportable, UserError
from neuron_build.examples import torch_dtype
from neuron_build.traffic import DEFAULT_MAX_SHAPES, TrafficRecorder
from neuron_build.util import file_sha256

#: What :meth:`BucketedModel.load` checks of each listed file: ``sha256`` (content and size, the default) or
#: ``size`` (sizes only: for hosts that verified the files at pull, ``neuron-build pull`` checks sha256).
VERIFY_MODES = ("sha256", "size")


class BucketError(UserError):
    """An input the release cannot serve: wrong count, rank, fixed dim or dtype, or larger than every
    bucket. The message names the input and what the release expects."""


@dataclass(frozen=True)
class Bucket:
    """One bucket of a pulled release.

    ``sizes``: bucket dim -> size; ``inputs``: concrete input specs (``name``, ``shape`` ints, ``dtype``
    name); ``artifact``: the model file; ``loader``: the function that loads it.
    """

    id: str
    sizes: dict[str, int]
    inputs: tuple[dict[str, Any], ...]
    artifact: Path
    loader: str

    @property
    def total(self) -> int:
        """Product of the bucket's dim sizes (the routing order)."""
        return math.prod(self.sizes.values())

    def describe(self) -> str:
        return f"{self.id} (" + ", ".join(f"{d}={n}" for d, n in self.sizes.items()) + ")"


class BucketedModel:
    """A pulled release, callable like the model: routes, pads, runs and slices (see the module
    docstring for the rules).

    Attributes:
        release: the ``release.json`` content.
        buckets: in routing order (smallest total size first).
        dims: the bucket dim names.
    """

    def __init__(self, release: dict[str, Any], root: Path, modules: dict[str, Any] | None = None, *,
                 metrics: Any = None, max_shapes: int = DEFAULT_MAX_SHAPES):
        self.release = release
        self.root = Path(root)
        self.dims: list[str] = list(release["dims"])
        self.specs: list[dict[str, Any]] = list(release["inputs"])
        self.truncate: bool = bool(release.get("truncate", False))
        self.convert_dtypes: bool = bool(release.get("convert_dtypes", False))
        bs = [Bucket(b["id"], {d: int(b["sizes"][d]) for d in self.dims if d in b["sizes"]}, tuple(b["inputs"]),
                     self.root / b["artifact"], b["loader"]) for b in release["buckets"]]
        self.buckets: list[Bucket] = sorted(bs, key=lambda b: (b.total, tuple(b.sizes.get(d, 0) for d in self.dims)))
        self._modules: dict[str, Any] = dict(modules or {})
        lead = {spec["shape"][0] if spec["shape"] else None for spec in self.specs}
        #: The bucket dim split into chunks when a batch is larger than every bucket: ``batch`` when it is
        #: a bucket dim leading every input (else None: no chunking).
        self.batch_dim: str | None = "batch" if "batch" in self.dims and lead == {"batch"} else None
        self.device = "cpu"
        self.installed: dict[str, int] = {}
        self.serving_env: dict[str, str] = {}
        self.neff_cache_dir: Path | None = None
        #: A text-generation release's engine (:mod:`neuron_build.compilers.textgen_serve`), else None.
        self.textgen: Any = None
        #: The traffic this model served (:mod:`neuron_build.traffic`); ``metrics``: a prometheus_client
        #: registry to export it on (None: no metrics); ``max_shapes``: distinct shapes kept.
        self.traffic_recorder = TrafficRecorder(release["model"], release.get("release"), self.dims,
                                                max_shapes=max_shapes, metrics=metrics)

    @classmethod
    def load(cls, folder: str | Path, model: Any = None, *, factory_root: str | Path | None = None,  # noqa: PLR0913
             neff_cache_dir: str | Path | None = None, metrics: Any = None,
             max_shapes: int = DEFAULT_MAX_SHAPES, verify: str = "sha256") -> BucketedModel:
        """Load a folder written by ``neuron-build pull``: ``release.json`` and every bucket's artifact.

        For a compile-cache or torchneuron release the artifacts are caches, so the model is needed too:
        ``model`` (an ``nn.Module``, or a callable returning one from the recorded factory kwargs), else the
        factory the release records (``serving.factory``, ``module.path:function``) imported with
        ``factory_root`` (default: the current folder) first on ``sys.path``, or the Hugging Face model it
        records (``serving.hf``: a package, or a folder relative to ``factory_root``) loaded offline. The recorded ``serving.env``
        is set in ``os.environ`` (those compiler settings are part of TorchNeuron's cache key), each bucket's
        ``compile_cache.bin`` is installed with ``torch.compiler.load_cache_artifacts`` and, for torchneuron,
        the buckets' NEFF files are gathered into ``neff_cache_dir`` (default: a new temporary folder)
        which ``TORCH_NEURONX_NEFF_CACHE_DIR`` then names; the model, cast to the recorded dtype, is
        compiled with the recorded ``torch.compile`` settings. Nothing compiles until the first call. An
        NxDI release (backend neuron, text generation) is loaded by NxDI itself: per bucket folder
        ``Cls(path)`` and ``.load(path)``, ``generate`` through its ``HuggingFaceGenerationAdapter``
        (:func:`neuron_build.compilers.neuron.nxdi_serve.nxdi_engine`); on a host without a NeuronCore that is
        one line naming the host it needs.
        ``metrics`` and ``max_shapes``: the traffic counts' Prometheus registry and cap (see :meth:`traffic`).
        ``verify``: what is checked of every file ``release.json`` lists before anything is loaded (see
        :func:`verify_pulled`): ``"sha256"`` (default: size and content; reads every byte once) or ``"size"``
        (for hosts that verified at pull and load often).

        Raises:
            UserError: no ``release.json``; this host's installed versions cannot load the artifacts (one
                line naming the built and the installed version; the rule per artifact kind is
                :data:`neuron_build.artifact.LOAD_RULES`); a listed file is missing, has another size or
                (``verify="sha256"``) another sha256 than listed; or ``verify`` is not a mode.
            ImportError: the recorded factory does not import from ``factory_root``.
        """
        if verify not in VERIFY_MODES:
            raise UserError(f"BucketedModel.load: verify={verify!r}; give 'sha256' (the default) or 'size'")
        user_model = model
        root = Path(folder)
        try:
            release = json.loads((root / "release.json").read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{root / 'release.json'}: cannot read it ({e}); pull a release into {root} with "
                            f"`neuron-build pull MODEL --channel C --dest {root}`") from None
        check_pulled(release, root)
        from neuron_build.compilers.neuron import nxdi_serve

        nxdi = nxdi_serve.is_nxdi_release(release)  # NxDI's own model class and generation adapter serve it
        if nxdi and (problem := nxdi_serve.host_problem(release, str(root / "release.json"),
                                                        nxdi_serve.pulled_tp_degree(release, root))):
            raise UserError(problem)
        problem = release_version_problem(
            release.get("backend", ""), release.get("toolchain") or {},
            [(b.get("loader", ""), b.get("artifact", "")) for b in release["buckets"]],
            f"{root / 'release.json'} (release {release.get('release')} of {release.get('model')})")
        if problem:
            raise UserError(problem)
        verify_pulled(release, root, verify)
        model = cls(release, root, metrics=metrics, max_shapes=max_shapes)
        if nxdi:
            model.device, model.textgen = "neuron", nxdi_serve.nxdi_engine(release, root)
            return model
        if release.get("textgen") is not None:  # prefill + decode graphs: served by generate()
            from neuron_build.compilers.textgen_serve import release_engine

            if release.get("serving") is not None:
                model.device = serving_device(release["serving"])
            model.textgen, model.installed = release_engine(
                release, root, lambda: serving_model(release["serving"], user_model, factory_root))
            return model
        if release.get("serving") is not None:
            model._load_cached(user_model, factory_root, neff_cache_dir)
            return model
        for b in model.buckets:
            isa = package_cpu_isa(b.artifact) if str(b.artifact).endswith(".pt2") else None
            problem = isa_problem(isa, f"{b.artifact} (bucket {b.id} of release {release.get('release')})") if isa else None
            if problem:
                raise UserError(problem)
            model._modules[b.id] = load_artifact(b.artifact, b.loader, release.get("backend", ""))
        return model

    def _load_cached(self, user_model: Any, factory_root: str | Path | None, neff_cache_dir: str | Path | None) -> None:
        """A compile-cache or torchneuron release: install every bucket's caches, build the user's model and
        compile it once with the recorded settings (every bucket then runs the same compiled module)."""
        from neuron_build.compilers.compile_cache import compile_from_caches

        serving = self.release["serving"]
        self.device = serving_device(serving)
        module = serving_model(serving, user_model, factory_root).to(self.device)
        self.user_module = module
        compiled, self.installed, self.neff_cache_dir, self.serving_env = compile_from_caches(
            [self.root / b.id for b in self.buckets], serving, self.release.get("backend", ""), module,
            neff_cache_dir)
        for b in self.buckets:
            self._modules[b.id] = compiled

    # -- routing --------------------------------------------------------------------------------
    def _sizes(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        if len(shapes) != len(self.specs):
            raise BucketError(f"{self.release['model']} takes {len(self.specs)} input(s) "
                              f"({', '.join(s['name'] for s in self.specs)}), got {len(shapes)}")
        sizes: dict[str, tuple[int, str]] = {}
        for spec, shape in zip(self.specs, shapes, strict=True):
            shape = tuple(int(n) for n in shape)
            sym = spec["shape"]
            if len(shape) != len(sym):
                raise BucketError(f"input '{spec['name']}' has shape {list(shape)}; expected {len(sym)} dims "
                                  f"{sym}")
            for i, (d, n) in enumerate(zip(sym, shape, strict=True)):
                if isinstance(d, str):
                    if n < 1:
                        raise BucketError(f"input '{spec['name']}' dim {i} ({d}) is {n}; sizes must be positive")
                    if d in sizes and sizes[d][0] != n:
                        raise BucketError(f"dim '{d}' is {sizes[d][0]} in input '{sizes[d][1]}' but {n} in "
                                          f"input '{spec['name']}'; inputs must agree")
                    sizes.setdefault(d, (n, spec["name"]))
                elif n != d:
                    raise BucketError(f"input '{spec['name']}' dim {i} is {n}; the release is compiled for "
                                      f"{d} (shape {sym})")
        return {d: n for d, (n, _) in sizes.items()}

    def route(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> tuple[Bucket, dict[str, int]]:
        """The bucket for inputs of these shapes, and the sizes the outputs are sliced to (the request's,
        after truncation of sequence dims). A batch larger than every bucket is routed as its first chunk
        (:meth:`chunks`).

        Args:
            shapes: one shape per input, in input order, or a mapping input name -> shape.

        Raises:
            BucketError: a shape does not match the inputs, or is larger than every bucket along a
                sequence dim and truncation is off.
        """
        if isinstance(shapes, Mapping):
            missing = [s["name"] for s in self.specs if s["name"] not in shapes]
            if missing:
                raise BucketError(f"no shape given for input(s) {', '.join(missing)}")
            shapes = [shapes[s["name"]] for s in self.specs]
        want = self._sizes(list(shapes))
        return self._route_sizes({**want, **({self.batch_dim: self.chunks(want)[0]} if self.batch_dim else {})},
                                 want)

    def chunks(self, want: dict[str, int]) -> list[int]:
        """The batch sizes of the chunks a request of sizes ``want`` is run in: one chunk when a bucket
        takes the whole batch, else chunks of the largest batch size among the buckets that fit the
        other dims (the last chunk holds the rest)."""
        bd = self.batch_dim
        if bd is None:
            return []
        n = want[bd]
        fits = [b.sizes[bd] for b in self.buckets if all(b.sizes[d] >= self._cut(d, m) for d, m in want.items() if d != bd)]
        top = max(fits) if fits else max(b.sizes[bd] for b in self.buckets)
        if n <= top:
            return [n]
        return [top] * (n // top) + ([n % top] if n % top else [])

    def _cut(self, d: str, n: int) -> int:
        if self.truncate and d != self.batch_dim:
            return min(n, max(b.sizes[d] for b in self.buckets))
        return n

    def _route_sizes(self, want: dict[str, int], request: dict[str, int]) -> tuple[Bucket, dict[str, int]]:
        cut = {d: self._cut(d, n) for d, n in want.items()}
        for b in self.buckets:
            if all(b.sizes[d] >= n for d, n in cut.items()):
                return b, cut
        model = self.release["model"]
        req = ", ".join(f"{d}={n}" for d, n in request.items())
        over = [d for d, n in cut.items() if n > max(b.sizes[d] for b in self.buckets)]
        fix = "; ".join(f"add a bucket with {d} >= {cut[d]} to [models.{model}] buckets in buckets.toml"
                        for d in over) or f"add a bucket that fits {req} to [models.{model}] buckets"
        trunc = [d for d in over if d != self.batch_dim]
        hint = (f"; or set truncate = true under [models.{model}] to cut {', '.join(trunc)} to the largest bucket "
                f"(drops the rest)" if trunc and not self.truncate else "")
        raise BucketError(f"inputs of {req} are larger than every bucket of {model} ({self.release['release']}): "
                          f"{', '.join(b.describe() for b in self.buckets)}. Fix: {fix}, then build, release, "
                          f"promote and pull again{hint} (serving options are read from the pulled release.json)")

    def choose(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> str:
        """The id of the bucket inputs of these shapes are routed to (e.g. ``b8-s64``)."""
        return self.route(shapes)[0].id

    # -- running --------------------------------------------------------------------------------
    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None):
        """Greedy generation from a text-generation release: prefill in the smallest bucket that holds the
        prompt, then decode steps against the KV cache the graphs share; equal token for token to
        transformers' ``generate(do_sample=False)`` of the eager model (rules:
        :mod:`neuron_build.compilers.textgen_serve`).

        Args:
            input_ids: integer ``[batch, prompt_len]``, ids in the vocabulary; attention_mask: optional 0/1 of
                the same shape (left or right padding); max_new_tokens: new tokens per row (a whole number
                >= 1); eos_token_id: stop a row there, or at any of a list (None: exactly ``max_new_tokens``);
                pad_token_id: what finished rows get (None: the model's, else the first eos id).

        Returns:
            int64 ``[batch, prompt_len + new]``: the prompt followed by the new tokens.

        Raises:
            BucketError: not a text-generation release.
            GenerateError: a malformed request or an id outside the vocabulary (checked before anything
                runs), a prompt longer than every prefill bucket, or more tokens than the cache holds.
        """
        if self.textgen is None:
            raise BucketError(f"{self.release['model']} is not a text-generation release; call the model "
                              f"instead of generate()")
        extra = {"pad_token_id": pad_token_id} if pad_token_id is not None else {}  # NxDI's engine takes none
        out = self.textgen.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                    eos_token_id=eos_token_id, **extra)
        self._record_prompts(input_ids, attention_mask)
        return out

    def _record_prompts(self, input_ids, attention_mask) -> None:
        """Count each prompt of a served ``generate`` call in the traffic: its length against the prefill
        bucket that took it (the smallest seq bucket that holds it, as the engine routes)."""
        import torch

        lengths = ([int(n) for n in torch.as_tensor(attention_mask).sum(dim=1).tolist()]
                   if attention_mask is not None else [int(input_ids.shape[1])] * int(input_ids.shape[0]))
        graphs = self.release["textgen"]["graphs"]
        prefill = sorted((b for b in self.buckets if graphs.get(b.id) == "prefill" and "seq" in b.sizes),
                         key=lambda b: (b.sizes["seq"], b.sizes.get("batch", 1)))
        for n in lengths:
            fit = [b for b in prefill if b.sizes["seq"] >= n]
            sizes = {"batch": 1, "seq": n} if "batch" in self.dims else {"seq": n}
            self.record_traffic(sizes, [(fit[0], sizes)] if fit else [])

    def __call__(self, *inputs):
        """Run the model on ``inputs`` (tensors, in input order): route, pad, run, slice back; a batch
        larger than every bucket runs in chunks whose outputs are concatenated along the batch dim.

        Returns:
            The artifact's outputs (a tensor, or a tuple/list of them) sliced to the request's sizes.

        Raises:
            BucketError: see :meth:`route`; or an input's dtype differs from the artifact's and
                ``convert_dtypes`` is off.
        """
        if self.textgen is not None:
            raise BucketError(f"{self.release['model']} is a text-generation release: call "
                              f"generate(input_ids, max_new_tokens=N)")
        inputs = self.check_inputs(inputs)
        want = self._sizes([tuple(t.shape) for t in inputs])
        sizes = self.chunks(want) if self.batch_dim else []
        if len(sizes) <= 1:
            bucket, cut = self._routed(want, want)
            out = self._run(bucket, cut, inputs)
            self.record_traffic(want, [(bucket, cut)])
            return out
        outs, start, runs = [], 0, []
        for n in sizes:
            part = tuple(t[start:start + n] for t in inputs)
            bucket, cut = self._routed({**want, self.batch_dim: n}, want)
            outs.append((n, self._run(bucket, cut, part)))
            runs.append((bucket, cut))
            start += n
        self.record_traffic(want, runs)
        return self._join(outs)

    def check_inputs(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """Check a call's inputs before anything runs (module docstring, "Serving safety"): count, type,
        dtype (converted when ``convert_dtypes`` is on), integer values against the recorded ``range`` and the
        input's ``pad`` value, no NaN in float inputs. Shapes are checked by routing (:meth:`route`).

        Returns:
            The inputs, each of the release's dtype.

        Raises:
            BucketError: one line naming the input, the value and where it is, and what is allowed.
        """
        import torch

        if len(inputs) != len(self.specs):
            self._sizes([getattr(t, "shape", ()) for t in inputs])  # the count's error
        out = []
        for spec, t in zip(self.specs, inputs, strict=True):
            name = spec["name"]
            if not isinstance(t, torch.Tensor):
                raise BucketError(f"input '{name}' is a {type(t).__name__}; give a torch.Tensor of "
                                  f"{spec['dtype']}, shape {spec['shape']}")
            want = torch_dtype(spec["dtype"])
            if t.dtype != want and self.convert_dtypes:
                if t.is_floating_point() and not want.is_floating_point and t.numel():
                    whole = torch.isfinite(t) & (t == t.trunc())
                    if not bool(whole.all()):
                        at = _first(~whole)
                        raise BucketError(f"input '{name}' holds {t[at].item()} at {list(at)}; convert_dtypes "
                                          f"converts whole numbers only to {spec['dtype']}")
                t = t.to(want)
            if t.dtype == want and t.numel():
                if spec.get("range") is not None and not want.is_floating_point and want != torch.bool:
                    self._check_range(spec, t)
                elif want.is_floating_point:
                    nan = torch.isnan(t)
                    if bool(nan.any()):
                        raise BucketError(f"input '{name}' holds NaN at {list(_first(nan))}; release "
                                          f"{self.release.get('release')} of {self.release['model']} takes numbers")
            out.append(t)
        return tuple(out)

    def _check_range(self, spec: dict[str, Any], t) -> None:
        """Integer values of input ``spec`` in its ``range`` ``[low, high)`` or equal to its ``pad`` value."""
        import torch

        lo, hi = (_num(x) for x in spec["range"])
        vmin, vmax = torch.aminmax(t)
        if lo <= int(vmin) and int(vmax) < hi:
            return
        pad = spec.get("pad")
        bad = (t < lo) | (t >= hi)
        if pad is not None and not lo <= pad < hi:
            bad &= t != pad
        if not bool(bad.any()):
            return
        at = _first(bad)
        also = f" or {_num(pad)} (its pad value)" if pad is not None and not lo <= pad < hi else " (the declared range)"
        raise BucketError(f"input '{spec['name']}' holds {int(t[at])} at {list(at)}; release "
                          f"{self.release.get('release')} of {self.release['model']} allows values in [{lo}, {hi})"
                          f"{also}")

    # -- traffic --------------------------------------------------------------------------------
    def _routed(self, want: dict[str, int], request: dict[str, int]) -> tuple[Bucket, dict[str, int]]:
        """:meth:`_route_sizes`, counting a request no bucket can serve before the error goes up."""
        try:
            return self._route_sizes(want, request)
        except BucketError:
            self.record_traffic(request, [])
            raise

    def record_traffic(self, sizes: Mapping[str, int], runs: Sequence[tuple[Bucket, Mapping[str, int]]]) -> None:
        """Count one request in :attr:`traffic_recorder`: ``sizes`` as asked (per bucket dim), ``runs`` the
        ``(bucket, run sizes)`` of each bucket call it took (empty: no bucket could serve it). A
        text-generation path calls it once per prompt with the prefill bucket:
        ``self.record_traffic({"batch": 1, "seq": prompt_len}, [(bucket, cut_sizes)])``."""
        self.traffic_recorder.record(
            sizes, runs[0][0].id if runs else None, [(b.id, b.sizes, cut) for b, cut in runs],
            truncated=any(cut.get(d, n) != n for _b, cut in runs for d, n in sizes.items() if d != self.batch_dim))

    def traffic(self) -> dict[str, Any]:
        """The traffic served so far: calls per request shape and bucket with the padding they cost, and
        per bucket ``calls``, ``elements`` (real bucket-dim positions), ``padded`` and ``padding_ratio``;
        see :meth:`neuron_build.traffic.TrafficRecorder.snapshot`. At most ``max_shapes`` distinct shapes
        are kept; calls of further new shapes count in ``overflow_calls``."""
        return self.traffic_recorder.snapshot()

    def save_traffic(self, path: str | Path, *, reset: bool = False) -> Path:
        """Write :meth:`traffic` to ``path`` as JSON lines (atomically), for ``neuron-build buckets suggest
        --traffic`` and ``report --html --traffic``; files of many replicas and days sum. ``reset``:
        start counting afresh once written."""
        return self.traffic_recorder.save(path, reset=reset)

    def _join(self, outs: list[tuple[int, Any]]):
        import torch

        first = outs[0][1]
        if isinstance(first, (tuple, list)):
            return type(first)(self._join([(n, o[i]) for n, o in outs]) for i in range(len(first)))
        if isinstance(first, torch.Tensor) and all(isinstance(o, torch.Tensor) and o.dim() > 0 and o.shape[0] == n
                                                   for n, o in outs):
            return torch.cat([o for _, o in outs], dim=0)
        return first

    def _run(self, bucket: Bucket, sizes: dict[str, int], inputs: Sequence[Any]):
        import torch

        padded = []
        for spec, binp, t in zip(self.specs, bucket.inputs, inputs, strict=True):
            want = torch_dtype(binp["dtype"])
            if t.dtype != want:
                if not self.convert_dtypes:
                    raise BucketError(f"input '{spec['name']}' is {t.dtype}; release {self.release['release']} "
                                      f"expects {want} ({binp['dtype']}); convert it, or set convert_dtypes = "
                                      f"true under [models.{self.release['model']}]")
                t = t.to(want)
            t = t[tuple(slice(0, sizes[d]) if isinstance(d, str) else slice(None) for d in spec["shape"])]
            shape = tuple(binp["shape"])
            if tuple(t.shape) != shape:
                full = torch.full(shape, spec.get("pad", 0), dtype=want, device=t.device)
                full[tuple(slice(0, n) for n in t.shape)] = t
                t = full
            padded.append(t.contiguous() if self.device == "cpu" else t.to(self.device).contiguous())
        with torch.no_grad():
            out = self._modules[bucket.id](*padded)
        return self._slice(out, bucket, sizes)

    def _slice(self, out, bucket: Bucket, sizes: dict[str, int]):
        import torch

        if isinstance(out, (tuple, list)):
            return type(out)(self._slice(o, bucket, sizes) for o in out)
        if not isinstance(out, torch.Tensor):
            return out
        best: tuple[int, list[Any]] | None = None
        for spec, binp in zip(self.specs, bucket.inputs, strict=True):
            sym, shape = spec["shape"], binp["shape"]
            k = 0
            while k < min(out.dim(), len(shape)) and out.shape[k] == shape[k]:
                k += 1
            if k and any(isinstance(d, str) for d in sym[:k]) and (best is None or k > best[0]):
                best = (k, sym[:k])
        if best is None:
            return out
        return out[tuple(slice(0, sizes[d]) if isinstance(d, str) else slice(None) for d in best[1])]


def _first(mask) -> tuple[int, ...]:
    """The index of the first true element of a boolean tensor (as ints)."""
    return tuple(int(i) for i in mask.nonzero()[0])


def _num(x: Any) -> Any:
    """A recorded bound as an int when it is a whole number (JSON and TOML may give ``30522.0``)."""
    return int(x) if float(x) == int(x) else float(x)


# -- compile-cache and torchneuron releases ---------------------------------------------------------
def check_pulled(release: Any, root: Path) -> None:
    """Check the names a pulled ``release.json`` (in folder ``root``) turns into paths before any is opened:
    bucket ids, file names and model files are relative paths inside ``root`` (:mod:`neuron_build.trust`),
    and no file listed is reached through a symlink that leaves ``root``.

    Raises:
        UntrustedRecord: one line naming ``release.json`` and the offending name.
        UserError: ``release.json`` is not a pulled release (no ``buckets`` list).
    """
    from neuron_build.trust import UntrustedRecord, check_release, refusal

    where = str(root / "release.json")
    if not isinstance(release, dict) or not isinstance(release.get("buckets"), list):
        raise UserError(f"{where}: not a pulled release (no buckets list); pull a release into {root} with "
                        f"`neuron-build pull MODEL --channel C --dest {root}`")
    what = f"release {release.get('release')!r} of {release.get('model')!r}"
    check_release(release, what, where)
    top = root.resolve()
    for b in release["buckets"]:
        for name in [*b.get("files", {}), b.get("artifact") or ""]:
            p = (root / name).resolve() if name else top
            if p != top and top not in p.parents:
                raise UntrustedRecord(refusal(what, where, f"file {name!r} resolves to {p}, outside {top}"))


def verify_pulled(release: dict[str, Any], root: Path, verify: str = "sha256") -> None:
    """Check every file a pulled ``release.json`` (in folder ``root``) lists, in each bucket's ``files`` and in
    a top-level ``files`` map when there is one: it must exist with the listed size and, with ``verify =
    "sha256"``, the listed sha256 (every byte read once). Call after :func:`check_pulled`.

    Raises:
        UserError: one line naming the first file that is missing, of another size or another sha256.
    """
    from neuron_build.trust import UntrustedRecord, refusal

    top = (release.get("files") or {}) if isinstance(release.get("files"), dict) else {}
    # a file several buckets list (the weights every graph of a text-generation model shares) is checked once
    listed = list({**top, **{n: e for b in release["buckets"] for n, e in b["files"].items()}}.items())
    for name, ent in listed:
        p = root / name
        if name in top and root.resolve() not in (root / name).resolve().parents:  # checked like check_pulled's
            raise UntrustedRecord(refusal(f"release {release.get('release')!r} of {release.get('model')!r}",
                                          str(root / "release.json"), f"file {name!r} resolves outside {root}"))
        if not isinstance(ent, dict):
            raise UserError(f"{root / 'release.json'}: file {name!r} has no size and sha256; pull the release again")
        if not p.is_file():
            raise UserError(f"{p}: missing, release.json lists it; pull the release again")
        size = p.stat().st_size
        if size != ent.get("size"):
            raise UserError(f"{p}: {size} bytes, release.json lists {ent.get('size')}; the file was changed after "
                            f"pull: pull the release again")
    if verify != "sha256":
        return
    for name, ent in listed:
        p = root / name
        got = file_sha256(p)
        if got != ent.get("sha256"):
            raise UserError(f"{p}: sha256 {got[:16]}..., release.json lists {str(ent.get('sha256'))[:16]}...; the "
                            f"file was changed after pull: pull the release again")


def install_release(folder: str | Path, neff_cache_dir: str | Path | None = None) -> dict[str, Any]:
    """For your own serving code: make this process hit a pulled compile-cache or torchneuron release's
    caches (environment, NEFF cache folder or Inductor kernels, ``load_cache_artifacts`` of every bucket:
    :func:`neuron_build.compilers.compile_cache.install_from_caches`), then compile your model with the
    returned ``torch_compile`` settings::

        settings = install_release("serve/minilm")
        model = torch.compile(my_model.to(torch.float32).eval(), **settings["torch_compile"])

    Returns:
        The release's ``serving`` record (``torch_compile``, ``env``, ``device``, ``factory``, ``kwargs``,
        ``dtype``) plus ``installed`` (entries per cache type) and ``neff_cache_dir``.

    Raises:
        UserError: no ``release.json``, or not a compile-cache or torchneuron release.
    """
    from neuron_build.compilers.compile_cache import install_from_caches

    root = Path(folder)
    try:
        release = json.loads((root / "release.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{root / 'release.json'}: cannot read it ({e}); pull a release into {root} first") from None
    serving = release.get("serving")
    if serving is None:
        raise UserError(f"{root}: a {release.get('backend')} release holds compiled models, not caches; load it "
                        f"with BucketedModel.load")
    check_pulled(release, root)
    installed, neff_dir, _env = install_from_caches([root / b["id"] for b in release["buckets"]], serving,
                                                    release.get("backend", ""), neff_cache_dir)
    return {**serving, "installed": installed, "neff_cache_dir": str(neff_dir) if neff_dir else None}


def serving_device(serving: dict[str, Any]) -> str:
    """Where the compiled model runs: the recorded device, except ``neuron`` on a host without a NeuronCore
    (``/dev/neuron*``), which runs on CPU tensors (only meaningful with a compile-only toolchain or a test
    double)."""
    import glob

    dev = serving.get("device") or "cpu"
    if dev == "neuron" and not glob.glob("/dev/neuron[0-9]*"):
        return "cpu"
    return dev


def serving_model(serving: dict[str, Any], model: Any = None, factory_root: str | Path | None = None):
    """The user's model for a compile-cache release, as it was built: ``model`` itself (an ``nn.Module``),
    ``model(**kwargs)`` (a callable), the recorded ``factory`` called with the recorded ``kwargs``, or for an
    hf model the recorded ``hf`` folder or package loaded offline (:func:`neuron_build.hf.build`; a relative
    folder resolves against ``factory_root``); cast to the recorded dtype, in eval mode, gradients off.

    Raises:
        ImportError: the recorded factory does not import (``factory_root`` first on ``sys.path``), or the
            recorded hf folder or package is not there; :class:`~neuron_build.errors.FactoryNotImportable` (also
            a ``UserError``) when the factory's own module is not under ``factory_root``.
        TypeError: the factory did not return an ``nn.Module``.
    """
    import torch

    from neuron_build.examples import load_factory, torch_dtype

    if model is None and serving.get("hf"):
        from neuron_build import hf

        model = hf.build(serving["hf"], dict(serving.get("kwargs") or {}), factory_root or Path.cwd())
    elif model is None:
        root = Path(factory_root or Path.cwd()).resolve()
        try:
            model = load_factory(root, serving["factory"])
        except ModuleNotFoundError as e:
            mod = serving["factory"].partition(":")[0]
            if not e.name or not (mod == e.name or mod.startswith(e.name + ".")):
                raise  # a module the factory itself imports is missing: not a question of the folder
            raise FactoryNotImportable(
                f"the release's model factory {serving['factory']} does not import from {root} (no module named "
                f"{e.name!r}): pass the project folder that holds it as --factory-root (neuron-build warmup) or "
                f"factory_root= (BucketedModel.load)") from None
    if not isinstance(model, torch.nn.Module):
        model = model(**dict(serving.get("kwargs") or {}))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"factory {serving.get('factory')} returned {type(model).__name__}, not a torch.nn.Module")
    model = model.to(torch_dtype(serving["dtype"])).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


#: Timed calls per bucket after the first call, for the steady-state latency of :func:`warmup`.
STEADY_CALLS = 5
WARMUP_SCHEMA = 1


def _compile_events(backend: str):
    """(snapshot function, delta -> (compiles, cache hits, details)) for a cache backend."""
    if backend == "torchneuron":
        from neuron_build.compilers.neuron.torchneuron import dynamo_metrics

        def snap():
            return len(dynamo_metrics())

        def delta(before):
            rows = dynamo_metrics()[before:]
            hits = sum(1 for r in rows if r.get("cache_hit") is True)
            return len(rows) - hits, hits, {"graphs": rows}
        return snap, delta

    from neuron_build.compilers.compile_cache import compile_counters, counter_delta, inductor_cache_dir, kernel_files

    cache = inductor_cache_dir()

    def snap_i():
        return compile_counters(), set(kernel_files(cache))

    def delta_i(before):
        counts, kernels = before
        d = counter_delta(counts, compile_counters())
        built = len(set(kernel_files(cache)) - kernels)
        graphs = d["fxgraph_cache_miss"] + d["fxgraph_cache_bypass"]
        return graphs + built, d["fxgraph_cache_hit"], {"counters": d, "graph_compiles": graphs,
                                                       "cpp_kernel_builds": built}
    return snap_i, delta_i


def warmup(folder: str | Path, model: Any = None, *, factory_root: str | Path | None = None) -> dict[str, Any]:
    """Load a pulled release (:meth:`BucketedModel.load`) and call each bucket once on inputs of its exact
    shapes, then :data:`STEADY_CALLS` more times. For compile-cache and torchneuron releases (caches) this
    is what a fresh replica pays; for inductor (AOTInductor) and torchscript releases (compiled models) it
    shows that loading compiles nothing either (the Inductor counters).

    Meant for a fresh process (``neuron-build warmup DIR`` runs one, with empty compiler caches), so that
    every hit comes from the pulled files. Compiles and hits per bucket: Inductor's
    ``fxgraph_cache_miss`` + ``fxgraph_cache_bypass`` (``graph_compiles``) plus the C++ kernel libraries
    built meanwhile (``cpp_kernel_builds``: new ``.so`` files in the Inductor cache folder), and
    ``fxgraph_cache_hit`` (compile-cache), or the rows ``torch_neuronx.get_dynamo_metrics()`` added, split by their cache-hit
    flag (torchneuron; a row without the flag counts as a compile).

    Returns:
        ``{"schema", "release", "model", "backend", "device", "device_note", "installed": {type: entries},
        "buckets": [{"id", "compiles", "cache_hits", "first_call_s", "steady_call_s", ...}],
        "compiles_total", "zero_compiles"}``; latencies in seconds (steady: the median).

    Raises:
        UserError: the folder holds no pulled release (see :meth:`BucketedModel.load`).
    """

    import torch

    from neuron_build.compilers.compile_cache import sync
    from neuron_build.examples import make_inputs

    bm = BucketedModel.load(folder, model, factory_root=factory_root)
    # an AOTInductor or TorchScript release holds compiled models: its warm-up shows that loading and calling
    # them compiles nothing either (Inductor's counters and kernel files stay as they were)
    backend = bm.release["backend"]
    snap, delta = _compile_events(backend)
    rows = []
    for b in ([] if bm.textgen is not None else bm.buckets):
        # values do not change the compiled graph, shapes and dtypes do; a pulled bucket keeps no value ranges,
        # so integer inputs (token ids, masks) are drawn from [0, 2), valid for any vocabulary
        specs = [{**i, "range": i.get("range") or [0, 2]} for i in b.inputs]
        inputs = tuple(t.to(bm.device) for t in make_inputs(specs, seed=0))
        fn = bm._modules[b.id]

        def call(fn=fn, inputs=inputs):
            with torch.no_grad():
                fn(*inputs)
        rows.append(_warm_row(b.id, [list(i["shape"]) for i in b.inputs], call, lambda: sync(bm.device), snap, delta))
    if bm.textgen is not None:  # a text-generation release: one short generate() per prefill bucket
        rows = _warm_textgen(bm, snap, delta, sync)
    note = None
    if bm.release.get("serving", {}).get("device") == "neuron" and bm.device != "neuron":
        note = "no NeuronCore here: ran on CPU tensors"
    total = sum(r["compiles"] for r in rows)
    return {"schema": WARMUP_SCHEMA, "release": bm.release.get("release"), "model": bm.release.get("model"),
            "backend": backend, "device": bm.device, "device_note": note, "installed": bm.installed,
            "env": bm.serving_env, "buckets": rows, "compiles_total": total, "zero_compiles": total == 0}


def _warm_textgen(bm: BucketedModel, snap, delta, sync) -> list[dict[str, Any]]:
    """Warm-up rows of a text-generation release: per prefill bucket, a prompt of its full length through
    ``generate(max_new_tokens=2)`` (the prefill graph, then the decode graph of its batch size), first and
    steady time in seconds, compiles and cache hits."""

    import torch

    rows = []
    eng = bm.textgen
    for b in bm.buckets:
        if b.id not in bm.release["textgen"]["graphs"] or bm.release["textgen"]["graphs"][b.id] != "prefill":
            continue
        batch, seq = b.sizes["batch"], int(b.inputs[0]["shape"][1])
        ids = torch.ones(batch, seq, dtype=torch.long)
        rows.append(_warm_row(b.id, [[batch, seq]], lambda ids=ids: eng.generate(ids, max_new_tokens=2),
                              lambda: sync(bm.device), snap, delta))
    return rows


def _warm_row(bucket_id: str, shapes: list, call, settle, snap, delta) -> dict[str, Any]:
    """One warm-up row: ``call()`` once (first call, seconds; the compiles and cache hits it caused), then
    :data:`STEADY_CALLS` more (their median, seconds), each followed by ``settle()`` (the device's sync)."""
    import statistics
    import time

    before = snap()
    t0 = time.perf_counter()
    call()
    settle()
    first = time.perf_counter() - t0
    compiles, hits, extra = delta(before)
    steady = []
    for _ in range(STEADY_CALLS):
        t0 = time.perf_counter()
        call()
        settle()
        steady.append(time.perf_counter() - t0)
    med = statistics.median(steady)
    return {"id": bucket_id, "shapes": shapes, "compiles": compiles, "cache_hits": hits,
            "first_call_s": round(first, 6), "steady_call_s": round(med, 6),
            "first_over_steady": round(first / med, 1) if med > 0 else None, **extra}


__all__ = ["Bucket", "BucketError", "BucketedModel", "check_pulled", "install_release", "serving_device", "serving_model", "verify_pulled", "warmup"]
