"""The audit events a read recorder treats as unrecordable (a child process, a network connection) or as
the import system's own, and how such an event is named in the one-line reason of an incomplete record.
Used by :mod:`neuron_build.project.reads`; standard library only."""

from __future__ import annotations

import os

#: Audit events of a child process started (its reads cannot be recorded).
CHILD_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                          "os.forkpty", "pty.spawn", "os.startfile"})
#: Audit events of network access (what it fetches cannot be recorded).
NETWORK_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg", "urllib.Request"})
#: Top-level packages that only carry a caller's request (HTTP clients, process runners): a child process or
#: a connection they make is attributed to their caller.
TRANSPORT = frozenset({"requests", "urllib3", "httpx", "httpcore", "aiohttp", "botocore", "boto3", "s3transfer",
                       "fsspec", "s3fs", "gcsfs", "smart_open", "sh", "plumbum"})
#: Modules whose folder listings are the import system's, never a read: sys.path scans.
IMPORT_MACHINERY = ("importlib", "pkgutil", "pkg_resources", "site", "zipimport")
#: The fix an incomplete record's reason names.
FIX = "declare them with the model options inputs_from = [...] and env = [...], or always_rebuild = true"


def what(event: str, args: tuple) -> str:
    """What a child process runs or a connection reaches, short."""
    if event == "subprocess.Popen" and len(args) > 1:
        a = args[1]
        out = " ".join(map(os.fsdecode, a)) if isinstance(a, (list, tuple)) else os.fsdecode(a)
    elif event in ("os.system", "os.exec", "os.posix_spawn") and args:
        out = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else event
    elif event == "os.spawn" and len(args) > 1:
        out = os.fsdecode(args[1])
    elif event in ("socket.connect", "socket.sendto") and len(args) > 1:
        a = args[1]
        out = f"{a[0]}:{a[1]}" if isinstance(a, tuple) and len(a) >= 2 else str(a)
    elif event == "urllib.Request" and args:
        out = str(args[0])
    else:
        out = event
    return out if len(out) <= 60 else out[:57] + "..."


__all__ = ["CHILD_EVENTS", "FIX", "IMPORT_MACHINERY", "NETWORK_EVENTS", "TRANSPORT", "what"]
