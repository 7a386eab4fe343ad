"""How the Dask executor's client (:class:`~neuron_build.build.fleet.dask_executor.DaskBuild`) reaches its cluster:
which scheduler (:func:`scheduler_address`), a ``distributed.Client`` of it (:func:`connect`), and the check,
run on every worker, that each sees the client's store (:func:`check_workers`). Each failure is one line
naming the scheduler, worker or store and the fix (``--executor local`` among them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from neuron_build.build.fleet.dask_worker import StoreSpec, probe_store
from neuron_build.errors import UserError

#: Seconds the client waits for the scheduler to answer, and for a first worker to join.
CONNECT_TIMEOUT_S = 10.0


def scheduler_address(cli: str | None, configured: str | None, config_file: Any = "buckets.toml") -> str:
    """The scheduler to use: ``--scheduler``, else ``[build] scheduler``, else ``DASK_SCHEDULER_ADDRESS``.

    Raises:
        UserError: none of them is set.
    """
    addr = cli or configured or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not addr:
        raise UserError(f"{config_file}: executor dask needs a scheduler: set scheduler = \"tcp://HOST:8786\" under "
                        f"[build], pass --scheduler ADDR, or set DASK_SCHEDULER_ADDRESS (or build here with "
                        f"--executor local)")
    return addr


def _close_half_made(error: BaseException, client_cls: type) -> None:
    """Close the ``distributed.Client`` whose constructor raised ``error`` (found in the traceback's frames) now,
    while its event loop still runs: left to ``Client.__del__`` at interpreter exit, its close waits for a
    loop that is gone and prints ``Exception ignored in: Client.__del__ ... TimeoutError`` about 20 s later."""
    import contextlib

    tb = error.__traceback__
    while tb is not None:
        made = tb.tb_frame.f_locals.get("self")
        if isinstance(made, client_cls):
            with contextlib.suppress(Exception):
                made.close(timeout=2)
            made.status = "closed"  # so that __del__ has nothing left to close
            return
        tb = tb.tb_next


async def _identity(address: str, timeout_s: float) -> Any:
    """What the Dask server at ``address`` says it is (its ``identity`` reply), on a connection of its own."""
    from distributed.comm import connect as comm_connect

    comm = await comm_connect(address, timeout=timeout_s)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()
    finally:
        await comm.close()


def probe_scheduler(address: str, timeout_s: float) -> None:
    """Check, within ``timeout_s`` seconds in all, that a Dask scheduler answers at ``address`` (``tcp://``
    addresses; others are left to the client). ``distributed.Client`` alone waits forever on a port where
    something else accepts connections but never speaks Dask (the dashboard's HTTP server, 8787).

    Raises:
        UserError: nothing listens there, nothing answered as Dask in time, or a Dask worker (not the
            scheduler) answered; one line with the fix.
    """
    import asyncio

    if "://" in address and not address.startswith("tcp://"):
        return
    import socket

    from distributed.comm import get_address_host_port

    fix = "fix [build] scheduler or --scheduler, or build on this host with --executor local"
    try:
        socket.create_connection(get_address_host_port(address), timeout=timeout_s).close()
    except (OSError, ValueError) as e:  # refused, no route, a bad address: nothing to wait for
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot reach the Dask scheduler at {address} ({why[:200]}); start it (dask scheduler), "
                        f"{fix}") from None
    try:
        who = asyncio.run(asyncio.wait_for(_identity(address, timeout_s), timeout_s))
    except Exception:  # a timeout, a closed connection, bytes that are not Dask's: not a scheduler
        who = None
    kind = who.get("type") if isinstance(who, dict) else None
    if kind is None:
        raise UserError(f"{address} did not answer as a Dask scheduler within {timeout_s:g} s (is it the dashboard "
                        f"port? the scheduler listens on 8786 by default); {fix}")
    if kind != "Scheduler":
        raise UserError(f"{address} is a Dask {kind}, not the scheduler; give the scheduler's address (dask "
                        f"scheduler prints it, port 8786 by default): {fix}")


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S):
    """A ``distributed.Client`` of the scheduler at ``address``, after :func:`probe_scheduler` (so that every
    wait is bounded by ``timeout_s``).

    Raises:
        UserError: the scheduler did not answer within ``timeout_s`` seconds (one line, with the fix).
    """
    from distributed import Client
    probe_scheduler(address, timeout_s)
    try:
        return Client(address, timeout=timeout_s, set_as_default=False)
    except Exception as e:  # OSError / TimeoutError / ValueError (a bad address), all "cannot reach"
        _close_half_made(e, Client)
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot reach the Dask scheduler at {address} ({why[:200]}); start it (dask scheduler), fix "
                        f"[build] scheduler or --scheduler, or build on this host with --executor local") from None


def check_workers(client: Any, spec: StoreSpec, ident: str, address: str, wait_s: float = CONNECT_TIMEOUT_S,
                  wait: Callable[[Any, str], None] | None = None) -> dict:
    """Wait for at least one worker, then check from every worker that the store is reachable and is the
    client's store. Returns the scheduler's worker table (address -> info with ``nthreads``, ``resources``).
    ``wait(client, address)``: the wait for a first worker of a cluster started for the build (Slurm:
    :meth:`~neuron_build.build.fleet.slurm_wait.SlurmStart.wait_for_workers`, which raises its own error); None:
    ``wait_s`` seconds for a worker someone starts with ``dask worker``.

    Raises:
        UserError: no worker joined within ``wait_s`` seconds, or a worker sees another store (or none) at
            the location; the message names the worker, the location and the fix.
    """
    if wait is not None:
        wait(client, address)
    else:
        try:
            client.wait_for_workers(1, timeout=wait_s)
        except Exception:
            raise UserError(f"no Dask workers are connected to {address}; start some with "
                            f"`dask worker {address} --nthreads 1` (or build here with --executor local)") from None
    answers = client.run(probe_store, spec.location, spec.options, ident)
    bad = {w: why for w, why in sorted(answers.items()) if why is not None}
    if bad:
        w, why = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more workers)" if len(bad) > 1 else ""
        raise UserError(f"the store {spec.location} is not reachable as the same store from Dask worker {w}{more}: "
                        f"{why}; Dask workers publish straight into the store, so use a folder every worker mounts "
                        f"at that path or a remote store ([build] remote), or build here with --executor local")
    return dict(client.scheduler_info(n_workers=-1)["workers"])


__all__ = [
    "CONNECT_TIMEOUT_S",
    "check_workers",
    "connect",
    "probe_scheduler",
    "scheduler_address",
]
