"""Serving a pulled release: route each call to the smallest static-shape bucket that fits.

The package: :mod:`~neuron_build.runtime.routing` (rules 1-3, pure and torch-free: :class:`Router`),
:mod:`~neuron_build.runtime.bucketed` (:class:`BucketedModel`: rules 4-8 and text generation),
:mod:`~neuron_build.runtime.pulled` (the pulled folder's record, typed: :class:`PulledRelease` with one
:class:`~neuron_build.runtime.pulled.PulledBucket` per bucket, read and checked by :func:`read_pulled`, kept as
:attr:`BucketedModel.release`), :mod:`~neuron_build.runtime.install`
(checking the files a pulled release lists, installing it; the user's model of a cache release) and
:mod:`~neuron_build.runtime.warmup` (:func:`warmup`). The names a serving host uses are importable from
``neuron_build.runtime``; the rest from their modules.

``BucketedModel.load(DIR)`` reads ``DIR/release.json`` (written by ``neuron-build pull``) and loads every
bucket's artifact with its loader (:func:`neuron_build.artifact.load_artifact`): ``torch.jit.load`` for
``.pt`` (TorchScript, and Neuron artifacts, which are TorchScript modules holding the NEFF and are placed on
a NeuronCore when loaded [doc: toolchain notes]), ``torch._inductor.aoti_load_package`` for ``.pt2``
(AOTInductor). A file several buckets name (hard links of one blob) is loaded once; external weights
(``weights = "external"``) are read once per content and every bucket's AOTInductor package runs on the same
tensors (:class:`neuron_build.compilers.weights.SharedWeights`), each package's spec checked first.

Routing rules, per call:

1. **Sizes.** Each input's shape is matched against its symbolic shape (``["batch", "seq"]``): the rank
   and every fixed dim must match, and a bucket dim used by several inputs must have one size in all of
   them. That gives the request's size per bucket dim (``batch=3, seq=40``).
2. **Bucket.** Buckets are ordered by total size (the product of their dim sizes; ties by the sizes in
   dim order), and the first whose every dim is at least the request's is chosen: the smallest bucket
   that fits. ``choose(shapes)`` returns its id without running anything (:class:`Router`, no torch).
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

from neuron_build.runtime.bucketed import BucketedModel
from neuron_build.runtime.install import install_release, serving_model, textgen_source, verify_pulled
from neuron_build.runtime.pulled import PulledRelease, read_pulled
from neuron_build.runtime.routing import BucketError, Router
from neuron_build.runtime.warmup import warmup

__all__ = ["BucketError", "BucketedModel", "PulledRelease", "Router", "install_release", "read_pulled", "serving_model",
           "textgen_source", "verify_pulled", "warmup"]
