"""Stub shared libraries for the CUDA sonames the torch 2.9.0 **CUDA** wheel links against, so that it imports
on a CPU-only host (PyPI has no CPU build of torch 2.9.0 for Linux x86_64; torch-xla 2.9.0 is built against
torch 2.9.0's C++ ABI) [ran: shared/weights-and-real-hlo.md 1.1-1.2].

Run with the Python of the throwaway torch 2.9 venv (see ``generate.py``)::

    /tmp/venv29/bin/python benchmarks/real_hlo/cuda_stubs.py /tmp/cuda-stubs
    export LD_LIBRARY_PATH=/tmp/cuda-stubs

How: ``readelf -d`` lists every NEEDED soname of ``torch/lib/*.so`` and torch-xla's ``_XLAC*.so``; those not
found next to them nor by ``ldconfig -p`` are the missing ones. ``readelf -V`` maps each version node
(``libcublas.so.12``, ``NVSHMEM``, ...) to the soname that must define it and ``readelf --dyn-syms`` lists the
undefined symbols bound to each node. Each missing library becomes ``gcc -shared`` of one C file in which
every such symbol is ``int f(void) { return 100; }`` (100 is ``cudaErrorNoDevice``: nothing ever runs on a
GPU here), with its soname and a version script naming its nodes. Unversioned undefined ``cu*``, ``nccl*``,
``nvrtc*`` and ``nvshmem*`` symbols go into the ``libcudart`` stub (the loader binds an unversioned reference
to any library in scope). Needs ``readelf`` and ``gcc`` on PATH; builds nothing from any
fetched source.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

__all__ = ["missing_sonames", "build_stubs", "main"]

#: unversioned undefined symbols of these families (driver API, NCCL, NVRTC, NVSHMEM) go into the cudart stub
_CUDA_PREFIXES = ("cu", "nccl", "nvrtc", "nvshmem")
_VERNEED_FILE = re.compile(r"File:\s+(\S+)")
_VERNEED_NAME = re.compile(r"Name:\s+(\S+)")
_UND_SYM = re.compile(r"\sUND\s+([A-Za-z_][\w$.]*)(?:@(\S+?))?(?:\s+\(\d+\))?\s*$")


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def _libraries(site: Path) -> list[Path]:
    libs = sorted((site / "torch" / "lib").glob("*.so*")) + sorted(site.glob("_XLAC*.so"))
    if not libs:
        raise SystemExit(f"no torch/lib/*.so or _XLAC*.so under {site}: is torch 2.9 + torch-xla 2.9 installed?")
    return libs


def missing_sonames(libs: list[Path]) -> set[str]:
    """NEEDED sonames of ``libs`` found neither beside them nor in the loader cache (``ldconfig -p``)."""
    have = {p.name for lib in libs for p in lib.parent.iterdir()}
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    have |= set(re.findall(r"^\s+(\S+)\s+\(", cache, re.M))
    needed = set()
    for lib in libs:
        needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _readelf("-d", str(lib))))
    return {n for n in needed if n not in have and not n.startswith("libpython")}


def _symbols(libs: list[Path], missing: set[str]) -> dict[str, dict[str, set[str]]]:
    """soname -> version node ('' for none) -> undefined symbols the libraries bind to it."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for lib in libs:
        node_file: dict[str, str] = {}
        current = None
        for line in _readelf("-V", str(lib)).splitlines():
            if m := _VERNEED_FILE.search(line):
                current = m.group(1)
            elif (m := _VERNEED_NAME.search(line)) and current:
                node_file[m.group(1)] = current
        for line in _readelf("--dyn-syms", str(lib)).splitlines():
            m = _UND_SYM.search(line)
            if not m:
                continue
            sym, node = m.group(1), m.group(2)
            if node:
                soname = node_file.get(node, node)
                if soname in missing:
                    out[soname][node].add(sym)
            elif sym.startswith(_CUDA_PREFIXES):
                out["libcudart.so.12"][""].add(sym)
    return out


def build_stubs(outdir: Path, site: Path) -> list[Path]:
    """Build one stub ``.so`` per missing soname in ``outdir``; returns their paths."""
    libs = _libraries(site)
    missing = missing_sonames(libs)
    symbols = _symbols(libs, missing)
    outdir.mkdir(parents=True, exist_ok=True)
    built = []
    for soname in sorted(missing | set(symbols)):
        nodes = symbols.get(soname, {})
        all_syms = sorted({s for syms in nodes.values() for s in syms})
        c = outdir / f"{soname}.c"
        c.write_text("".join(f"int {s}(void) {{ return 100; }}\n" for s in all_syms) or "int stub_empty;\n")
        script = outdir / f"{soname}.map"
        named = sorted(n for n in nodes if n)
        # an unversioned reference binds to a default (@@) version too; ld allows no anonymous tag beside named ones
        unversioned = sorted(nodes.get("", ()))
        groups = {n: sorted(nodes[n]) + (unversioned if i == 0 else []) for i, n in enumerate(named)}
        blocks = [f"{n} {{ global: {''.join(f'{s}; ' for s in syms)}{'local: *; ' if i == 0 else ''}}};\n"
                  for i, (n, syms) in enumerate(groups.items())]
        if not named:
            exported = f"global: {''.join(f'{s}; ' for s in unversioned)}" if unversioned else ""
            blocks = [f"{{ {exported}local: *; }};\n"]
        script.write_text("".join(blocks))
        target = outdir / soname
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), str(c), f"-Wl,-soname,{soname}",
                        f"-Wl,--version-script,{script}"], check=True)
        built.append(target)
    return built


def main(argv: list[str]) -> int:
    """``cuda_stubs.py OUTDIR``: build the stubs for the torch and torch-xla of the running Python."""
    if len(argv) != 1:
        print("usage: cuda_stubs.py OUTDIR   (run with the torch 2.9 venv's python)", file=sys.stderr)
        return 2
    import sysconfig
    site = Path(sysconfig.get_paths()["purelib"])
    for path in build_stubs(Path(argv[0]), site):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
