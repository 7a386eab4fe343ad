"""buckets.toml parsing: strict, one clear error per fault, naming file, TOML path and fix."""

from __future__ import annotations

import pytest

from neuron_build.errors import ConfigError
from neuron_build.project.config import load_project
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, faults_of


def test_tiny_project_loads(tiny):
    p = load_project(tiny)
    assert list(p.config.models) == ["tiny", "other"]
    # -O2 / --model-type transformer normalised and sorted
    assert p.config.profiles["p2"].compiler_args == ("--model-type=transformer", "--optlevel=2")
    assert p.config.models["tiny"].buckets == {"batch": (1, 4)}
    assert p.factory_file("tiny") == tiny.parent / "tinylib" / "tiny.py"


def test_unknown_key_did_you_mean(tiny):
    edit(tiny, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32", "bf16"]\ntolerence = {}')
    assert faults_of(tiny) == [
        "models.tiny.tolerence: unknown key 'tolerence'; did you mean 'tolerance'? allowed keys: factory, "
        "hf, auto_class, output, kwargs, dtypes, profiles, inputs, buckets, weights, sources, packages, tolerance, truncate, convert_dtypes, reference, task, max_seq_len, decode_buckets, "
        "inputs_from, env, always_rebuild"]


def test_misspelt_flag_value(tiny):
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--auto-cast", "matmul"]')
    assert faults_of(tiny) == [
        "profiles.p1.compiler_args: --auto-cast=matmul is not a valid value; allowed: none, matmult, all "
        "(did you mean 'matmult'?)"]


def test_conflicting_duplicate_flag_names_profile(tiny):
    edit(tiny, 'compiler_args = ["-O2", "--model-type", "transformer"]',
         'compiler_args = ["-O2", "--model-type=transformer", "--optlevel 3"]')
    assert faults_of(tiny) == [
        "profiles.p2.compiler_args: --optlevel is given twice with different values (--optlevel=2 and "
        "--optlevel=3); keep one"]


def test_non_positive_bucket_size(tiny):
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 4, 0] }")
    assert faults_of(tiny) == ["models.tiny.buckets.batch[2]: 0 is not allowed; it must be greater than 0"]


def test_unknown_dtype_one_error(tiny):
    edit(tiny, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32", "float64"]')
    assert faults_of(tiny) == ["models.tiny.dtypes[1]: 'float64' is not allowed; allowed: fp32, bf16, fp16"]


def test_factory_that_does_not_import(tiny):
    (tiny.parent / "tinylib" / "other.py").write_text("import torch\nimport no_such_package_xyz\n\ndef build():\n    pass\n")
    assert faults_of(tiny) == [
        "models.other.factory: tinylib/other.py does not import: module 'no_such_package_xyz' (line 2) "
        "is not installed"]


def test_factory_missing_module_and_function(tiny):
    edit(tiny, 'factory = "tinylib.other:build"', 'factory = "tinylib.nothere:build"')
    edit(tiny, 'factory = "tinylib.tiny:build"', 'factory = "tinylib.tiny:biuld"')
    f = faults_of(tiny)
    assert f[0].startswith("models.tiny.factory: tinylib/tiny.py defines no 'biuld'; defined: ")
    assert f[1] == ("models.other.factory: module 'tinylib.nothere' not found: expected tinylib/nothere.py "
                    "beside buckets.toml (factory paths are relative to its folder)")


def test_factory_syntax_error(tiny):
    (tiny.parent / "tinylib" / "other.py").write_text("def build(:\n")
    assert faults_of(tiny)[0].startswith("models.other.factory: tinylib/other.py does not import: syntax error at line 1")


def test_unknown_profile_and_unused_dim(tiny):
    edit(tiny, 'profiles = ["p1", "p2"]', 'profiles = ["p1", "pp2"]')
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 4], seq = [8] }")
    assert faults_of(tiny) == [
        "models.tiny.profiles[1]: unknown profile 'pp2'; did you mean 'p2'? defined profiles: p1, p2",
        "models.tiny.buckets.seq: no input uses dim 'seq'; remove it or use it in an input's shape"]


def test_dim_without_sizes_and_integer_without_range(tiny):
    edit(tiny, 'inputs = [{ name = "x", shape = ["batch", 16] }]',
         'inputs = [{ name = "x", shape = ["batch", "seq"] }, { name = "ids", shape = [2], dtype = "int64" }]')
    f = faults_of(tiny)
    assert f == ["models.tiny.inputs[1]: integer input 'ids' needs range = [low, high), e.g. [0, 30522] for token ids"]


