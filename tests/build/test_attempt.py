"""One compile attempt without processes: the classification of a worker's run (each status with its exact
reason text), the one full-disk conversion, and the builder driven through a fake executor."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from neuron_build.build.attempt import (
    DiskFull,
    Outcome,
    as_status,
    classify,
    disk_full,
    disk_full_note,
    failure_log,
    last_line,
)
from neuron_build.build.builder import Builder
from neuron_build.build.executor import NOT_RUN, WORKER_LOG, CompileRun
from neuron_build.project.config import load_project
from neuron_build.status import BuildResult, Status
from neuron_build.workspace import Workspace

GiB = 2**30


def run(exit_code=1, *, timed_out=False, peak=0, log=b"", result=None, error=None, compiler_log=None) -> CompileRun:
    return CompileRun(exit_code=exit_code, wall_s=1.5, peak_rss_bytes=peak, timed_out=timed_out, log=log,
                      result=result, error=error, compiler_log=compiler_log)


def verdict(r: CompileRun, timeout_s: float = 30, free: int | None = 10 * GiB, folder: str = "/s/stage1"):
    c = classify(r, timeout_s, free, folder)
    return c.status, c.reason


# -- each status and its reason ----------------------------------------------------------------------

def test_pass_needs_exit_0_and_a_result():
    assert verdict(run(0, result={"op_count": 3})) == (Status.PASS, "")
    assert verdict(run(0, result={})) == (Status.PASS, "")
    # exit 0 without result.json is a worker error naming the last log line
    assert verdict(run(0, log=b"started\ndone?\n")) == (Status.ERROR, "worker exited with status 0: done?")


def test_timeout_wins_over_everything():
    assert verdict(run(None, timed_out=True), timeout_s=4) == (Status.TIMEOUT, "stopped after 4 s (timeout_s under [build])")
    assert verdict(run(-9, timed_out=True), timeout_s=12.5) == (
        Status.TIMEOUT, "stopped after 12.5 s (timeout_s under [build])")
    assert verdict(run(0, timed_out=True, result={}), timeout_s=600)[0] == Status.TIMEOUT
    # a timeout is never turned into a full disk
    assert verdict(run(-9, timed_out=True, log=b"No space left on device"), timeout_s=4, free=0) == (
        Status.TIMEOUT, "stopped after 4 s (timeout_s under [build])")


def test_killed_by_a_signal():
    assert verdict(run(-9, peak=3 * GiB)) == (
        Status.KILLED, "killed by SIGKILL (usually the kernel's out-of-memory killer); peak memory 3.00 GiB")
    assert verdict(run(-15, peak=GiB // 2)) == (Status.KILLED, "killed by SIGTERM; peak memory 0.50 GiB")
    # the signal wins over what error.json says
    assert verdict(run(-6, error={"status": "ERROR", "reason": "x"})) == (
        Status.KILLED, "killed by SIGABRT; peak memory 0.00 GiB")


def test_status_reported_by_the_worker():
    assert verdict(run(1, error={"status": "ERROR", "reason": "RuntimeError: boom"})) == (
        Status.ERROR, "RuntimeError: boom")
    assert verdict(run(3, error={"status": "TOOLCHAIN_MISSING", "reason": "no neuronx-cc"})) == (
        Status.TOOLCHAIN_MISSING, "no neuronx-cc")
    assert verdict(run(1, error={"status": "ERROR"})) == (Status.ERROR, "")
    # the worker's status wins over exit status 70
    assert verdict(run(70, error={"status": "TRANSIENT", "reason": "neuronx-cc: retry"})) == (
        Status.TRANSIENT, "neuronx-cc: retry")
    assert verdict(run(70, error={"status": "ERROR", "reason": "bad"})) == (Status.ERROR, "bad")
    # an empty status does not count
    assert verdict(run(2, error={"status": "", "reason": "r"}, log=b"tail")) == (
        Status.ERROR, "worker exited with status 2: tail")


def test_compiler_killed_as_reported_by_the_worker():
    err = {"status": "KILLED", "reason": "neuronx-cc killed by SIGKILL",
           "details": {"compiler_peak_rss_bytes": 5 * GiB}}
    assert verdict(run(137, peak=6 * GiB, error=err)) == (
        Status.KILLED, "neuronx-cc killed by SIGKILL; peak memory 6.00 GiB (neuronx-cc 5.00 GiB)")
    err = {"status": "KILLED", "reason": "neuronx-cc killed by SIGKILL", "details": {}}
    assert verdict(run(137, peak=GiB, error=err)) == (Status.KILLED, "neuronx-cc killed by SIGKILL; peak memory 1.00 GiB")
    err = {"status": "KILLED", "reason": "cc died", "details": None}
    assert verdict(run(137, peak=0, error=err)) == (Status.KILLED, "cc died; peak memory 0.00 GiB")


def test_transient_exit_status_70():
    assert verdict(run(70)) == (Status.TRANSIENT, "exit status 70: transient tool failure")
    assert verdict(run(70, error={})) == (Status.TRANSIENT, "exit status 70: transient tool failure")


def test_any_other_exit_is_an_error_with_the_last_log_line():
    assert verdict(run(2, log=b"a\nTraceback\n  ValueError: no  \n\n \n")) == (
        Status.ERROR, "worker exited with status 2: ValueError: no")
    assert verdict(run(1)) == (Status.ERROR, "worker exited with status 1: (empty log)")
    assert verdict(run(None, log=b"x")) == (Status.ERROR, "worker exited with status None: x")
    assert verdict(run(1, log=b"y" * 400))[1] == "worker exited with status 1: " + "y" * 300
    assert last_line(b"\xff\xfe bad\n") == "\ufffd\ufffd bad"


def test_a_full_disk_turns_a_failure_into_an_error_saying_so():
    # the log says so (free space known)
    assert verdict(run(-6, log=b"RuntimeError: [Errno 28] No space left on device"), free=123456789) == (
        Status.ERROR, ("no space left on device in /s/stage1 (123456789 bytes free) while compiling; free space "
                       "and build again (killed by SIGABRT; peak memory 0.00 GiB)"))
    assert verdict(run(1, log=b"write failed: ENOSPC", error={"status": "ERROR", "reason": "save failed"}),
                   free=None) == (
        Status.ERROR, ("no space left on device in /s/stage1 while compiling; free space and build again "
                       "(save failed)"))
    # less than 1 MiB free, whatever the log says
    assert verdict(run(70), free=2**20 - 1) == (
        Status.ERROR, (f"no space left on device in /s/stage1 ({2**20 - 1} bytes free) while compiling; free space "
                       "and build again (exit status 70: transient tool failure)"))
    assert verdict(run(3, error={"status": "TOOLCHAIN_MISSING", "reason": "r"}), free=0)[0] == Status.ERROR
    # exactly 1 MiB free is not full; unknown free space alone is not full
    assert verdict(run(70), free=2**20) == (Status.TRANSIENT, "exit status 70: transient tool failure")
    assert verdict(run(70), free=None) == (Status.TRANSIENT, "exit status 70: transient tool failure")
    # a PASS is never turned into a full disk
    assert verdict(run(0, result={}, log=b"No space left on device"), free=0) == (Status.PASS, "")
    assert disk_full_note(b"ok", 5 * 2**20, "/x") is None


def test_worker_status_strings_become_enums():
    s = as_status("KILLED")
    assert s is Status.KILLED
    assert as_status("SOMETHING_NEW") == "SOMETHING_NEW"
    assert classify(run(1, error={"status": "ERROR", "reason": "r"}), 30).status is Status.ERROR


def test_failure_log_appends_the_compiler_log_under_a_header():
    assert failure_log(run(1, log=b"worker\n")) == b"worker\n"
    r = run(1, log=b"worker\n", error={"status": "ERROR", "details": {"compiler_log": "cc/log-neuron-cc.txt"}},
            compiler_log=b"cc says no\n")
    assert failure_log(r) == b"worker\n\n===== compiler log (cc/log-neuron-cc.txt) =====\ncc says no\n"
    assert failure_log(NOT_RUN) == b""


def test_outcome_ok():
    assert Outcome("t", "k", BuildResult.CACHED).ok and Outcome("t", "k", Status.PASS).ok
    assert Outcome("t", "k", "cached").ok and Outcome("t", "k", "PASS").ok
    for s in (Status.ERROR, Status.KILLED, Status.TIMEOUT, Status.TRANSIENT, Status.TOOLCHAIN_MISSING):
        assert not Outcome("t", "k", s).ok


# -- the one full-disk conversion --------------------------------------------------------------------

def test_disk_full_names_the_stage_and_the_file():
    with pytest.raises(DiskFull) as e, disk_full("publishing", Path("/s/obj")):
        raise OSError(errno.ENOSPC, "No space left on device", "/s/obj/manifest.json.tmp")
    assert str(e.value) == ("no space left on device while publishing (/s/obj/manifest.json.tmp); "
                            "free space and build again")
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(DiskFull) as e, disk_full("writing the manifest", Path("/s/obj")):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    assert str(e.value) == "no space left on device while writing the manifest (/s/obj); free space and build again"
    with pytest.raises(DiskFull) as e, disk_full("taking the key's lock", "/s/locks/k.lock", prefer_filename=False):
        raise OSError(errno.ENOSPC, "No space left on device", "/s/locks/k.lock.owner")
    assert str(e.value) == ("no space left on device while taking the key's lock (/s/locks/k.lock); "
                            "free space and build again")
    where = []
    with pytest.raises(DiskFull) as e, disk_full("preparing the compile", lambda: where[0] if where else "/store"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(e.value) == "no space left on device while preparing the compile (/store); free space and build again"


def test_disk_full_lets_other_errors_through():
    with pytest.raises(PermissionError), disk_full("publishing", "/x"):
        raise PermissionError(errno.EACCES, "denied")
    with pytest.raises(ValueError), disk_full("publishing", "/x"):
        raise ValueError("not an OSError")
    with disk_full("publishing", "/x"):
        pass


# -- the builder through a fake executor (no worker process) -----------------------------------------

class FakeExecutor:
    """Writes ``files`` into the request's out_dir and returns ``run``."""

    def __init__(self, run: CompileRun, files: dict[str, bytes] | None = None):
        self.run_, self.files, self.requests = run, files or {}, []

    def run(self, request, work_dir: Path, log) -> CompileRun:
        self.requests.append(request)
        assert Path(request.work_dir) == work_dir and not any(Path(request.out_dir).iterdir())
        for name, data in self.files.items():
            (Path(request.out_dir) / name).write_bytes(data)
        return self.run_


