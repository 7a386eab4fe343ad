"""The defects issue 25 named in passing: each one line and its exit code (0 ok, 1 failed, 2 usage, 3 refused)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from neuron_build.cli import ERROR_SCHEMA, main, parser
from neuron_build.cli.app import COMMANDS
from neuron_build.errors import ExitCode, FactoryNotImportable, UserError, exit_code
from neuron_build.project.config import MAX_NAME_CHARS, Backend, DeviceKind
from tests.helpers.cli import REPO
from tests.helpers.projects import write_tiny_project


def _with_build(cfg: Path, line: str) -> Path:
    cfg.write_text(cfg.read_text().replace("[build]\n", f"[build]\n{line}\n", 1))
    return cfg


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- release --backend / promote --device-kind take what the config's types take ----------------------------
def test_release_backend_and_device_kind_choices_are_the_configs(tiny, capsys):
    p = parser()
    assert p.parse_args(["release", "tiny", "--backend", "torchneuron"]).backend == "torchneuron"
    assert p.parse_args(["release", "tiny", "--backend", "compile-cache"]).backend == "compile-cache"
    sub = p._subparsers._group_actions[0].choices  # the sub-parsers, by command
    backend = next(a for a in sub["release"]._actions if a.dest == "backend")
    kind = next(a for a in sub["promote"]._actions if a.dest == "device_kind")
    assert tuple(backend.choices) == get_args(Backend) and tuple(kind.choices) == get_args(DeviceKind)
    # a real run: the backend is accepted and the release refused for the missing buckets, not the flag
    assert main(["release", "tiny", "-c", str(tiny), "--dtype", "fp32", "--profile", "p1",
                 "--backend", "torchneuron"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot release tiny fp32/p1 (torchneuron): 2 of 2 bucket(s) missing or failed")
    assert "invalid choice" not in err


# -- [build] store = URL names [build] remote ------------------------------------------------------------------
def test_a_url_as_build_store_names_build_remote(tmp_path, capsys):
    cfg = _with_build(write_tiny_project(tmp_path / "p"), 'store = "s3://mybucket/neuron"')
    assert main(["plan", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "not supported yet" not in err
    assert ("  build.store: 's3://mybucket/neuron' is a URL; [build] store is the local folder (such as "
            "\"artifacts\"; a shared file system mount works) and a shared store goes in [build] remote = "
            "'s3://mybucket/neuron'") in err.splitlines()
    text = " ".join((REPO / "docs" / "store.md").read_text().split())
    assert "(`is a URL; [build] store is the local folder`)" in text


# -- a release factory that does not import names --factory-root / factory_root ---------------------------------
def test_a_factory_module_not_under_factory_root_names_the_option(tmp_path):
    from neuron_build.runtime import serving_model

    with pytest.raises(FactoryNotImportable) as e:
        serving_model({"factory": "nb_no_such_factory_mod.sub:build", "dtype": "fp32"}, factory_root=tmp_path)
    text = str(e.value)
    assert text == (f"the release's model factory nb_no_such_factory_mod.sub:build does not import from "
                    f"{tmp_path.resolve()} (no module named 'nb_no_such_factory_mod'): pass the project folder "
                    f"that holds it as --factory-root (neuron-build warmup) or factory_root= (BucketedModel.load)")
    assert "\n" not in text and isinstance(e.value, ImportError) and exit_code(e.value) == ExitCode.USAGE == 2


def test_a_missing_dependency_of_the_factory_stays_modulenotfounderror(tmp_path):
    """The factory's module is there but imports a package that is not: factory_root is not the fix."""
    from neuron_build.runtime import serving_model

    (tmp_path / "nb_dep_factory.py").write_text("import nb_missing_dependency_pkg\n\ndef build():\n    pass\n")
    with pytest.raises(ModuleNotFoundError) as e:
        serving_model({"factory": "nb_dep_factory:build", "dtype": "fp32"}, factory_root=tmp_path)
    assert e.value.name == "nb_missing_dependency_pkg" and not isinstance(e.value, FactoryNotImportable)


# -- FORCE_COLOR on a pipe -------------------------------------------------------------------------------------
def test_force_color_colours_the_plain_progress_lines(monkeypatch):
    from neuron_build.build.display import BuildDisplay

    monkeypatch.delenv("NO_COLOR", raising=False)
    for env, want in (("1", "[1/2] m/b1/fp32/p1 \x1b[32mPASS\x1b[0m in 1.0 s\n"),
                      ("", "[1/2] m/b1/fp32/p1 PASS in 1.0 s\n")):
        monkeypatch.setenv("FORCE_COLOR", env)
        pipe = io.StringIO()
        BuildDisplay(total=2, stream=pipe, live=False).note("[1/2] m/b1/fp32/p1 PASS in 1.0 s", status="PASS")
        assert pipe.getvalue() == want
    monkeypatch.setenv("FORCE_COLOR", "1")
    pipe = io.StringIO()
    BuildDisplay(total=2, stream=pipe, live=False).note("[2/2] m/b4/fp32/p1 COMPILE_ERROR in 1.0 s",
                                                        status="COMPILE_ERROR")
    assert pipe.getvalue() == "[2/2] m/b4/fp32/p1 \x1b[1;31mCOMPILE_ERROR\x1b[0m in 1.0 s\n"


