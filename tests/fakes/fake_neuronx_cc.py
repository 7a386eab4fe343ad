"""Test double of the `neuronx-cc` command line (run through tests/fakes/bin/neuronx-cc).

Standard library only: it must never import torch, and any python3 can run it.

    neuronx-cc --version
    neuronx-cc compile <model dir | hlo file> --framework XLA --target trn1 [flags] --output f.neff

Writes a NEFF-shaped file (1024-byte header + gzip'd tar payload) at --output and a log at --logfile
(default `log-neuron-cc.txt` in the current directory). Every log line is also echoed to stdout.
Behaviour switches are environment variables; tests/fakes/README.md documents them and the exact
log lines of every mode. All log text is our own wording, shaped after the formats described in
/work/shared/neuron-toolchain.md.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import shlex
import signal
import struct
import sys
import tarfile
import time
import uuid

COMPILER_VERSION = "2.30.4217.0+5e1f0c2a"  # keep equal to neuron_sdk/neuronxcc/__init__.py
# FAKE_NEURONX_CC_VERSION: the version this executable reports and writes into NEFFs (a compiler on PATH
# that differs from the installed neuronxcc package, or a new compiler build with unchanged metadata).
COMPILER_VERSION = os.environ.get("FAKE_NEURONX_CC_VERSION", "").strip() or COMPILER_VERSION
NEFF_HEADER = struct.Struct("<QQQQQ128sI32s16s256sI64sQI468s")
assert NEFF_HEADER.size == 1024

TARGETS = ("trn1", "trn1n", "trn2", "inf2")
LOG_FORMATS = ("pass", "summary", "verbose", "old")
FAIL_MODES = ("xcg815", "eoom", "evrf", "euoc", "internal", "transient", "sigkill", "hang", "nonutf8")
# Invented pass names (the fake's own): used by the verbose and old log formats.
PASSES = ("HloImport", "OpLowering", "OperatorFusion", "InstructionScheduling",
          "MemoryAllocation", "CodeGeneration", "NeffPackaging")
FAIL_AFTER_PASS = 3  # compile errors are reported after this many passes ran
CRASH_AFTER_PASS = 2  # sigkill / hang happen after this many passes ran

# Flags that take a value ("--flag value" and "--flag=value" are the same flag; last one wins).
VALUE_FLAGS = {
    "--framework", "--target", "--output", "--logfile", "--verbose", "--optlevel", "--model-type",
    "--auto-cast", "--auto-cast-type", "--lnc", "--logical-nc-config", "--pipeline",
    "--distribution-strategy", "--enable-internal-neff-wrapper", "-O",
}
ALIASES = {"-O": "--optlevel", "--logical-nc-config": "--lnc"}
# Values checked late (after the fake compile time), like the real compiler failing late.
ENUM_VALUES = {
    "--target": TARGETS,
    "--optlevel": ("1", "2", "3"),
    "--model-type": ("generic", "transformer", "unet-inference", "cnn-training"),
    "--auto-cast": ("none", "matmult", "all"),
    "--auto-cast-type": ("bf16", "fp16", "tf32", "fp8_e4m3"),
    "--lnc": ("1", "2"),
}

EXIT_COMPILE_ERROR = 1
EXIT_USAGE = 2
EXIT_TRANSIENT = 70


class UsageError(Exception):
    pass


def _ts() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Log:
    """Writes bytes to the log file and echoes them to stdout, flushing every write."""

    def __init__(self, path: str):
        self.path = path
        self.file = open(path, "wb")
        self.open_dots = False
        self.pid = os.getpid()

    def raw(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        out = sys.stdout.buffer
        out.write(data)
        out.flush()

    def line(self, text, *, bytes_line: bytes | None = None) -> None:
        if self.open_dots:
            self.raw(b"\n")
            self.open_dots = False
        self.raw((bytes_line if bytes_line is not None else text.encode("utf-8")) + b"\n")

    def dot(self) -> None:
        self.raw(b".")
        self.open_dots = True

    def info(self, msg: str) -> None:
        self.line(f"{_ts()} INFO {self.pid} [neuronx-cc]: {msg}")

    def error(self, msg: str) -> None:
        self.line(f"{_ts()} ERROR {self.pid} [neuronx-cc]: {msg}")

    def close(self) -> None:
        if self.open_dots:
            self.raw(b"\n")
            self.open_dots = False
        self.file.close()


# --------------------------------------------------------------------------- argument parsing

def parse_compile_args(args: list[str]) -> tuple[dict, list[str]]:
    """Returns ({flag: value or True}, positionals). Unknown flags are kept and otherwise ignored."""
    opts: dict = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
        elif arg.startswith("-O") and len(arg) > 2:
            name, value = "-O", arg[2:]
        elif arg in VALUE_FLAGS:
            if i >= len(args):
                raise UsageError(f"argument {arg}: expected one value")
            name, value = arg, args[i]
            i += 1
        elif arg.startswith("-") and arg != "-":
            name, value = arg, True
            # An unknown "--flag value": once the input is known, a following non-flag word is
            # taken as this flag's value.
            if positionals and i < len(args) and not args[i].startswith("-"):
                value = args[i]
                i += 1
        else:
            positionals.append(arg)
            continue
        opts[ALIASES.get(name, name)] = value
    return opts, positionals


# --------------------------------------------------------------------------- input and NEFF

def read_input(path: str) -> tuple[bytes, str, list[str]]:
    """Returns (hlo bytes, hlo folder, weight files to pack). Raises OSError when missing."""
    if os.path.isdir(path):
        folder = path
        name = "graph.hlo"
        meta_path = os.path.join(folder, "metadata.json")
        meta = {}
        if os.path.exists(meta_path):
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            name = meta.get("model_files", name)
        hlo_path = os.path.join(folder, name)
    else:
        folder = os.path.dirname(path) or "."
        hlo_path = path
        meta_path = os.path.join(folder, "metadata.json")
        meta = {}
        if os.path.exists(meta_path):
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
    with open(hlo_path, "rb") as f:
        hlo = f.read()
    weights = [os.path.join(folder, rel) for rel in (meta.get("weights") or {}).values()]
    return hlo, folder, weights


def hlo_lines(hlo: bytes) -> list[str]:
    return hlo.decode("utf-8", "replace").splitlines()


def count_ops(hlo: bytes) -> int:
    return sum(1 for line in hlo_lines(hlo) if line.startswith("op "))


def module_name(hlo: bytes) -> str:
    for line in hlo_lines(hlo):
        if line.startswith("HloModule "):
            return line.split()[1]
    return "graph"


def inline_weights(hlo: bytes) -> bool:
    return any(line.startswith("param ") and line.rstrip().endswith(" inline")
               for line in hlo_lines(hlo))


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def build_neff(hlo: bytes, weights: list[str], target: str, lnc: int, flags: list[str]) -> bytes:
    ops = [line for line in hlo_lines(hlo) if line.startswith("op ")]
    name = module_name(hlo)
    digest = hashlib.sha256(hlo + "\0".join(flags).encode()).digest()
    meta = {
        "producer": "fake neuronx-cc (neuron-build test double)",
        "compiler_version": COMPILER_VERSION,
        "module": name,
        "target": target,
        "lnc": lnc,
        "op_count": len(ops),
        "flags": flags,
        "weights_inlined": bool(weights),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _tar_add(tar, "neff.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        _tar_add(tar, "sg00/ops.txt", ("\n".join(ops) + "\n").encode())
        # "instructions": deterministic bytes, 64 per op (at least 64)
        blob = (digest * 2) * max(1, len(ops))
        _tar_add(tar, "sg00/instructions.bin", blob)
        for path in weights:
            with open(path, "rb") as f:
                _tar_add(tar, "weights/" + os.path.basename(path), f.read())
    payload = io.BytesIO()
    with gzip.GzipFile(fileobj=payload, mode="wb", mtime=0, compresslevel=1) as gz:
        gz.write(raw.getvalue())
    data = payload.getvalue()
    header = NEFF_HEADER.pack(
        1,                                   # pkg_version [guess]
        NEFF_HEADER.size,                    # header_size
        len(data),                           # data_size
        2,                                   # neff_version_major
        0,                                   # neff_version_minor [guess]
        COMPILER_VERSION.encode(),           # neff_build_version (NUL padded)
        lnc,                                 # num_tpb [guess: = lnc]
        hashlib.sha256(data).digest(),       # hash
        uuid.uuid4().bytes,                  # uuid: random, so NEFF bytes differ per compile
        name.encode()[:256],                 # name
        lnc,                                 # requested_tpb_count [guess]
        b"",                                 # tpb_per_node
        0,                                   # feature_bits
        lnc,                                 # lnc_size
        b"",                                 # padding
    )
    return header + data


# --------------------------------------------------------------------------- env switches

def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def record_call(argv: list[str], fail: str | None) -> None:
    path = _env("FAKE_NEURONX_CC_CALLS")
    if not path:
        return
    record = {
        "argv": argv,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "time": time.time(),
        "fail": fail,
        "NEURON_CC_FLAGS": os.environ.get("NEURON_CC_FLAGS"),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def bump_counter(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = os.read(fd, 64).strip()
        n = int(data or b"0") + 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(n).encode())
        return n
    finally:
        os.close(fd)


def choose_failure() -> str | None:
    mode = _env("FAKE_NEURONX_CC_FAIL") or None
    if mode is not None and mode not in FAIL_MODES:
        raise UsageError(f"fake neuronx-cc: unknown FAKE_NEURONX_CC_FAIL={mode!r}; one of {FAIL_MODES}")
    times = _env("FAKE_NEURONX_CC_FAIL_TIMES")
    if not times:
        return mode
    counter = _env("FAKE_NEURONX_CC_COUNTER")
    if not counter:
        raise UsageError("fake neuronx-cc: FAKE_NEURONX_CC_FAIL_TIMES needs FAKE_NEURONX_CC_COUNTER")
    n = bump_counter(counter)
    if n <= int(times):
        return mode or "transient"
    return None


# --------------------------------------------------------------------------- failure texts

def fail_lines(mode: str, log: Log, ops: list[str], target: str) -> int:
    """Writes the diagnostic lines of a compile failure; returns the exit status."""
    if mode == "xcg815":
        log.line(f"{_ts()} [XCG815]  Estimated peak HBM usage (22.84) exceeds 16GB. The graph does "
                 f"not fit one NeuronCore; use a smaller bucket or shard the model.")
        return EXIT_COMPILE_ERROR
    if mode == "eoom":
        log.error("[NCC_EOOM001] Out of device memory: this graph needs about 22.84 GB of HBM and "
                  "a NeuronCore has 16 GB. Use a smaller bucket or more tensor parallelism.")
        return EXIT_COMPILE_ERROR
    if mode == "evrf":
        log.error("[NCC_EVRF007] Compiler generated too many instructions (6888787); the limit "
                  "is 5000000. Split the graph or compile smaller buckets.")
        return EXIT_COMPILE_ERROR
    if mode == "euoc":
        op = ops[-1].split()[2] if ops and len(ops[-1].split()) > 2 else "custom-call"
        log.error(f"[NCC_EUOC002] The operator {op} has no implementation for {target}; "
                  f"rewrite it or keep it on the CPU.")
        return EXIT_COMPILE_ERROR
    if mode == "internal":
        log.error("Internal compiler error in pass OperatorFusion; please report it with this log.")
        for text in (
            "Traceback (most recent call last):",
            '  File "/opt/fake-neuronx-cc/neuronxcc/driver/Pipeline.py", line 214, in run',
            "    stage.execute(state)",
            '  File "/opt/fake-neuronx-cc/neuronxcc/passes/OperatorFusion.py", line 87, in execute',
            "    assert layout is not None, 'fused tensor lost its layout'",
            "AssertionError: fused tensor lost its layout",
        ):
            log.line(text)
        return EXIT_COMPILE_ERROR
    if mode == "transient":
        log.error("A compiler worker process ended unexpectedly; the compile was abandoned.")
        return EXIT_TRANSIENT
    raise AssertionError(mode)


def validation_error(opts: dict) -> str | None:
    for flag, allowed in ENUM_VALUES.items():
        value = opts.get(flag)
        if value is None:
            continue
        if value is True or value not in allowed:
            shown = "" if value is True else value
            return (f"Invalid value '{shown}' for {flag}; expected one of: "
                    f"{', '.join(allowed)}")
    if opts.get("--lnc") == "2" and opts.get("--target", "trn1") != "trn2":
        return "--lnc 2 is only available when --target is trn2"
    return None


# --------------------------------------------------------------------------- main

def write_footer(log: Log, fmt: str, ok: bool, started: float, n_ops: int) -> None:
    if fmt == "summary":
        if ok:
            log.line(f"{_ts()} INFO {log.pid} NEFF op count: {n_ops}")
        log.line(f"{_ts()} INFO {log.pid} Compile time: {time.monotonic() - started:.1f} sec")
        if ok:
            log.line(f"{_ts()} INFO {log.pid} Compiler status: SUCCESS")
        else:
            log.line(f"{_ts()} INFO {log.pid} Compiler status: FAILED")
    else:
        log.line("Compiler status PASS" if ok else "Compiler status ERROR")


def run_pass(log: Log, fmt: str, index: int, seconds: float) -> None:
    name = PASSES[index]
    begin = time.monotonic()
    if fmt == "verbose":
        log.line(f"{_ts()} INFO {log.pid} [pipeline]: Running {name}")
    if seconds > 0:
        time.sleep(seconds)
    spent = time.monotonic() - begin
    if fmt == "pass":
        log.dot()
    elif fmt == "verbose":
        log.line(f"{_ts()} INFO {log.pid} [pipeline]: {name} finished after {spent:.3f} seconds")
    elif fmt == "old":
        log.line(f"{_ts()} INFO {log.pid} [job.{name}]: Exit time region: delta={spent:.3f}s")


def compile_main(args: list[str]) -> int:
    started = time.monotonic()
    opts, positionals = parse_compile_args(args)
    fmt = _env("FAKE_NEURONX_CC_LOG_FORMAT", "pass") or "pass"
    if fmt not in LOG_FORMATS:
        raise UsageError(f"fake neuronx-cc: unknown FAKE_NEURONX_CC_LOG_FORMAT={fmt!r}; one of {LOG_FORMATS}")
    if len(positionals) != 1:
        raise UsageError("compile: expected exactly one input (an HLO file or model folder), got "
                         f"{len(positionals)}")
    fail = choose_failure()
    record_call(["neuronx-cc", "compile"] + args, fail)
    sleep_s = float(_env("FAKE_NEURONX_CC_SLEEP", "0") or 0)
    mem_mb = int(_env("FAKE_NEURONX_CC_MEM_MB", "0") or 0)
    ballast = bytearray(b"\x01") * (mem_mb << 20) if mem_mb else None  # touched pages

    target = opts.get("--target", "trn1")
    target = target if isinstance(target, str) else ""
    output = opts.get("--output", "file.neff")
    logfile = opts.get("--logfile")
    logfile = logfile if isinstance(logfile, str) else "log-neuron-cc.txt"
    try:
        log = Log(logfile)
    except OSError as exc:
        sys.stderr.write(f"neuronx-cc: error: cannot open the log file {logfile}: {exc}\n")
        return EXIT_COMPILE_ERROR
    log.info("Invoked as: " + shlex.join(["neuronx-cc", "compile"] + args))
    per_pass = sleep_s / len(PASSES)
    try:
        hlo, _folder, weight_files = read_input(positionals[0])
    except OSError as exc:
        log.error(f"Cannot read the input {positionals[0]}: {exc.strerror or exc}")
        write_footer(log, fmt, False, started, 0)
        log.close()
        return EXIT_COMPILE_ERROR
    ops = [line for line in hlo_lines(hlo) if line.startswith("op ")]
    if fmt == "summary":
        log.line(f"{_ts()} INFO {log.pid} Compiling {os.path.basename(positionals[0].rstrip('/'))} "
                 f"for {target}")

    for index in range(len(PASSES)):
        if fail == "sigkill" and index == CRASH_AFTER_PASS:
            if ballast is None:
                ballast = bytearray(b"\x01") * (50 << 20)
            log.close()
            os.kill(os.getpid(), signal.SIGKILL)
        if fail == "hang" and index == CRASH_AFTER_PASS:
            limit = float(_env("FAKE_NEURONX_CC_HANG_MAX", "600") or 600)
            end = time.monotonic() + limit
            while time.monotonic() < end:
                time.sleep(0.2)
            log.error("fake hang ended after FAKE_NEURONX_CC_HANG_MAX seconds")
            write_footer(log, fmt, False, started, 0)
            log.close()
            return EXIT_COMPILE_ERROR
        if index == FAIL_AFTER_PASS and fail in ("xcg815", "eoom", "evrf", "euoc", "internal", "transient"):
            rc = fail_lines(fail, log, ops, target)
            write_footer(log, fmt, False, started, 0)
            log.close()
            return rc
        run_pass(log, fmt, index, per_pass)

    problem = validation_error(opts)
    if problem:
        log.error(problem)
        write_footer(log, fmt, False, started, 0)
        log.close()
        return EXIT_COMPILE_ERROR

    lnc = int(opts.get("--lnc", "1"))
    flags = args[:]
    weights = weight_files if inline_weights(hlo) else []
    try:
        neff = build_neff(hlo, weights, target, lnc, flags)
        with open(output, "wb") as f:
            f.write(neff)
    except OSError as exc:
        log.error(f"Cannot write the NEFF {output}: {exc.strerror or exc}")
        write_footer(log, fmt, False, started, 0)
        log.close()
        return EXIT_COMPILE_ERROR
    log.info(f"Wrote {output} ({len(neff)} bytes)")
    if fail == "nonutf8":
        log.line("", bytes_line=f"{_ts()} INFO {log.pid} [neuronx-cc]: scratch name ".encode()
                 + b"tmp\xff\xfe\xc3(.bin")
    write_footer(log, fmt, True, started, len(ops))
    log.close()
    del ballast
    return 0


USAGE = """usage: neuronx-cc [--version] <command> [<args>]

commands:
  compile   compile an XLA HLO graph into a NEFF  (fake: neuron-build test double)
"""


def main(argv: list[str]) -> int:
    try:
        if not argv or argv[0] in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0 if argv else EXIT_USAGE
        if argv[0] in ("--version", "-V", "version"):
            sys.stdout.write(f"NeuronX Compiler version {COMPILER_VERSION}\n\n"
                             f"Python version {sys.version.split()[0]}\n")
            return 0
        if argv[0] == "compile":
            if any(a in ("-h", "--help") for a in argv[1:]):
                sys.stdout.write("usage: neuronx-cc compile <input> --framework XLA --target "
                                 "{trn1,trn1n,trn2,inf2} [--output F] [--logfile F] [flags]\n")
                return 0
            return compile_main(argv[1:])
        raise UsageError(f"unknown command {argv[0]!r}")
    except UsageError as exc:
        sys.stderr.write(f"neuronx-cc: error: {exc}\n{USAGE}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
