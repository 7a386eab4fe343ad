"""Compiler args: one canonical spelling per setting; bad values caught at config time."""

import pytest

from neuron_build.project.compiler_args import key_args
from neuron_build.project.compiler_args import normalize_compiler_args as norm


@pytest.mark.parametrize("spelling", [["--optlevel", "2"], ["--optlevel=2"], ["-O2"], ["-O", "2"], ["--optlevel 2"],
                                      "--optlevel 2", ["-O 2"]])
def test_optlevel_spellings_are_one_flag(spelling):
    assert norm(spelling) == ("--optlevel=2",)


def test_sorted_and_deduplicated():
    assert norm(["--model-type=transformer", "-O3", "--optlevel=3", "--enable-saturate-infinity"]) == (
        "--enable-saturate-infinity", "--model-type=transformer", "--optlevel=3")


def test_aliases_and_unknown_flags_pass_through():
    assert norm(["--logical-nc-config", "2", "--some-new-flag", "x", "--flag-only"]) == (
        "--flag-only", "--lnc=2", "--some-new-flag=x")


@pytest.mark.parametrize("args,msg", [
    (["--auto-cast=matmul"], "--auto-cast=matmul is not a valid value; allowed: none, matmult, all (did you mean 'matmult'?)"),
    (["--auto-cast-type", "bf8"], "--auto-cast-type=bf8 is not a valid value; allowed: bf16, fp16, tf32, fp8_e4m3"),
    (["-O4"], "--optlevel=4 is not a valid value; allowed: 1, 2, 3"),
    (["--model-type", "transfomer"], "(did you mean 'transformer'?)"),
    (["-O1", "-O2"], "--optlevel is given twice with different values (--optlevel=1 and --optlevel=2); keep one"),
    (["--enable-mixed-precision-accumulation", "--disable-mixed-precision-accumulation"], "contradict each other"),
    (["--logfile=x.txt"], "--logfile may not be set in a profile"),
    (["2"], "stray value '2'"),
    (["--optlevel"], "--optlevel needs a value"),
])
def test_rejected(args, msg):
    with pytest.raises(ValueError) as ei:
        norm(args)
    assert msg in str(ei.value)


def test_verbose_kept_but_not_in_key():
    n = norm(["-O2", "--verbose", "info"])
    assert n == ("--optlevel=2", "--verbose=info")
    assert key_args(n) == ("--optlevel=2",)
    assert norm(["--verbose=35"]) == ("--verbose=35",)