@pytest.mark.parametrize("force", ["1", ""])
def test_force_color_turns_the_log_events_on_a_pipe_into_coloured_console_lines(force):
    code = "from neuron_build import log; log.configure(); log.get_logger().warning('compiling', target='m/b1')"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "FORCE_COLOR": force}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    line = _one_line(r.stderr)
    if force:
        assert "\x1b[" in line and "compiling" in line and not line.startswith("{")
    else:
        assert json.loads(line)["event"] == "compiling" and "\x1b[" not in line


# -- Ctrl-C says what was interrupted and what was kept ----------------------------------------------------------
@pytest.mark.parametrize("command, kept", [
    ("plan", "what it finished writing is kept and nothing half-written is left in the store"),
    ("build", "the targets it finished stay built in the store; run it again to build the rest")])
def test_ctrl_c_prints_one_line(tiny, capsys, monkeypatch, command, kept):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(COMMANDS, command, interrupted)
    assert main([command, "-c", str(tiny)]) == 130
    assert _one_line(capsys.readouterr().err) == f"interrupted: `neuron-build {command}` stopped by Ctrl-C; {kept}"


# -- remote_options with an unknown key ----------------------------------------------------------------------------
S3FS_KEYS = ("key", "secret", "token", "profile", "endpoint_url", "client_kwargs", "config_kwargs",
             "s3_additional_kwargs", "anon", "use_ssl", "requester_pays", "default_block_size", "default_fill_cache",
             "version_aware", "cache_regions", "asynchronous", "loop", "max_concurrency", "fixed_upload_size",
             "session", "username", "password", "skip_instance_cache", "use_listings_cache",
             "connect_timeout_s", "read_timeout_s", "attempts")


def test_remote_options_keys_of_s3fs_and_neuron_build_are_known():
    from neuron_build.remote_options import check_options, known_option_keys, option_faults

    assert set(S3FS_KEYS) <= known_option_keys("s3://bucket/prefix")
    assert not [f for f in option_faults("s3://bucket/prefix", dict.fromkeys(S3FS_KEYS)) if "unknown key" in f]
    check_options("file:///tmp/x", {"auto_mkdir": True, "attempts": 2})
    with pytest.raises(UserError) as e:
        check_options("s3://bucket/prefix", {"endpoint": "http://minio:9000"})
    assert str(e.value).startswith("[build] remote_options: unknown key 'endpoint' for s3://bucket/prefix (did you "
                                   "mean 'endpoint_url'?); the keys are connect_timeout_s, read_timeout_s, attempts, "
                                   "multipart_threshold, multipart_chunksize, max_concurrency, multipart_copy_threshold "
                                   "and the storage options "
                                   "of fsspec's s3:// file system: anon, ")
    with pytest.raises(UserError, match=r"unknown key 'region' .*\(the region goes in client_kwargs = "):
        check_options("s3://bucket/prefix", {"region": "us-east-1"})


def test_an_unknown_remote_option_fails_the_command_naming_the_file_and_key(tmp_path, capsys):
    cfg = _with_build(write_tiny_project(tmp_path / "p"),
                      f'remote = "file://{tmp_path}/shared"\nremote_options = {{ atempts = 3 }}')
    assert main(["status", "--remote", "-c", str(cfg)]) == 2
    head, fault = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert head == f"error: {cfg}: invalid configuration"
    assert fault.startswith(f"  build.remote_options: unknown key 'atempts' for file://{tmp_path}/shared "
                            f"(did you mean 'attempts'?)")