def test_builder_publishes_what_the_executor_returns(tiny):
    ex = FakeExecutor(run(0, log=b"worker says hi\n", result={"op_count": 7, "op_count_source": "fake"}),
                      {"model.pt": b"weights"})
    b = Builder(Workspace(load_project(tiny)), executor=ex)
    t = b.ws.by_id["other/static/fp32/p1"]
    out = b.build(t)
    assert (out.status, out.compiled, out.ok) == (Status.PASS, True, True)
    assert out.metrics["op_count"] == 7 and out.metrics["attempts"] == 1
    (req,) = ex.requests
    assert req.target == t.id and req.key == out.key and req.backend == "torchscript"
    m = b.ws.store.manifest(out.key)
    assert set(m.files) == {"model.pt"} and set(m.logs) == {WORKER_LOG} and m.metrics.status == "PASS"
    assert b.ws.store.log_file(out.key, WORKER_LOG).read_bytes() == b"worker says hi\n"
    assert json.loads(json.dumps(out.metrics))["status"] == "PASS"
    again = b.build(t)
    assert again.status is BuildResult.CACHED and len(ex.requests) == 1
    assert not list((b.ws.store.root / "staging").iterdir())


def test_builder_records_the_classified_failure(tiny):
    err = {"status": "ERROR", "reason": "boom", "details": {"compiler_log": "cc.log", "hint": 1}}
    ex = FakeExecutor(run(1, log=b"w\n", error=err, compiler_log=b"cc\n"))
    b = Builder(Workspace(load_project(tiny)), executor=ex)
    t = b.ws.by_id["other/static/fp32/p1"]
    out = b.build(t)
    assert (out.status, out.reason, out.compiled) == (Status.ERROR, "boom", True)
    fail = b.ws.store.failure(t.id)
    assert (fail.status, fail.reason, fail.exit_code, fail.attempts_total) == ("ERROR", "boom", 1, 1)
    assert fail.details == {"compiler_log": "cc.log", "hint": 1}
    assert b.ws.store.failure_log(t.id).read_bytes() == b"w\n\n===== compiler log (cc.log) =====\ncc\n"
    assert b.ws.state(t) == "failed"
    b.build(t)
    assert b.ws.store.failure(t.id).attempts_total == 2


