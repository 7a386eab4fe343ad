"""Run one ``neuron-build`` command and SIGKILL this process at its K-th file-system write:
``python crashcli.py K ARGS...`` (K = 0 never kills; it prints the writes as a JSON line on stderr).

Writes are seen through Python's audit hooks (opening a file for writing, rename/replace, link, mkdir,
remove, rmdir, rmtree), counted from the start of the command; writes to the build log are not counted.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from neuron_build import cli

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MUTATIONS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.link",
             "os.symlink"}


def main() -> int:
    k, args = int(sys.argv[1]), sys.argv[2:]
    writes: list[str] = []

    def hook(event: str, a: tuple) -> None:
        if event == "open":
            path, _mode, flags = a
            if not isinstance(flags, int) or not flags & WRITE_FLAGS or str(path).endswith("build.log"):
                return
        elif event not in MUTATIONS:
            return
        writes.append(f"{event} {os.path.basename(str(a[0]))}")
        if len(writes) == k:
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    rc = cli.main(args)
    print(json.dumps({"rc": rc, "writes": writes}), file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
