"""AOTInductor CPU packages are tied to the ISA of the host that built them (``-march=native``): the build
host's ISA is in their key, the plan cache notices a change of it, and a load on a host that lacks it is
refused in one line naming both ISAs."""

from __future__ import annotations

import json
import time

import pytest

from neuron_build.cpu_isa import ISA_ENV, features, host_cpu_isa, isa_problem, package_cpu_isa
from neuron_build.project.config import load_project
from neuron_build.project.keys import KeyMaker
from neuron_build.project.matrix import expand


def test_the_host_isa_is_named_as_torch_names_it():
    import torch._inductor.cpu_vec_isa as vec

    assert host_cpu_isa({}) == str(vec.pick_vec_isa()).upper()
    assert host_cpu_isa({ISA_ENV: "avx2"}) == "AVX2"
    assert features("AVX512 AVX512_VNNI") == {"AVX512", "AVX512_VNNI", "AVX2"}
    assert isa_problem("AVX2", "x", host="AVX512") is None
    assert isa_problem("AVX512 AVX512_VNNI AMX_TILE", "x", host="AVX512 AVX512_VNNI") == (
        "x was built for CPU ISA 'AVX512 AVX512_VNNI AMX_TILE' (AOTInductor compiles with -march=native); this host "
        "has 'AVX512 AVX512_VNNI' and lacks AMX_TILE: build it on a host like this one (its key carries the ISA), "
        "or serve it on a host with AVX512 AVX512_VNNI AMX_TILE")


def test_the_isa_is_in_the_key_of_inductor_cpu_targets_only(tiny):
    p = load_project(tiny)
    t = expand(p)[0]
    avx2 = KeyMaker(p, backend="inductor", environ={ISA_ENV: "AVX2"})
    amx = KeyMaker(p, backend="inductor", environ={ISA_ENV: "AVX512 AVX512_VNNI AMX_TILE"})
    assert avx2.details(t)["compiler"]["cpu_isa"] == "AVX2"
    assert avx2.key(t).key != amx.key(t).key
    assert avx2.key(t).hashes["compiler"] != amx.key(t).hashes["compiler"]
    assert {c for c in avx2.key(t).hashes if avx2.key(t).hashes[c] != amx.key(t).hashes[c]} == {"compiler"}
    here = KeyMaker(p, backend="inductor", environ={})
    assert here.details(t)["compiler"]["cpu_isa"] == host_cpu_isa({})
    ts_a = KeyMaker(p, backend="torchscript", environ={ISA_ENV: "AVX2"})
    ts_b = KeyMaker(p, backend="torchscript", environ={ISA_ENV: "AVX512"})
    assert "cpu_isa" not in ts_a.details(t)["compiler"] and ts_a.key(t).key == ts_b.key(t).key


@pytest.fixture(scope="module")
def pulled_aoti(tmp_path_factory):
    """A folder as ``neuron-build pull`` writes it, holding one real AOTInductor CPU package."""
    import torch

    from neuron_build.util import file_sha256

    dest = tmp_path_factory.mktemp("pulled") / "serve"
    (dest / "b1").mkdir(parents=True)
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3).eval()
    ep = torch.export.export(m, (torch.randn(1, 4),), strict=False)
    pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(dest / "b1" / "model.pt2"))
    ent = {"sha256": file_sha256(pkg), "size": (dest / "b1" / "model.pt2").stat().st_size}
    doc = {"format": 1, "release": "r-00000000000000aa", "model": "lin", "channel": "prod", "dtype": "fp32",
           "profile": "p1", "backend": "inductor", "hardware_target": "cpu", "dims": ["batch"],
           "inputs": [{"name": "x", "shape": ["batch", 4], "dtype": "fp32"}], "truncate": False,
           "convert_dtypes": False, "toolchain": {"torch": torch.__version__},
           "buckets": [{"id": "b1", "target": "lin/b1/fp32/p1", "key": "cd" * 32, "sizes": {"batch": 1},
                        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "fp32"}], "artifact": "b1/model.pt2",
                        "loader": "torch._inductor.aoti_load_package", "files": {"b1/model.pt2": ent}}]}
    (dest / "release.json").write_text(json.dumps(doc))
    return dest


def test_a_package_for_an_isa_this_host_lacks_is_refused_in_one_line(pulled_aoti, monkeypatch):
    import torch

    from neuron_build.errors import UserError
    from neuron_build.runtime import BucketedModel

    built = package_cpu_isa(pulled_aoti / "b1" / "model.pt2")
    assert built == host_cpu_isa({})  # what AOTInductor recorded is what the key names
    monkeypatch.setenv(ISA_ENV, "AVX2")
    t0 = time.perf_counter()
    with pytest.raises(UserError) as e:
        BucketedModel.load(pulled_aoti)
    msg = str(e.value)
    assert msg.startswith(f"{pulled_aoti / 'b1' / 'model.pt2'} (bucket b1 of release r-00000000000000aa) was built "
                          f"for CPU ISA '{built}'") and "this host has 'AVX2' and lacks" in msg and "\n" not in msg
    assert time.perf_counter() - t0 < 5
    monkeypatch.delenv(ISA_ENV)
    bm = BucketedModel.load(pulled_aoti)  # on the host that built it: loads and runs
    assert tuple(bm(torch.randn(1, 4)).shape) == (1, 3)
