"""The files a successful Neuron trace leaves, turned into the artifact: the NEFF copied (its header read),
the compiler log and command line kept, and the op count (the log first, then the HLO in the workdir, then
``torch_neuronx.analyze``).

Facts: the NEFF in the workdir is ``graph.neff`` [doc]; ``command.txt`` [seen]; ``--logfile=<absolute
path>`` pins the log (default ``log-neuron-cc.txt`` in the compiler's cwd) [doc]; ``torch_neuronx.analyze``
returns ``supported_operators`` counts and ``unsupported_operators`` [doc].
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import CompileFailed
from neuron_build.compilers.neuron.failure import log_digest
from neuron_build.compilers.neuron.neuronx_log import LogSummary, parse_log
from neuron_build.compilers.neuron.trace import signature_params
from neuron_build.status import Status

#: The compiler log's name in the workdir (neuronx-cc's default name) [doc].
LOG_NAME = "log-neuron-cc.txt"
#: op_count_source values, in the order they are tried.
SOURCE_LOG = "neuronx-cc log"
SOURCE_HLO = "HLO instruction count"
SOURCE_ANALYZE = "torch_neuronx.analyze operator counts"


def analyze_op_count(model, example_inputs, workdir: Path) -> tuple[int, dict[str, Any]]:
    """Op count from ``torch_neuronx.analyze`` [doc]: the sum of ``supported_operators`` counts plus one
    per ``unsupported_operators`` entry. Returns (count, report for the manifest).

    Raises:
        Exception: whatever analyze raises; ValueError when its result has no operator counts.
    """
    import torch_neuronx

    kwargs: dict[str, Any] = {}
    if "compiler_workdir" in signature_params(torch_neuronx.analyze):
        workdir.mkdir(parents=True, exist_ok=True)
        kwargs["compiler_workdir"] = str(workdir)
    report = torch_neuronx.analyze(model, example_inputs, **kwargs)
    supported = report.get("supported_operators") if isinstance(report, dict) else None
    if not isinstance(supported, dict):
        raise ValueError("torch_neuronx.analyze returned no supported_operators counts")
    unsupported = report.get("unsupported_operators") or []
    count = sum(int(v) for v in supported.values()) + len(unsupported)
    kinds = sorted({u.get("kind", "?") for u in unsupported if isinstance(u, dict)})
    return count, {"supported_operators": dict(sorted(supported.items())), "unsupported_operators": kinds,
                   "support_percentage": report.get("support_percentage")}


def _copy_neff(src: Path, dst: Path) -> dict[str, Any]:
    from neuron_build.compilers.neuron.neff import NeffError, read_neff_header

    if not src.is_file():
        where = f"{src.parent.name}/{src.name}" if src.parent.name.startswith("_tp") else src.name
        raise CompileFailed(Status.ERROR, f"the compile succeeded but left no {where} in the compiler workdir")
    shutil.copyfile(src, dst)
    try:
        return read_neff_header(dst).to_json()
    except NeffError as e:
        raise CompileFailed(Status.ERROR, f"the compiled {dst.name} is not a valid NEFF: {e}") from e


def _find_log(rank_dir: Path, tp_degree: int = 1) -> Path | None:
    """The compiler log of one compile: ``<rank dir>/log-neuron-cc.txt``; for TP degree 1 also the
    worker's cwd, where neuronx-cc writes it when ``--logfile`` did not take effect [doc: default name]."""
    cands = [rank_dir / LOG_NAME] + ([Path.cwd() / LOG_NAME] if tp_degree == 1 else [])
    return next((c for c in cands if c.is_file()), None)



def save_model(traced: Any, out: Path, workdir: Path, tp_degree: int) -> list[tuple[str, Path]]:
    """Save what the trace returned into ``out`` (``model.pt``, or ``tp_<r>.pt`` per rank through
    ``parallel_model_save``); returns (file stem, compiler workdir) per rank."""
    if tp_degree > 1:
        from neuronx_distributed.trace import parallel_model_save
        parallel_model_save(traced, str(out))
        return [(f"tp_{r}", workdir / f"_tp{r}") for r in range(tp_degree)]
    import warnings

    import torch

    with warnings.catch_warnings():  # torch 2.13 marks jit.save deprecated; Neuron documents it [doc]
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(traced, str(out / "model.pt"))
    return [("model", workdir)]


def collect_ranks(ranks: list[tuple[str, Path]], out: Path, api: str,
                  warnings: list[str]) -> tuple[dict, dict, dict, list[LogSummary | None]]:
    """Copy each rank's NEFF (header checked), compiler log (parsed) and command line into ``out``.

    Returns:
        (files: stem -> {"model", "neff", "log", "command"} file names, logs: log file -> its digest,
        neffs: NEFF file -> its header, the parsed log of each rank or None). A rank without a log adds
        a line to ``warnings``.

    Raises:
        CompileFailed: ``ERROR`` when a rank's ``.pt`` or NEFF is missing, or the NEFF is not valid.
    """
    files: dict[str, dict[str, str | None]] = {}
    logs: dict[str, dict[str, Any]] = {}
    neffs: dict[str, dict[str, Any]] = {}
    summaries: list[LogSummary | None] = []
    for stem, rank_dir in ranks:
        pt = f"{stem}.pt"
        if not (out / pt).is_file():
            raise CompileFailed(Status.ERROR, f"{api} returned but {pt} was not written")
        neff_name = f"{stem}.neff"
        neffs[neff_name] = _copy_neff(rank_dir / "graph.neff", out / neff_name)
        log_name = "compile.log" if stem == "model" else f"{stem}.compile.log"
        log_src = _find_log(rank_dir, len(ranks))
        summary = None
        if log_src is not None:
            shutil.copyfile(log_src, out / log_name)
            summary = parse_log((out / log_name).read_bytes())
            logs[log_name] = log_digest(summary)
        else:
            warnings.append(f"no compiler log found in {rank_dir} (looked for {LOG_NAME})")
        summaries.append(summary)
        cmd_name = "command.txt" if stem == "model" else f"{stem}.command.txt"
        if (rank_dir / "command.txt").is_file():
            shutil.copyfile(rank_dir / "command.txt", out / cmd_name)
        files[stem] = {"model": pt, "neff": neff_name, "log": log_name if log_src else None,
                       "command": cmd_name if (out / cmd_name).exists() else None}
    return files, logs, neffs, summaries


__all__ = ["LOG_NAME", "SOURCE_ANALYZE", "SOURCE_HLO", "SOURCE_LOG", "analyze_op_count", "collect_ranks",
           "save_model"]
