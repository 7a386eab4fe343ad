"""Build one target and SIGKILL this process at its K-th file-system write after the compile worker
has exited (``python crashpoint.py CONFIG TARGET K``; K = 0 never kills and lists the writes).

The writes are seen through Python's audit hooks: opening a file for writing, rename/replace, mkdir,
remove, rmdir, rmtree, in this (the builder's) process, from the moment ``Builder._finish`` starts
(artifact, manifest, publish, records, staging clean-up, lock release). Writes to the build log are not
counted. Prints a JSON line ``{"status": ..., "writes": [...]}`` when it is not killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from neuron_build.build import Builder
from neuron_build.config import load_project
from neuron_build.log import configure

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MUTATIONS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.link",
             "os.symlink"}


def main() -> None:
    cfg, target, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    project = load_project(cfg)
    configure(project.state_dir / "build.log", json_lines=True, quiet=True)
    b = Builder(project)
    writes: list[str] = []
    armed = [False]

    def hook(event: str, args: tuple) -> None:
        if not armed[0]:
            return
        if event == "open":
            path, _mode, flags = args
            if not isinstance(flags, int) or not flags & WRITE_FLAGS or str(path).endswith("build.log"):
                return
        elif event not in MUTATIONS:
            return
        writes.append(f"{event} {os.path.basename(str(args[0]))}")
        if len(writes) == k:
            os.kill(os.getpid(), signal.SIGKILL)

    finish = Builder._finish

    def armed_finish(self, *a, **kw):
        armed[0] = True
        return finish(self, *a, **kw)

    Builder._finish = armed_finish
    sys.addaudithook(hook)
    out = b.build(b.by_id[target])
    armed[0] = False
    print(json.dumps({"status": out.status, "writes": writes}), flush=True)


if __name__ == "__main__":
    main()