def test_transient_failures_are_retried(tiny):
    ex = FakeExecutor(run(70))
    b = Builder(Workspace(load_project(tiny)), executor=ex)
    retries = b.ws.project.config.build.transient_retries
    out = b.build(b.ws.by_id["other/static/fp32/p1"])
    assert out.status == Status.TRANSIENT and out.metrics["attempts"] == retries + 1
    assert len(ex.requests) == retries + 1


def test_a_failure_the_full_disk_kept_from_recording_is_recorded_after_the_clean_up(tiny, monkeypatch):
    b = Builder(Workspace(load_project(tiny)), executor=FakeExecutor(run(1, error={"status": "ERROR", "reason": "boom"})))
    t = b.ws.by_id["other/static/fp32/p1"]
    real, calls, staging = b.ws.store.put_failure, [], b.ws.store.root / "staging"

    def put_failure(record, log):
        calls.append((record.reason, len(list(staging.iterdir()))))  # and how many attempt folders are left
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device", "failure.json")
        real(record, log)

    monkeypatch.setattr(b.ws.store, "put_failure", put_failure)
    out = b.build(t)
    assert (out.status, out.reason) == (Status.ERROR, "boom")
    assert calls == [("boom", 1), ("boom", 0)]  # refused by the full disk, written once the attempt's folder went
    rec = b.ws.store.failure(t.id)
    assert (rec.status, rec.reason, rec.key) == ("ERROR", "boom", b.ws.key(t).key) and b.ws.state(t) == "failed"
    assert not list(staging.iterdir())


def test_no_room_to_prepare_the_compile(tiny, monkeypatch):
    ex = FakeExecutor(run(0, result={}))
    b = Builder(Workspace(load_project(tiny)), executor=ex)

    def full(key):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(b.ws.store, "new_staging", full)
    t = b.ws.by_id["other/static/fp32/p1"]
    out = b.build(t)
    assert out.status == Status.ERROR and not ex.requests
    assert out.reason == (f"no space left on device while preparing the compile ({b.ws.store.location}); "
                          "free space and build again")
    assert out.metrics == {"status": "ERROR", "compile_time_s": 0.0, "peak_rss_bytes": 0, "exit_code": None,
                           "attempts": 1, "reason": out.reason}
