"""How many compiles a build runs at once by default (stdlib only: ``dodo.py`` reads it on import)."""

from __future__ import annotations

import os


def default_jobs(max_host_memory_bytes: int | None = None, compile_memory_bytes: int = 4 * 10**9,
                 cpus: int | None = None, host_memory_bytes: int | None = None) -> int:
    """How many compiles to run at once by default: one per CPU this process may use, bounded by the
    host-memory budget (``max_host_memory_bytes``, else 80 % of the host's physical memory) divided by the
    expected peak of one compile (``compile_memory_bytes``, bytes; ``[build] default_compile_memory_gb``).
    At least 1. The memory budget itself is still enforced per compile (a compile waits while it would
    exceed it), so this only decides how many may try at once.

    Args:
        cpus: CPUs to use (default: the process's CPU affinity, else ``os.cpu_count()``).
        host_memory_bytes: physical memory in bytes (default: from ``sysconf``; no psutil import).
    """
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    budget = max_host_memory_bytes
    if budget is None:
        if host_memory_bytes is None:
            try:
                host_memory_bytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            except (ValueError, OSError, AttributeError):
                host_memory_bytes = 0
        budget = int(host_memory_bytes * 0.8) if host_memory_bytes else None
    by_memory = max(1, budget // max(1, compile_memory_bytes)) if budget else cpus
    return max(1, min(cpus, by_memory))


__all__ = ["default_jobs"]