def test_missing_bucket_dim(tiny):
    edit(tiny, 'inputs = [{ name = "x", shape = ["batch", 16] }]', 'inputs = [{ name = "x", shape = ["batch", "seq"] }]')
    assert faults_of(tiny) == ["models.tiny.inputs[0].shape: dim 'seq' has no sizes; add it to "
                               "models.tiny.buckets (e.g. seq = [128])"]


def test_reserved_flag(tiny):
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--target=trn2"]')
    assert faults_of(tiny) == ["profiles.p1.compiler_args: --target may not be set in a profile: set the "
                               "hardware target with `target` under [build]"]


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "buckets.toml"
    bad.write_text("[build\n")
    assert faults_of(bad)[0].startswith("not valid TOML")
    assert faults_of(tmp_path / "nope.toml")[0].startswith("file not found")


def test_several_faults_each_once(tiny):
    edit(tiny, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp64"]')
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [-1] }")
    f = faults_of(tiny)
    assert len(f) == 2, f
    assert f[0].startswith("models.tiny.dtypes[0]: 'fp64' is not allowed")
    assert f[1] == "models.tiny.buckets.batch[0]: -1 is not allowed; it must be greater than 0"


def test_cli_config_error_exits_2_and_writes_nothing(tiny):
    edit(tiny, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32", "bf17"]')
    r = run_cli("build", "-c", str(tiny))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "models.tiny.dtypes[1]: 'bf17' is not allowed; allowed: fp32, bf16, fp16 (did you mean 'bf16'?)" in r.stderr
    assert not (tiny.parent / "artifacts").exists()
    assert not (tiny.parent / ".neuron-build").exists()


def test_doit_config_error_exits_2(tiny):
    import subprocess
    import sys
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 0] }")
    r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"),
                        "list", f"config={tiny}"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "models.tiny.buckets.batch[1]: 0 is not allowed" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tiny.parent / "artifacts").exists()


def test_remote_store_is_refused_clearly(tiny):
    edit(tiny, 'backend = "torchscript"', 'backend = "torchscript"\nstore = "s3://bucket/prefix"')
    assert faults_of(tiny) == ["build.store: 's3://bucket/prefix' is a URL; [build] store is the local folder "
                               "(such as \"artifacts\"; a shared file system mount works) and a shared store goes "
                               "in [build] remote = 's3://bucket/prefix'"]


def test_typo_of_a_required_key_is_one_fault(tiny):
    edit(tiny, 'dtypes = ["fp32", "bf16"]', 'dtype = ["fp32", "bf16"]')
    f = faults_of(tiny)
    assert len(f) == 1 and f[0].startswith("models.tiny.dtype: unknown key 'dtype'; did you mean 'dtypes'?")


