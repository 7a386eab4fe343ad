"""Test double of ``torch_neuronx.profiling`` (see tests/fakes/README.md).

``NeuronConfig`` is a ``torch._C._profiler._ExperimentalConfig`` (so ``torch.profiler.profile`` accepts it
as ``experimental_config``) that records its settings. While a profiler is recording, each call of a
compiled graph writes, into ``output_dir``, the graph's NEFF and a device trace paired by one numeric hash:
``<hash>.neff`` and ``<hash>.ntff`` [doc: the trace, the NEFF and the NTFF are paired by the same numeric
hash; the file names are a guess]. The NTFF here is ``NTFF`` + JSON (fake, but the pairing is real).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch._C._profiler import _ExperimentalConfig

_ACTIVE: list[NeuronConfig] = []


class NeuronConfig(_ExperimentalConfig):
    """TorchNeuron's profiler settings: device and runtime streams, the NeuronCores to capture, whether
    device time is correlated back to operators, and where the device files go."""

    def __init__(self, output_dir: str = "./neuron_profile", device_streams: bool = True,
                 runtime_streams: bool = True, capture_cores: tuple[int, ...] = (0,),
                 correlate_device_time: bool = True):
        super().__init__()
        self.output_dir = str(output_dir)
        self.device_streams = device_streams
        self.runtime_streams = runtime_streams
        self.capture_cores = tuple(capture_cores)
        self.correlate_device_time = correlate_device_time
        self.written: dict[str, int] = {}
        _ACTIVE[:] = [self]

    def settings(self) -> dict:
        return {"output_dir": self.output_dir, "device_streams": self.device_streams,
                "runtime_streams": self.runtime_streams, "capture_cores": list(self.capture_cores),
                "correlate_device_time": self.correlate_device_time}


def numeric_hash(key: str) -> int:
    return int(key[:12], 16)


def _on_graph_call(key: str) -> None:
    if not _ACTIVE or not torch._C._autograd._profiler_enabled():
        return
    cfg = _ACTIVE[0]
    from torch_neuronx import _ACTIVE_GRAPHS

    h = numeric_hash(key)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg.written[key] = cfg.written.get(key, 0) + 1
    (out / f"{h}.neff").write_bytes(_ACTIVE_GRAPHS[key])
    events = {"hash": h, "neff_key": key, "cores": list(cfg.capture_cores), "calls": cfg.written[key],
              "pid": os.getpid(), "events": [{"name": "fake_device_exec", "core": c, "dur_us": 1.0}
                                              for c in cfg.capture_cores]}
    (out / f"{h}.ntff").write_bytes(b"NTFF" + json.dumps(events).encode())
