"""The host's CPU ISA, read torch-free, named the way AOTInductor names it in a package's ``AOTI_CPU_ISA``.

AOTInductor compiles CPU packages with ``-march=native`` and records the vector ISA it picked
(``str(torch._inductor.cpu_vec_isa.pick_vec_isa()).upper()``, e.g. ``AVX512 AVX512_VNNI AMX_TILE``) as
``AOTI_CPU_ISA`` in the package's metadata [code: torch ``_inductor/codecache.py``,
``_inductor/cpu_vec_isa.py``]. Such a package needs a host with that ISA, so the key of an inductor CPU
target carries the build host's ISA (``compiler.cpu_isa``) and a load on a host that lacks it is refused.

The ISA is read from ``/proc/cpuinfo`` flags, as torch's checks do through cpuinfo: ``avx2`` -> ``AVX2``;
``avx512f`` with ``avx512bw``, ``avx512vl`` and ``avx512dq`` -> ``AVX512``; then ``avx512_vnni`` ->
``AVX512_VNNI``; ``amx_tile`` -> ``AMX_TILE``. The name is the highest level, as torch prints it
(``AVX512 AVX512_VNNI``); :func:`features` is the set a host provides (``AVX512`` implies ``AVX2``). On
other machines the name is the machine (``AARCH64``, ``PPC64LE``) and features are that one word.

``NEURON_BUILD_CPU_ISA`` overrides the host's ISA name (e.g. ``AVX2``: key or load as such a host would).
No torch import: keys are computed on the no-op path.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

#: The environment variable that overrides the host's ISA name.
ISA_ENV = "NEURON_BUILD_CPU_ISA"
#: The implied features of each ISA word (a host with AVX512_VNNI has AVX512 and AVX2).
_IMPLIES = {"AVX512": {"AVX2"}, "AVX512_VNNI": {"AVX512", "AVX2"}, "AMX_TILE": {"AVX512", "AVX512_VNNI", "AVX2"}}


@lru_cache(maxsize=4)
def _from_cpuinfo(path: str) -> str:
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return machine.upper() or "UNKNOWN"
    flags: set[str] = set()
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "UNKNOWN"
    words = []
    if "avx2" in flags:
        words = ["AVX2"]
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        words = ["AVX512"]
        if "avx512_vnni" in flags:
            words.append("AVX512_VNNI")
            if "amx_tile" in flags:
                words.append("AMX_TILE")
    return " ".join(words) or "NO AVX"


def host_cpu_isa(environ: dict[str, str] | None = None, cpuinfo: str = "/proc/cpuinfo") -> str:
    """This host's CPU ISA as AOTInductor names it (``AVX512 AVX512_VNNI``, ``AVX2``, ``NO AVX``), or the
    value of :data:`ISA_ENV` in ``environ`` (default ``os.environ``) when set. Read once per process."""
    env = os.environ if environ is None else environ
    given = env.get(ISA_ENV, "").strip()
    return " ".join(given.upper().split()) if given else _from_cpuinfo(cpuinfo)


def features(isa: str) -> set[str]:
    """The ISA words a host named ``isa`` provides, implied ones included (``AVX512`` -> AVX512, AVX2)."""
    out: set[str] = set()
    for w in isa.upper().split():
        out.add(w)
        out |= _IMPLIES.get(w, set())
    return out


def isa_problem(needed: str, what: str, host: str | None = None) -> str | None:
    """One line saying why this host (ISA ``host``, default :func:`host_cpu_isa`) cannot run ``what``,
    built for CPU ISA ``needed``; None when it can (every word ``needed`` names is one the host provides).
    ``NO AVX`` and an empty ``needed`` need nothing."""
    host = host_cpu_isa() if host is None else host
    need = set() if needed.strip().upper() in ("", "NO AVX", "INVALID_VEC_ISA") else set(needed.upper().split())
    missing = sorted(need - features(host))
    if not missing:
        return None
    return (f"{what} was built for CPU ISA '{needed}' (AOTInductor compiles with -march=native); this host has "
            f"'{host}' and lacks {', '.join(missing)}: build it on a host like this one (its key carries the "
            f"ISA), or serve it on a host with {needed}")


def package_cpu_isa(package: str | os.PathLike) -> str | None:
    """``AOTI_CPU_ISA`` of an AOTInductor CPU package (``model.pt2``: a zip whose
    ``*/data/aotinductor/*/*_metadata.json`` hold ``AOTI_DEVICE_KEY`` and ``AOTI_CPU_ISA``), read torch-free;
    None when the package is not for the CPU, records no ISA, or is not a readable zip."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(package) as z:
            for n in z.namelist():
                if n.endswith("_metadata.json") and "/aotinductor/" in n:
                    meta = json.loads(z.read(n))
                    if isinstance(meta, dict) and meta.get("AOTI_DEVICE_KEY") == "cpu" and meta.get("AOTI_CPU_ISA"):
                        return str(meta["AOTI_CPU_ISA"])
    except (OSError, ValueError, zipfile.BadZipFile, KeyError):
        return None
    return None


__all__ = ["ISA_ENV", "features", "host_cpu_isa", "isa_problem", "package_cpu_isa"]
