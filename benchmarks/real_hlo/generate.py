"""Real HLO fixtures for the HLO key tests, made by torch-xla 2.9 on CPU (``tests/compilers/neuron/real_hlo/``).

The fixtures are ``HloModuleProto`` bytes exactly as ``torch_xla._XLAC.lowering.LoweringContext().hlo()``
returns them (the lowering ``torch_neuronx.xla_impl.trace`` builds on [code: 1.13 copy, shared/
hlo-before-neff.md 2.2]) for one tiny seeded model (``TinyBlock``: one softmax attention head with a
residual, then ``Linear(16, 32) -> GELU -> Linear(32, 8)``; input ``f32[4, 16]``), except that absolute paths
are rewritten to ``/src/...`` (below). The variants, each lowered in a fresh process:

==============================  =====  =================================================================
fixture                         debug  what changed against ``tiny_block.debug.pb``
==============================  =====  =================================================================
``tiny_block.pb``               off    debug off
``tiny_block.seed7.pb``         off    debug off, new weight values (seed 7)
``tiny_block.tanh.pb``          off    debug off, ``GELU(approximate="tanh")`` (a semantic change)
``tiny_block.scale8.pb``        off    debug off, ``/ 8.0`` for ``/ 4.0`` in ``forward`` (semantic, and yet
                                       the same bytes: the scalar is an HLO parameter, ``f32[]``)
``tiny_block.irtohlo.pb``       off    debug off, lowered by ``_XLAC._get_xla_tensors_hlo_proto`` (module
                                       ``IrToHlo.<n>``) instead of ``LoweringContext``
``tiny_block.debug.pb``         on     (the reference)
``tiny_block.debug.second.pb``  on     the second lowering of the same model in the same process
``tiny_block.debug.moved.pb``   on     the model source copied to another folder
``tiny_block.debug.comment.pb`` on     a docstring and comments added to the model source (lines shift)
``tiny_block.debug.seed7.pb``   on     new weight values (seed 7)
``tiny_block.debug.tanh.pb``    on     ``GELU(approximate="tanh")``
==============================  =====  =================================================================

"Debug on" is NxD's INFO metadata level: ``XLA_IR_DEBUG=1 XLA_HLO_DEBUG=1`` and
``torch_xla._XLAC._set_ir_debug(True)`` [code: NxD ``trace/model_builder.py`` ``_get_hlo_metadata_context``].
``fixtures.json`` beside them records each file's variant, size and sha256, and the torch and torch-xla
versions (timings are printed, not recorded, so that a rerun that lowers the same bytes changes no file).

Paths: with debug on, absolute paths sit in every instruction's ``metadata.source_file`` (``HloModuleProto``
3 -> ``HloComputationProto`` 2 -> ``HloInstructionProto`` 7 -> ``OpMetadata`` 3) and in the module's
``stack_frame_index.file_names`` (17 -> 1) [ran]. Those strings are rewritten at the protobuf wire level
(:func:`neutral_paths`: the enclosing messages are re-encoded with their new lengths, every other byte kept
as it was, in order): the scratch workspace becomes ``/src/work``, the venv's site-packages
``/src/site-packages``, the Python install ``/src/python``, this repository ``/src/repo``. The folder a model
sits in below the workspace is kept (``checkout/`` vs ``elsewhere/moved/``), so the moved-folder fixture
still differs from the reference. Writing fails if any machine path is left anywhere in the bytes.
The stack frames of the debug fixtures include this script's own lines (``lower``): editing it changes
their bytes on the next run (the key does not change).

Needs torch 2.9.0 and torch-xla 2.9.0 (``_XLAC.so`` is built against torch 2.9.0's C++ ABI; torch 2.13
cannot load it), so it runs in a throwaway venv outside the repository, never the project's::

    python3.11 -m venv /tmp/venv29
    /tmp/venv29/bin/pip download --no-deps torch==2.9.0 torch-xla==2.9.0 -d /tmp/wheels29   # 900 + 80 MB
    /tmp/venv29/bin/pip install --no-deps /tmp/wheels29/*.whl
    /tmp/venv29/bin/pip install filelock typing-extensions sympy networkx jinja2 fsspec \\
        absl-py numpy pyyaml requests
    /tmp/venv29/bin/python benchmarks/real_hlo/cuda_stubs.py /tmp/cuda-stubs   # the CUDA wheel on a CPU host
    LD_LIBRARY_PATH=/tmp/cuda-stubs PJRT_DEVICE=CPU PYTHONPATH=$PWD \\
        /tmp/venv29/bin/python benchmarks/real_hlo/generate.py tests/compilers/neuron/real_hlo

(from the repository root; about 10 s per lowering process on 2 cores). The tests that read the fixtures
need neither torch-xla nor protobuf.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

__all__ = ["MODEL", "VARIANTS", "lower", "main", "neutral_paths"]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODEL = '''\
import torch


class TinyBlock(torch.nn.Module):
    def __init__(self, d=16, hidden=32, out=8):
        super().__init__()
        self.q = torch.nn.Linear(d, d)
        self.k = torch.nn.Linear(d, d)
        self.v = torch.nn.Linear(d, d)
        self.fc1 = torch.nn.Linear(d, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, out)

    def forward(self, x):
        att = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / 4.0, dim=-1)
        h = x + att @ self.v(x)
        return self.fc2(self.act(self.fc1(h)))
'''
COMMENTED = '''\
"""The same block with a docstring and comments: every line below moves."""
# a comment-only edit
''' + MODEL.replace("    def forward(self, x):\n", "    def forward(self, x):\n        # attention, then the MLP\n")
TANH = MODEL.replace("torch.nn.GELU()", 'torch.nn.GELU(approximate="tanh")')
SCALE8 = MODEL.replace("/ 4.0", "/ 8.0")

#: fixture name -> (model source, folder below the workspace, seed, debug, which lowering in the process;
#: 0: the first, through ``_get_xla_tensors_hlo_proto``)
VARIANTS = {
    "tiny_block.pb": (MODEL, "checkout", 0, False, 1),
    "tiny_block.seed7.pb": (MODEL, "checkout", 7, False, 1),
    "tiny_block.tanh.pb": (TANH, "checkout", 0, False, 1),
    "tiny_block.scale8.pb": (SCALE8, "checkout", 0, False, 1),
    "tiny_block.irtohlo.pb": (MODEL, "checkout", 0, False, 0),
    "tiny_block.debug.pb": (MODEL, "checkout", 0, True, 1),
    "tiny_block.debug.second.pb": (MODEL, "checkout", 0, True, 2),
    "tiny_block.debug.moved.pb": (MODEL, "elsewhere/moved", 0, True, 1),
    "tiny_block.debug.comment.pb": (COMMENTED, "checkout", 0, True, 1),
    "tiny_block.debug.seed7.pb": (MODEL, "checkout", 7, True, 1),
    "tiny_block.debug.tanh.pb": (TANH, "checkout", 0, True, 1),
}
#: where paths sit in an HloModuleProto [ran, field numbers of xla/service/hlo.proto]
PATH_FIELDS = ((17, 1), (3, 2, 7, 3))
MACHINE_ROOTS = (b"/tmp/", b"/home/", b"/root/", b"/work/", b"/usr/", b"/opt/", b"/var/")


def lower(model_dir: str, out: str, seed: int, nth: int) -> None:
    """In this process: import ``tiny_model`` from ``model_dir``, build it with ``seed``, lower it ``nth``
    times on the XLA CPU device (``LoweringContext``; ``nth`` 0: once, by ``_get_xla_tensors_hlo_proto``)
    and write the last lowering's ``HloModuleProto`` bytes to ``out``."""
    t0 = time.perf_counter()
    sys.path.insert(0, model_dir)
    import torch
    import torch_xla

    if os.environ.get("XLA_IR_DEBUG") == "1":
        torch_xla._XLAC._set_ir_debug(True)  # as NxD's INFO/DEBUG metadata level does
    import tiny_model

    t1 = time.perf_counter()
    torch.manual_seed(seed)
    model = tiny_model.TinyBlock().eval()
    x = torch.randn(4, 16)
    dev = torch_xla.device()
    model, x = model.to(dev), x.to(dev)
    for _ in range(max(nth, 1)):
        with torch.no_grad():
            y = model(x)
        if nth == 0:  # the other entry point (torch-xla's gradient accumulation uses it)
            raw = torch_xla._XLAC._get_xla_tensors_hlo_proto([y])
            break
        ctx = torch_xla._XLAC.lowering.LoweringContext()
        ctx.build([y])
        raw = ctx.hlo()
    Path(out).write_bytes(raw)
    print(json.dumps({"import_s": round(t1 - t0, 2), "lower_s": round(time.perf_counter() - t1, 2),
                      "torch": torch.__version__, "torch_xla": torch_xla.__version__}))