# -- names too long for a file name ------------------------------------------------------------------------------
def test_a_long_model_name_in_the_config_is_refused(tmp_path, capsys):
    cfg = write_tiny_project(tmp_path / "p")
    cfg.write_text(cfg.read_text().replace("[models.other]", "[models." + "m" * 300 + "]"))
    assert main(["plan", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert (f"  models.{'m' * 20}...: model name '{'m' * 20}'... is 300 characters; at most {MAX_NAME_CHARS} "
            f"(it becomes a file name in the store)") in err.splitlines()
    assert "File name too long" not in err


def test_a_long_channel_name_in_the_config_and_on_the_command_line_is_refused(tiny, capsys):
    text = tiny.read_text()
    tiny.write_text(text + '\n[release]\nchannels = ["dev", "' + "c" * 5000 + '"]\n')
    assert main(["plan", "-c", str(tiny)]) == 2
    err = capsys.readouterr().err
    assert f"channel name '{'c' * 20}'... is 5000 characters; at most {MAX_NAME_CHARS}" in err
    assert "c" * 100 not in err
    tiny.write_text(text)
    assert main(["promote", "tiny", "r-1", "--to", "c" * 5000, "-c", str(tiny)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: channel name '{'c' * 20}'... is 5000 characters; at most {MAX_NAME_CHARS} (it becomes a file name "
        f"in the store); no channel of buckets.toml has such a name")


# -- failures ../../x ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["../../x", "/etc", "tiny/../../x"])
def test_failures_of_a_path_is_a_usage_error(tiny, capsys, target):
    assert main(["failures", target, "-c", str(tiny)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: failures: {target!r} is not a target id; give one as `neuron-build plan` lists them "
        f"(MODEL/BUCKET/DTYPE/PROFILE), or none for every kept failure")
    assert main(["failures", "tiny", "-c", str(tiny)]) == 0


# -- a usage error under --json is a JSON object on stdout -----------------------------------------------------------
def test_a_usage_error_under_json_prints_a_json_error(tiny, capsys):
    assert main(["show", "nope", "--json", "-c", str(tiny)]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc == {"schema": ERROR_SCHEMA, "error": err.removeprefix("error: ").strip(), "exit_code": 2}
    assert ERROR_SCHEMA == "neuron-build/error/v1"
    with pytest.raises(SystemExit) as e:
        main(["plan", "--json", "--no-such-flag", "-c", str(tiny)])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"schema": ERROR_SCHEMA, "error": "neuron-build: unrecognized arguments: --no-such-flag",
                               "exit_code": 2}
    assert main(["show", "nope", "-c", str(tiny)]) == 2  # without --json, stdout stays empty
    assert capsys.readouterr().out == ""


# -- `doit build` in a subfolder of a project ------------------------------------------------------------------------
def _doit_with_the_plugin():
    """doit's main with neuron-build's ``run`` command, as the ``doit.COMMAND`` entry point installs it."""
    from doit.doit_cmd import DoitMain

    m = DoitMain(config_filenames=())
    m.config["COMMAND"] = {"run": "neuron_build.build.doit.run:BuildRun"}
    return m


def test_doit_build_in_a_subfolder_suggests_seek_file_and_exits_2(tiny, monkeypatch, capsys):
    (tiny.parent / "dodo.py").write_text((REPO / "dodo.py").read_text())
    sub = tiny.parent / "models" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert _doit_with_the_plugin().run(["build"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"ERROR: no dodo.py in {sub.resolve()}; the project is {tiny.parent.resolve()}: run `doit --seek-file "
        f"build` (doit searches the parent folders) or `neuron-build build` (it finds buckets.toml the same way)")
    import tomllib

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["doit.COMMAND"]
    assert eps == {"run": "neuron_build.build.doit.run:BuildRun"}  # BuildRun is build.doit.run.Run's subclass


def test_doit_outside_a_project_keeps_doits_own_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _doit_with_the_plugin().run(["build"]) == 3  # doit's own code, as without neuron-build
    assert "Could not find dodo file" in capsys.readouterr().err


def test_doit_build_beside_a_buckets_toml_without_dodo_py_is_one_line_exit_2(tiny, monkeypatch, capsys):
    """A project with buckets.toml but no dodo.py (written by hand from docs/config.md): doit's own error
    exited 3, the code of a gate's refusal; now one line and exit 2, here and in a subfolder."""
    monkeypatch.chdir(tiny.parent)
    assert _doit_with_the_plugin().run(["build"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"ERROR: no dodo.py in {tiny.parent.resolve()} beside buckets.toml: run `neuron-build build`, or write a "
        f"dodo.py holding `from neuron_build.tasks import *` (what `neuron-build init` writes) to build with doit")
    sub = tiny.parent / "tinylib"
    monkeypatch.chdir(sub)
    assert _doit_with_the_plugin().run(["build"]) == 2
    assert "no dodo.py in " in capsys.readouterr().err


# -- counts of one say the noun once ---------------------------------------------------------------------------
def test_one_target_or_artifact_is_not_plural(tmp_path, capsys):
    """``plan``, ``validate``, ``ls`` and a build's summary said "1 targets"."""
    from neuron_build.build.summary import BuildSummary
    from neuron_build.cli.validate import ValidationRun

    cfg = write_tiny_project(tmp_path / "p")
    cfg.write_text(cfg.read_text().replace('profiles = ["p1", "p2"]', 'profiles = ["p1"]')
                   .replace("buckets = { batch = [1, 4] }", "buckets = { batch = [1] }")
                   .replace('dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]').split("[models.other]")[0])
    assert main(["plan", "-c", str(cfg)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 target: 0 cached, 1 missing, 0 failed"
    assert main(["ls", "-c", str(cfg)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"0 artifacts in {tmp_path / 'p' / 'artifacts'}"
    assert ValidationRun(["tiny/b1/fp32/p1"]).summary() == "1 target: 0 passed, 0 failed, 0 not validated, 0 not built"
    assert BuildSummary(["t"], ["t"], [], [], {}).head() == "1 target: 1 built, 0 cached, 0 failed"
