"""Build one target and SIGKILL this process at its K-th file-system write after the compile worker
has exited: ``python crashpoint.py CONFIG TARGET K REPLAY_DIR``.

K = 0 never kills: it runs the real compile worker, saves the worker's outputs (the staging ``object/``
and ``work/`` folders as they were when the worker exited) into REPLAY_DIR, and prints the list of
writes. K > 0 replays those outputs instead of starting a worker (the compile is not what is under test
here; everything after it is), then kills itself at write K.

The writes are seen through Python's audit hooks: opening a file for writing, rename/replace, mkdir,
remove, rmdir, rmtree, in this (the builder's) process, from the moment the executor's ``run`` returns
(artifact, manifest, publish, records, staging clean-up, memory ledger, lock release). Writes to the
build log are not counted. Prints a JSON line ``{"status": ..., "writes": [...]}`` when not killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.build.executor import WORKER_LOG, CompileRun
from neuron_build.log import configure
from neuron_build.project.config import load_project
from neuron_build.util import read_json
from neuron_build.workspace import Workspace

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MUTATIONS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.link",
             "os.symlink"}


def main() -> None:
    cfg, target, k, replay = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    project = load_project(cfg)
    configure(project.state_dir / "build.log", json_lines=True, quiet=True)
    b = Builder(Workspace(project))
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

    real = b.executor

    class Replay:
        """K = 0: the real executor, its outputs saved into REPLAY_DIR; K > 0: those outputs, no worker."""

        def run(self, request, work_dir: Path, log) -> CompileRun:
            obj = Path(request.out_dir)
            if k == 0:
                run = real.run(request, work_dir, log)
                for name, src in (("object", obj), ("work", work_dir)):
                    shutil.copytree(src, replay / name, dirs_exist_ok=True)
                (replay / "run.json").write_text(json.dumps({"exit_code": run.exit_code, "wall_s": run.wall_s,
                                                             "peak_rss": run.peak_rss_bytes}))
            else:  # the same files as a real run leaves (the staging clean-up removes as many)
                (work_dir / "request.json").write_text(json.dumps(request.to_json(), indent=2))
                shutil.copytree(replay / "object", obj, dirs_exist_ok=True)
                for f in (replay / "work").iterdir():
                    if f.name != "request.json":
                        shutil.copy(f, work_dir / f.name)
                gj = work_dir / "graph.json"  # no worker waits for the graph gate's answer: nothing to ask
                if gj.is_file():
                    doc = json.loads(gj.read_text())
                    gj.write_text(json.dumps({**doc, "asks": False}))
                r = json.loads((replay / "run.json").read_text())
                run = CompileRun(r["exit_code"], r["wall_s"], r["peak_rss"], False,
                                 (work_dir / WORKER_LOG).read_bytes(), result=read_json(work_dir / "result.json"), error=read_json(work_dir / "error.json"))
            armed[0] = True
            return run

    b.executor = Replay()
    sys.addaudithook(hook)
    out = b.build(b.ws.by_id[target])
    armed[0] = False
    print(json.dumps({"status": out.status, "writes": writes}), flush=True)


if __name__ == "__main__":
    main()