def _rewrite(buf: bytes, path: tuple[int, ...], fn) -> bytes:
    from neuron_build.compilers.neuron.hlo import wire_fields
    from tests.compilers.neuron.hlo_messages import len_field

    out = bytearray()
    for number, wire, value, start, stop in wire_fields(buf):
        if number != path[0] or wire != 2:
            out += buf[start:stop]
        elif len(path) == 1:
            out += len_field(number, fn(bytes(value)))
        else:
            out += len_field(number, _rewrite(bytes(value), path[1:], fn))
    return bytes(out)


def neutral_paths(data: bytes, prefixes: dict[str, str]) -> bytes:
    """``data`` (a serialized HloModuleProto) with every path string of :data:`PATH_FIELDS` that starts with
    a key of ``prefixes`` rewritten to start with its value (longest prefix first).

    Raises:
        SystemExit: a machine path is left in the bytes after the rewrite (naming it).
    """
    order = sorted(prefixes, key=len, reverse=True)

    def fn(s: bytes) -> bytes:
        text = s.decode()
        for p in order:
            if text.startswith(p + "/"):
                return (prefixes[p] + text[len(p):]).encode()
        return s

    for path in PATH_FIELDS:
        data = _rewrite(data, path, fn)
    rest = data.replace(b"/src/", b"<neutral>")
    for root in MACHINE_ROOTS + tuple(p.encode() for p in prefixes):
        at = rest.find(root)
        if at >= 0:
            raise SystemExit(f"a machine path is left in the HLO after the rewrite: {rest[at:at + 80]!r}")
    return data


