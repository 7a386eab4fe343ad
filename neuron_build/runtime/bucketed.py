"""The served model of a pulled release: :class:`BucketedModel` routes (:mod:`neuron_build.runtime.routing`),
checks, pads, runs and slices each call, or generates from a text-generation release; the rules are in
:mod:`neuron_build.runtime`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_build.artifact import load_artifact, release_version_problem
from neuron_build.cpu_isa import isa_problem, package_cpu_isa
from neuron_build.errors import UserError
from neuron_build.examples import torch_dtype
from neuron_build.runtime.install import (
    VERIFY_MODES,
    serving_device,
    serving_model,
    textgen_source,
    verify_pulled,
)
from neuron_build.runtime.pulled import PulledRelease, read_pulled, release_file
from neuron_build.runtime.routing import Bucket, BucketError, Router
from neuron_build.traffic import DEFAULT_MAX_SHAPES, TrafficRecorder


class BucketedModel(Router):
    """A pulled release, callable like the model: routes (the rules of :class:`Router`), checks, pads, runs
    and slices (see :mod:`neuron_build.runtime` for the rules); ``generate`` for a text-generation release.

    Attributes:
        release: the pulled release's record (:class:`~neuron_build.runtime.pulled.PulledRelease`, what
            :func:`~neuron_build.runtime.pulled.read_pulled` reads of ``release.json``): ``release.model``,
            ``release.release``, ``release.buckets``, ... (``release.to_json()``: the file's content).
        buckets: in routing order (smallest total size first).
        dims: the bucket dim names.
        batch_dim: see :class:`Router`.
    """

    def __init__(self, release: PulledRelease, root: Path, modules: dict[str, Any] | None = None, *,
                 metrics: Any = None, max_shapes: int = DEFAULT_MAX_SHAPES):
        super().__init__(release, root)
        self.convert_dtypes: bool = release.convert_dtypes
        self._modules: dict[str, Any] = dict(modules or {})
        self.device = "cpu"
        self.installed: dict[str, int] = {}
        self.serving_env: dict[str, str] = {}
        self.neff_cache_dir: Path | None = None
        #: External weights loaded once for every bucket (:class:`~neuron_build.compilers.weights.SharedWeights`;
        #: its ``loaded``: one FQN -> tensor map per weights file content), else None.
        self.weights: Any = None
        #: A text-generation release's engine (:mod:`neuron_build.compilers.textgen_load`), else None.
        self.textgen: Any = None
        #: The traffic this model served (:mod:`neuron_build.traffic`); ``metrics``: a prometheus_client
        #: registry to export it on (None: no metrics); ``max_shapes``: distinct shapes kept.
        self.traffic_recorder = TrafficRecorder(release.model, release.release, self.dims,
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
        compiled with the recorded ``torch.compile`` settings. Nothing compiles until the first call. A
        text-generation release is loaded as validation and bench load its graphs
        (:func:`neuron_build.compilers.textgen_load.load_textgen`): an NxDI release (backend neuron) by NxDI
        itself, which on a host without a NeuronCore is one line naming the host it needs.
        ``metrics`` and ``max_shapes``: the traffic counts' Prometheus registry and cap (see :meth:`traffic`).
        ``verify``: what is checked of every file ``release.json`` lists before anything is loaded (see
        :func:`verify_pulled`): ``"sha256"`` (default: size and content; reads every byte once) or ``"size"``
        (for hosts that verified at pull and load often).

        Raises:
            UserError: no ``release.json``; this host's installed versions cannot load the artifacts (one
                line naming the built and the installed version; the rule per artifact kind is
                :data:`neuron_build.artifact.LOAD_RULES`); a listed file is missing, has another size or
                (``verify="sha256"``) another sha256 than listed; or ``verify`` is not a mode; a text-generation
                release whose backend has no text-generation serving engine (one line).
            ImportError: the recorded factory does not import from ``factory_root``.
        """
        if verify not in VERIFY_MODES:
            raise UserError(f"BucketedModel.load: verify={verify!r}; give 'sha256' (the default) or 'size'")
        root = Path(folder)
        release = _checked_release(root, verify)
        bm = cls(release, root, metrics=metrics, max_shapes=max_shapes)
        if release.textgen is not None or _is_nxdi(release):  # prefill + decode graphs: generate()
            bm._load_textgen(model, factory_root)
        elif release.serving is not None:
            bm._load_cached(model, factory_root, neff_cache_dir)
        else:
            bm._load_compiled()
        return bm

    def _load_textgen(self, user_model: Any, factory_root: str | Path | None) -> None:
        """A text-generation release: its engine (:func:`neuron_build.compilers.textgen_load.load_textgen`)."""
        from neuron_build.compilers.textgen_load import load_textgen

        release = self.release
        serving = release.serving
        self.device = "neuron" if _is_nxdi(release) else serving_device(serving) if serving is not None else "cpu"
        src = textgen_source(release, self.root, lambda: serving_model(serving or {}, user_model, factory_root))
        self.textgen, self.installed = load_textgen(src)

    def _load_compiled(self) -> None:
        """A release of compiled models (AOTInductor, TorchScript, Neuron): each bucket's own artifact, after
        the AOTInductor package's CPU instruction set is checked against this host's. A file two buckets name
        (one path, or hard links of one blob: the same ``(st_dev, st_ino)``) is loaded once and shared. External
        weights (an AOTInductor package with ``weights.json``) are loaded once per content (the sha256
        ``release.json`` lists) and every package runs on the same tensors (:attr:`weights`), each package's
        spec checked against them first."""
        from neuron_build.compilers.weights import SharedWeights

        self.weights = SharedWeights({str((self.root / n).resolve()): e["sha256"] for b in self.release.buckets
                                      for n, e in b.files.items()})
        loaded: dict[tuple[int, int, str], Any] = {}
        for b in self.buckets:
            isa = package_cpu_isa(b.artifact) if str(b.artifact).endswith(".pt2") else None
            where = f"{b.artifact} (bucket {b.id} of release {self.release.release})"
            problem = isa_problem(isa, where) if isa else None
            if problem:
                raise UserError(problem)
            st = os.stat(b.artifact)
            ident = (st.st_dev, st.st_ino, b.loader)
            if ident not in loaded:
                loaded[ident] = load_artifact(b.artifact, b.loader, self.release.backend,
                                              shared_weights=self.weights)
            self._modules[b.id] = loaded[ident]

    def _load_cached(self, user_model: Any, factory_root: str | Path | None, neff_cache_dir: str | Path | None) -> None:
        """A compile-cache or torchneuron release: install every bucket's caches, build the user's model and
        compile it once with the recorded settings (every bucket then runs the same compiled module)."""
        from neuron_build.compilers.compile_cache import compile_from_caches

        serving = self.release.serving or {}
        self.device = serving_device(serving)
        module = serving_model(serving, user_model, factory_root).to(self.device)
        self.user_module = module
        compiled, self.installed, self.neff_cache_dir, self.serving_env = compile_from_caches(
            [self.root / b.id for b in self.buckets], serving, self.release.backend, module,
            neff_cache_dir)
        for b in self.buckets:
            self._modules[b.id] = compiled

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
            raise BucketError(f"{self.release.model} is not a text-generation release; call the model "
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
        for n in lengths:
            fit = self.prefill_bucket(n)
            sizes = {"batch": 1, "seq": n} if "batch" in self.dims else {"seq": n}
            self.record_traffic(sizes, [(fit, sizes)] if fit is not None else [])

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
            raise BucketError(f"{self.release.model} is a text-generation release: call "
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
                                          f"{self.release.release} of {self.release.model} takes numbers")
                    inf = torch.isinf(t)
                    if bool(inf.any()):
                        at = _first(inf)
                        raise BucketError(f"input '{name}' holds {t[at].item()} at {list(at)}; release "
                                          f"{self.release.release} of {self.release.model} takes finite "
                                          f"numbers")
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
                          f"{self.release.release} of {self.release.model} allows values in [{lo}, {hi})"
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
                    raise BucketError(f"input '{spec['name']}' is {t.dtype}; release {self.release.release} "
                                      f"expects {want} ({binp['dtype']}); convert it, or set convert_dtypes = "
                                      f"true under [models.{self.release.model}]")
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


def _is_nxdi(release: PulledRelease) -> bool:
    """Whether a pulled release holds NxDI compiles (by their recorded loader), served on a NeuronCore."""
    from neuron_build.compilers.neuron.nxdi_serve import is_nxdi_release

    return is_nxdi_release(release)


def _checked_release(root: Path, verify: str) -> PulledRelease:
    """``root``'s ``release.json``, checked before anything is loaded: its names and fields
    (:func:`~neuron_build.runtime.pulled.read_pulled`), the host an NxDI release needs (a NeuronCore), this host's
    versions against the artifacts' (one line naming the built and the installed version,
    :data:`neuron_build.artifact.LOAD_RULES`), and every listed file (:func:`verify_pulled`)."""
    rec = read_pulled(root, f"pull a release into {root} with `neuron-build pull MODEL --channel C --dest {root}`")
    where = str(release_file(root))
    if _is_nxdi(rec):  # said before any file is hashed: this host cannot serve it at all
        from neuron_build.compilers.neuron import nxdi_serve

        problem = nxdi_serve.host_problem(rec.model, rec.backend, rec.hardware_target, where,
                                          nxdi_serve.pulled_tp_degree(rec, root))
        if problem:
            raise UserError(problem)
    problem = release_version_problem(rec.backend, rec.toolchain, [(b.loader, b.artifact) for b in rec.buckets],
                                      f"{where} (release {rec.release} of {rec.model})")
    if problem:
        raise UserError(problem)
    verify_pulled(rec, root, verify)
    return rec


__all__ = ["BucketedModel"]