def test_empty_file_folder_and_wrong_types(tiny, tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert faults_of(empty)[0].startswith("the file is empty")
    with pytest.raises(ConfigError) as ei:
        load_project(tiny.parent)
    assert ei.value.faults == [f"is a folder; pass the config file itself (e.g. -c {tiny.parent / 'buckets.toml'})"]
    edit(tiny, 'profiles = ["p1", "p2"]', 'profiles = []')
    edit(tiny, "timeout_s = 120", 'timeout_s = 120\ntransient_retries = "two"')
    assert faults_of(tiny) == ["build.transient_retries: 'two' is not allowed; it must be a whole number",
                               "models.tiny.profiles: is empty; give at least 1 item"]


def test_modules_the_factory_imports_must_import_too(tiny):
    (tiny.parent / "tinylib" / "act.py").write_text("import not_installed_abc\n\ndef scale(x):\n    return x\n")
    with open(tiny.parent / "tinylib" / "tiny.py", "a") as f:
        f.write("\nfrom tinylib import gone\n")
    line = (tiny.parent / "tinylib" / "tiny.py").read_text().splitlines().index("from tinylib import gone") + 1
    assert faults_of(tiny) == [
        f"models.tiny.factory: tinylib/tiny.py does not import: 'tinylib.gone' (line {line}) not found under tinylib/",
        "models.tiny.factory: tinylib/act.py (imported by tinylib/tiny.py) does not import: module "
        "'not_installed_abc' (line 1) is not installed"]


def test_a_boolean_is_not_a_number(tiny):
    edit(tiny, "timeout_s = 120", "timeout_s = true")
    with pytest.raises(ConfigError) as e:
        load_project(tiny)
    assert e.value.faults == ["build.timeout_s: must be a number, not true/false"]
    edit(tiny, "timeout_s = true", "timeout_s = 600")
    assert load_project(tiny).config.build.timeout_s == 600.0


def test_an_absolute_missing_weights_path_and_a_byte_order_mark(tiny):
    edit(tiny, 'factory = "tinylib.other:build"', 'factory = "tinylib.other:build"\nweights = ["/nonexistent/w.bin"]')
    with pytest.raises(ConfigError) as e:
        load_project(tiny)
    assert e.value.faults == ["models.other.weights[0]: '/nonexistent/w.bin' not found; give an existing file or folder"]
    tiny.write_bytes(b"\xef\xbb\xbf" + tiny.read_bytes())
    with pytest.raises(ConfigError) as e:
        load_project(tiny)
    assert e.value.faults[0].startswith("not valid TOML: ")
    assert e.value.faults[0].endswith("the file starts with a UTF-8 byte-order mark, which TOML does not allow: "
                                      "save it as UTF-8 without BOM")


def test_a_factory_kwarg_it_does_not_take_is_a_config_error(tiny):
    edit(tiny, "kwargs = { width = 16 }", "kwargs = { widht = 16 }")
    with pytest.raises(ConfigError) as e:
        load_project(tiny)
    assert e.value.faults == ["models.tiny.kwargs.widht: tinylib.tiny:build takes no argument 'widht'; "
                              "did you mean 'width'?"]


@pytest.mark.parametrize("store", [".", "", "./"])
def test_store_in_the_project_folder_is_refused(tiny, store):
    edit(tiny, 'backend = "torchscript"', f'backend = "torchscript"\nstore = "{store}"')
    root = tiny.parent.resolve()
    assert faults_of(tiny) == [
        f"build.store: {store!r} ({root}) is the project folder, so the models' source files would drop out of "
        f"the key (an edited model would stay cached); set it to a folder beside the sources, e.g. \"artifacts\""]


def test_store_holding_a_factory_module_is_refused(tiny):
    edit(tiny, 'backend = "torchscript"', 'backend = "torchscript"\nstore = "tinylib"')
    root = tiny.parent.resolve()
    assert faults_of(tiny) == [
        f"build.store: 'tinylib' ({root / 'tinylib'}) holds tinylib/__init__.py, a source of model 'tiny', so it "
        f"would drop out of the key (an edited model would stay cached); set it to a folder beside the sources, "
        f"e.g. \"artifacts\""]


def test_store_beside_the_sources_loads(tiny):
    edit(tiny, 'backend = "torchscript"', 'backend = "torchscript"\nstore = "artifacts"')
    assert load_project(tiny).store_url() == str(tiny.parent.resolve() / "artifacts")


@pytest.mark.parametrize("name", ["..", "-rf", "rmsnörm"])
def test_bad_model_name_says_the_whole_rule(tiny, name):
    edit(tiny, "[models.other]", f'[models."{name}"]')
    faults = faults_of(tiny)
    assert f"name {name!r} may hold only ASCII letters, digits, '_', '.', '-' and must start with a letter or " \
           f"digit" in faults[0], faults


def test_an_unknown_compiler_flag_is_one_line_naming_it_and_the_documented_flags(tiny):
    """`--no-such-flag` would change the key and fail (or be ignored) at compile time: refused with the
    documented flags; `unchecked_args` in the profile is the explicit escape hatch."""
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=1", "--no-such-flag"]')
    f = faults_of(tiny)
    assert len(f) == 1 and f[0].startswith(
        "profiles.p1.compiler_args: --no-such-flag is not a documented neuronx-cc flag (documented: --auto-cast, ")
    assert "--optlevel" in f[0] and "--target" not in f[0].split("documented:")[1].split(")")[0]
    assert f[0].endswith('if your neuronx-cc takes it, add unchecked_args = ["--no-such-flag"] to [profiles.p1]')
    edit(tiny, '"--no-such-flag"]', '"--no-such-flag"]\nunchecked_args = ["--no-such-flag"]')
    assert load_project(tiny).config.profiles["p1"].compiler_args == ("--no-such-flag", "--optlevel=1")
    edit(tiny, 'unchecked_args = ["--no-such-flag"]', 'unchecked_args = ["--optlevel"]')
    assert faults_of(tiny)[0].startswith("profiles.p1.compiler_args: --no-such-flag is not a documented")


@pytest.mark.parametrize(("old", "new", "says"), [
    ("timeout_s = 120", 'timeout_s = "900"', "build.timeout_s: '900' is a string; write the number without quotes"),
    ("heartbeat_s = 1", 'heartbeat_s = "1"', "build.heartbeat_s: '1' is a string; write the number without quotes"),
    ("buckets = { batch = [1, 4] }", 'buckets = { batch = ["1", 4] }', "models.tiny.buckets.batch[0]: '1' is not "
                                                                       "allowed; it must be a whole number"),
    ('compiler_args = ["--optlevel=1"]', 'compiler_args = "--optlevel=1"',
     'profiles.p1.compiler_args: must be a list of strings such as ["--optlevel=2"], not a string'),
])
def test_numbers_written_as_strings_and_a_string_for_a_list_are_refused(tiny, old, new, says):
    edit(tiny, old, new)
    f = faults_of(tiny)
    assert len(f) == 1 and f[0].startswith(says), f


@pytest.mark.parametrize(("old", "new", "says"), [
    ("timeout_s = 120", "timeout_s = inf", "build.timeout_s: inf is not a finite number; give one such as 600"),
    ("heartbeat_s = 1", "heartbeat_s = -inf", "build.heartbeat_s: -inf is not a finite number; give one such as 600"),
])
def test_an_infinite_number_is_refused(tiny, old, new, says):
    """TOML's ``inf`` passed every ``gt=0`` check: ``timeout_s = inf`` built with no timeout at all."""
    edit(tiny, old, new)
    assert faults_of(tiny) == [says]


def test_an_unknown_reference_names_the_defined_models(tiny):
    """With one other model the hint named it; with none the line said "defined models: none" while the model
    itself is defined: it now names every defined model."""
    cfg = tiny.read_text()
    tiny.write_text(cfg[:cfg.index("[models.other]")])
    edit(tiny, "kwargs = { width = 16 }", 'kwargs = { width = 16 }\nreference = "nothere"')
    assert faults_of(tiny) == ["models.tiny.reference: unknown model 'nothere'; defined models: tiny (a model is "
                               "its own reference by default: remove the line, or define the model to compare with)"]


def test_a_slurm_walltime_shorter_than_timeout_s_is_refused(tiny):
    """A job whose walltime ends before a compile may time out kills the compile with its job: refused."""
    edit(tiny, "timeout_s = 120", 'timeout_s = 900\nexecutor = "dask"')
    with open(tiny, "a") as f:
        f.write('\n[dask]\ncluster = "slurm"\nwalltime = "00:10:00"\n')
    assert faults_of(tiny) == [
        "dask.walltime: '00:10:00' lets a worker run 540 s (the walltime less its lifetime margin of 60 s), less "
        "than [build] timeout_s (900 s): a compile that runs its full time would be stopped with its Slurm job; "
        "raise walltime or lower timeout_s"]
    edit(tiny, 'walltime = "00:10:00"', 'walltime = "00:20:00"')
    assert load_project(tiny).config.dask.walltime == "00:20:00"


def test_weights_inline_or_external_one_answer_per_profile(tiny):
    """``weights`` and ``inline_weights_to_neff`` (its Neuron spelling) say one thing; a conflict is one line
    naming the profile."""
    assert load_project(tiny).config.profiles["p1"].weights == "inline"
    edit(tiny, 'backend = "torchscript"', 'backend = "inductor"')  # (torchscript cannot keep weights apart)
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=1"]\nweights = "external"')
    p1 = load_project(tiny).config.profiles["p1"]
    assert (p1.weights, p1.inline_weights_to_neff) == ("external", False)
    edit(tiny, 'weights = "external"', 'inline_weights_to_neff = false')
    p1 = load_project(tiny).config.profiles["p1"]
    assert (p1.weights, p1.inline_weights_to_neff) == ("external", False)
    edit(tiny, 'inline_weights_to_neff = false', 'inline_weights_to_neff = true\nweights = "external"')
    assert faults_of(tiny) == [
        'profiles.p1: weights = "external" but inline_weights_to_neff = true (its Neuron spelling); '
        'keep one of the two']
    edit(tiny, 'weights = "external"', 'weights = "outside"')
    (fault,) = faults_of(tiny)
    assert fault.startswith("profiles.p1.weights:") and "inline" in fault and "external" in fault


EXTERNAL = 'compiler_args = ["--optlevel=1"]\nweights = "external"'


@pytest.mark.parametrize("backend", ["torchscript", "compile-cache", "torchneuron"])
def test_external_weights_on_a_backend_that_compiles_them_in_is_one_line(tiny, backend):
    """``weights = "external"`` on a backend that cannot keep weights apart was accepted, ignored and part of
    the key; now one fault naming the profile key, the backend, the models that use it and the fix."""
    edit(tiny, 'backend = "torchscript"', f'backend = "{backend}"')
    if backend == "torchneuron":
        edit(tiny, "heartbeat_s = 1", 'heartbeat_s = 1\ntarget = "trn2"')
    edit(tiny, 'compiler_args = ["--optlevel=1"]', EXTERNAL)
    assert faults_of(tiny) == [
        f'profiles.p1.weights: weights = "external" asks for the weights apart from the compiled artifact, but the '
        f"{backend} backend ([build] backend) compiles them in, so it would be ignored (models tiny, other); set "
        f'weights = "inline" in [profiles.p1], or a backend that keeps weights apart: backend = "neuron" or '
        f'"inductor" under [build]']


def test_the_neuron_spelling_of_external_weights_is_named_as_written(tiny):
    edit(tiny, 'compiler_args = ["-O2", "--model-type", "transformer"]',
         'compiler_args = ["-O2"]\ninline_weights_to_neff = false')
    (fault,) = faults_of(tiny)
    assert fault.startswith("profiles.p2.inline_weights_to_neff: inline_weights_to_neff = false asks for the "
                            "weights apart") and "(model tiny);" in fault


@pytest.mark.parametrize("backend", ["inductor", "neuron", "auto"])
def test_external_weights_load_on_a_backend_that_keeps_them_apart_and_on_auto(tiny, backend):
    """``auto`` is checked once resolved (per host: neuron, torchneuron or inductor), not when the file loads."""
    edit(tiny, 'backend = "torchscript"', f'backend = "{backend}"')
    edit(tiny, 'compiler_args = ["--optlevel=1"]', EXTERNAL)
    assert load_project(tiny).config.profiles["p1"].weights == "external"


def test_external_weights_on_auto_resolved_to_torchneuron_or_on_backend_override_is_refused(tiny, monkeypatch):
    from neuron_build.project import keys

    edit(tiny, 'backend = "torchscript"', 'backend = "auto"')
    edit(tiny, 'compiler_args = ["--optlevel=1"]', EXTERNAL)
    p = load_project(tiny)
    monkeypatch.setattr(keys, "resolve_backend", lambda b, t: ("torchneuron", None))
    with pytest.raises(ConfigError) as e:
        keys.KeyMaker(p, environ={})
    assert e.value.file == str(tiny)
    (fault,) = e.value.faults
    assert fault.startswith('profiles.p1.weights: weights = "external" asks for the weights apart from the compiled '
                            'artifact, but the torchneuron backend ([build] backend = "auto" chose it on this host) '
                            "compiles them in")
    monkeypatch.setattr(keys, "resolve_backend", lambda b, t: (b, None))
    with pytest.raises(ConfigError, match=r"the torchscript backend \(--backend\) compiles them in"):
        keys.KeyMaker(p, backend="torchscript", environ={})
    assert keys.KeyMaker(p, backend="inductor", environ={}).backend == "inductor"


def test_external_weights_under_a_model_table_names_the_profile_table(tiny):
    edit(tiny, 'dtypes = ["fp32"]\nprofiles = ["p1"]', 'dtypes = ["fp32"]\nprofiles = ["p1"]\nweights = "external"')
    assert faults_of(tiny) == [
        'models.other.weights: weights = "external" is a profile\'s option: put it under [profiles.p1] (the '
        "profile this model builds with); in a [models.NAME] table, weights lists extra weight files whose "
        "content is part of the key"]


def test_a_bad_model_or_profile_name_is_named_by_its_table_path(tiny):
    """A trial's bad name printed ``"../evil": name ...``: which table? The line names ``models."../evil"`` (or
    ``profiles.``)."""
    rule = "may hold only ASCII letters, digits, '_', '.', '-' and must start with a letter or digit"
    edit(tiny, "[models.other]", '[models."../evil"]')
    assert [f for f in faults_of(tiny) if "name '../evil'" in f][0].startswith(
        f"models.\"../evil\": name '../evil' {rule}")
    edit(tiny, '[models."../evil"]', "[models.other]")
    edit(tiny, "[profiles.p1]", '[profiles.p1]\n[profiles."-rf"]')
    assert [f for f in faults_of(tiny) if "name '-rf'" in f][0].startswith(f"profiles.-rf: name '-rf' {rule}")