def main(argv: list[str]) -> int:
    """``generate.py OUTDIR``: write every fixture of :data:`VARIANTS` and ``fixtures.json`` to OUTDIR."""
    if len(argv) == 5 and argv[0] == "--lower":
        lower(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return 0
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    outdir = Path(argv[0]).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"fixtures": {}}
    with tempfile.TemporaryDirectory(prefix="real-hlo-") as tmp:
        work = Path(tmp).resolve()
        prefixes = {str(work): "/src/work", sysconfig.get_paths()["purelib"]: "/src/site-packages",
                    sys.base_prefix: "/src/python", sys.prefix: "/src/venv", str(REPO): "/src/repo"}
        for name, (source, folder, seed, debug, nth) in VARIANTS.items():
            model_dir = work / folder
            model_dir.mkdir(parents=True, exist_ok=True)
            (model_dir / "tiny_model.py").write_text(source)
            env = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_IR_DEBUG": "1" if debug else "0",
                   "XLA_HLO_DEBUG": "1" if debug else "0"}
            raw = work / "raw.pb"
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--lower", str(model_dir), str(raw), str(seed), str(nth)],
                                  env=env, check=True, capture_output=True, text=True)
            info = json.loads(done.stdout.strip().splitlines()[-1])
            data = neutral_paths(raw.read_bytes(), prefixes)
            (outdir / name).write_bytes(data)
            manifest["torch"], manifest["torch_xla"] = info.pop("torch"), info.pop("torch_xla")
            manifest["fixtures"][name] = {"folder": folder, "seed": seed, "debug": debug, "lowering": nth,
                                          "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            print(name, len(data), "bytes, process", round(time.perf_counter() - t0, 1), "s", info)
    (outdir / "fixtures.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
