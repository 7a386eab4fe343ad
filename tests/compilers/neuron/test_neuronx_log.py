import json
import random
import time
from pathlib import Path

import pytest

from neuron_build.cli.parse_log import format_summary, parse_log_main
from neuron_build.compilers.neuron.neuronx_log import (
    CacheEvent,
    Diagnostic,
    InternalError,
    LogSummary,
    failure_reason,
    first_diagnostic_line,
    parse_log,
)
from tests.helpers.cli import FIXTURES, run_cli

LOGS = FIXTURES / "neuronx_logs"


def parse_fixture(name: str) -> LogSummary:
    return parse_log((LOGS / name).read_bytes())


def assert_json_clean(summary: LogSummary) -> dict:
    doc = summary.to_json()
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc
    return doc


# --- each format ----------------------------------------------------------------------------------


def test_pass_with_progress_dots():
    s = parse_fixture("pass_dots.log")
    assert s == LogSummary(status="PASS", lines=4)
    assert first_diagnostic_line(s) is None
    assert failure_reason(s) is None


def test_summary_lines():
    s = parse_fixture("summary_lines.log")
    assert s.status == "PASS"
    assert s.op_count == 41
    assert s.compile_time_s == 214.6
    assert s.instruction_count is None
    assert s.pass_times == {}
    assert s.diagnostics == ()
    assert s.unparsed == ()
    assert s.lines == 4


def test_summary_lines_failed_last_status_wins_and_bad_number_is_reported():
    s = parse_fixture("summary_failed.log")
    assert s.status == "ERROR"
    assert s.op_count is None
    assert s.compile_time_s == 191.25
    assert s.unparsed == ("line 2: NEFF op count 'n/a' is not an integer",)
    assert s.lines == 4


def test_xcg815_hbm_failure_without_status_line_is_error():
    s = parse_fixture("xcg815_hbm.log")
    message = (
        "Estimated peak HBM usage (22.84) exceeds 16GB. The model will not fit on one NeuronCore; "
        "try a smaller bucket or tensor parallelism."
    )
    assert s.status == "ERROR"
    assert s.diagnostics == (Diagnostic("XCG815", message, 3, "error"),)
    assert s.compile_time_s is None  # "compilation time" on line 1 is not a summary line
    assert first_diagnostic_line(s) == f"XCG815: {message}"
    assert s.unparsed == ()
    assert s.lines == 3


def test_ncc_eoom001():
    s = parse_fixture("ncc_eoom001.log")
    assert s.status == "ERROR"
    assert s.diagnostics == (
        Diagnostic("NCC_EOOM001", "Out of device memory: estimated 21.7 GB of HBM needed, 16.0 GB available.", 2),
    )
    assert s.internal_errors == ()
    assert first_diagnostic_line(s) == (
        "NCC_EOOM001: Out of device memory: estimated 21.7 GB of HBM needed, 16.0 GB available."
    )


def test_ncc_evrf007_instruction_count():
    s = parse_fixture("ncc_evrf007.log")
    message = (
        "Compiler generated too many instructions (6888787). The limit is 5000000; reduce the batch or "
        "sequence length of this bucket."
    )
    assert s.status == "ERROR"
    assert s.instruction_count == 6888787
    assert s.diagnostics == (Diagnostic("NCC_EVRF007", message, 2, "error"),)
    # The line is also a "[neuronx-cc]" ERROR line.
    assert s.internal_errors == (InternalError("error", f"[NCC_EVRF007] {message}", 2),)
    assert s.pass_times == {}  # "Running Tensorizer" alone has no time
    assert s.lines == 3


def test_ncc_euoc002_bare_code_without_timestamp():
    s = parse_fixture("ncc_euoc002.log")
    assert s.status == "ERROR"
    assert s.diagnostics == (
        Diagnostic(
            "NCC_EUOC002",
            "Operator 'aten::_fft_r2c' is not supported on trn1; run it on the CPU or rewrite the model.",
            1,
        ),
    )
    assert s.lines == 1


def test_old_bracketed_codes_and_severity():
    s = parse_fixture("old_codes.log")
    assert s.status == "ERROR"
    assert s.instruction_count == 9530773
    assert s.diagnostics == (
        Diagnostic("NLA001", "Unhandled exception in tensorizer: shape mismatch in dot general", 1, "error"),
        Diagnostic("TEN404", "Internal tensorizer warning: falling back to slow path for op 'gather'", 2, "warning"),
        Diagnostic("F134", "neuronx-cc terminated abnormally - see the log above", 3, "error"),
        Diagnostic("XTP002", "Value out of range for tensor 'tensor_12'", 4, "error"),
        Diagnostic("LUR015", "Compiler generated too many instructions (9530773). Reduce the model size.", 6, "error"),
    )
    assert [d.code for d in s.errors] == ["NLA001", "F134", "XTP002", "LUR015"]
    assert first_diagnostic_line(s) == "NLA001: Unhandled exception in tensorizer: shape mismatch in dot general"


def test_internal_error_with_traceback():
    s = parse_fixture("internal_error.log")
    assert s.status == "ERROR"
    assert s.diagnostics == ()
    expected = [
        ("error", "An Internal Compiler Error has occurred", 3),
        ("error", "Error message:  Cannot legalize reduce window with a stride of zero", 6),
        ("error", "Error class:    ValueError", 8),
        ("error", "Error location: Unknown", 9),
        ("error", "Internal details:", 10),
        ("error", 'File "neuronxcc/driver/Job.py", line 301, in run', 11),
        ("traceback", "Traceback (most recent call last):", 12),
        ("traceback", '  File "/opt/venv/lib/python3.10/site-packages/neuronxcc/driver/CommandDriver.py", line 120, in main', 13),
        ("traceback", "    return self.run_subcommand(args)", 14),
        ("traceback", '  File "/opt/venv/lib/python3.10/site-packages/neuronxcc/driver/Job.py", line 301, in run', 15),
        ("traceback", '    raise ValueError("Cannot legalize reduce window with a stride of zero")', 16),
        ("traceback", "ValueError: Cannot legalize reduce window with a stride of zero", 17),
        ("traceback", "During handling of the above exception, another exception occurred:", 19),
        ("traceback", "Traceback (most recent call last):", 21),
        ("traceback", '  File "/opt/venv/bin/neuronx-cc", line 8, in <module>', 22),
        ("traceback", "    sys.exit(main())", 23),
        ("traceback", "SystemExit: 70", 24),
    ]
    assert s.internal_errors == tuple(InternalError(*e) for e in expected)
    assert first_diagnostic_line(s) is None
    assert failure_reason(s) == "Cannot legalize reduce window with a stride of zero"
    assert s.unparsed == ()
    assert s.lines == 25


def test_bare_traceback_is_an_error_and_ends_at_the_exception_line():
    s = parse_log("starting\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'a'\nnext line\n")
    assert s.status == "ERROR"
    assert [(e.line, e.text) for e in s.internal_errors] == [
        (2, "Traceback (most recent call last):"),
        (3, '  File "x.py", line 1, in <module>'),
        (4, "KeyError: 'a'"),
    ]
    assert failure_reason(s) == "KeyError: 'a'"


def test_verbose_pass_times():
    s = parse_fixture("verbose_passes.log")
    assert s.status == "PASS"
    assert s.pass_times == {
        "DoNothing": 0.0,
        "LoopFusion": 2.263,  # 2.163 + 0.1, two subgraphs
        "constant_propagate": 0.003,  # unnamed "finished after" takes the last "Running" name
        "Tensorizer": 9.5,
        "sched": 0.001,
    }
    assert list(s.pass_times) == ["DoNothing", "LoopFusion", "constant_propagate", "Tensorizer", "sched"]
    assert s.unparsed == ("line 11: pass time 'soon seconds' is not a time",)
    assert s.lines == 12


def test_old_exit_time_region_lines():
    s = parse_fixture("old_regions.log")
    assert s.status == "PASS"
    assert s.pass_times == {
        "LoopFusion": 2.437,
        "Simplifier": 0.572,  # 0.515 + 0.057
        "region_1": 0.25,  # no tag and no open "Enter time region"
        "DelinearIndices": 0.4,  # no tag: named by the open "Enter time region"
        "region_2": 0.1,
    }
    assert s.unparsed == ()


def test_wrapper_cache_lines():
    s = parse_fixture("wrapper_cache.log")
    cmd = (
        "['neuronx-cc', 'compile', '--framework=XLA', '/tmp/nb/model.MODULE_1a2b3c+4d5e6f7a.hlo_module.pb', "
        "'--output', '/tmp/nb/model.MODULE_1a2b3c+4d5e6f7a.neff', '--target=trn1', '--optlevel=2', '--verbose=35']"
    )
    assert s.status == "PASS"
    assert s.compiler_command == cmd
    assert s.cache_events == (
        CacheEvent("compile_cmd", cmd, 2),
        CacheEvent("cache_hit", "/var/tmp/neuron-compile-cache/neuronxcc-2.21.0/MODULE_77aa+4d5e6f7a/model.neff", 5),
        CacheEvent("cache_failed", "/var/tmp/neuron-compile-cache/neuronxcc-2.21.0/MODULE_88bb+4d5e6f7a/model.neff", 6),
    )
    assert s.diagnostics == ()
    assert s.unparsed == ()
    assert s.lines == 6


def test_wrapper_compilation_failed():
    s = parse_fixture("wrapper_failed.log")
    assert s.status == "ERROR"
    assert s.cache_events[1] == CacheEvent(
        "compile_failed", "Compilation failed for /tmp/nb/m.hlo_module.pb after 0 retries.", 3
    )
    assert failure_reason(s) == "Compilation failed for /tmp/nb/m.hlo_module.pb after 0 retries."


def test_mixed_encoding():
    s = parse_fixture("mixed_encoding.log")
    assert s.status == "ERROR"
    assert s.replaced_bytes == 3
    assert s.diagnostics == (
        Diagnostic("XCG815", "Estimated peak HBM usage (18.5) exceeds 16GB for caf\ufffd model", 3),
    )
    assert s.unparsed == ("3 non-UTF-8 byte(s) replaced with U+FFFD (first on line 1)",)
    assert s.lines == 4


def test_truncated_fixture():
    s = parse_fixture("truncated.log")
    assert s.status is None
    assert s.pass_times == {"DoNothing": 0.012}
    assert s.unparsed == ("log ends mid-line (no newline after line 4)",)
    assert s.lines == 4


def test_empty():
    s = parse_fixture("empty.log")
    assert s == LogSummary(unparsed=("log is empty",), lines=0)
    assert parse_log("") == s
    assert parse_log(b"\n\n  \n").unparsed == ("log is empty (whitespace only)",)
    assert parse_log(b"\n\n  \n").lines == 3


# --- status rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, status",
    [
        ("Compiler status PASS\n", "PASS"),
        ("Compiler status ERROR\n", "ERROR"),
        ("2026-10-29T09:12:41Z INFO 1 Compiler status: SUCCESS\n", "PASS"),
        ("2026-10-29T09:12:41Z INFO 1 Compiler status: FAILED\n", "ERROR"),
        ("......Compiler status PASS\r\n", "PASS"),
        ("Compiler status PASS\nCompiler status ERROR\n", "ERROR"),
        ("Compiler status ERROR\nCompiler status PASS\n", "PASS"),
        ("[XCG815] bad\nCompiler status PASS\n", "PASS"),  # a PASS line wins over diagnostics
        ("[XCG815] bad\n", "ERROR"),
        ("WARNING [TEN404] only a warning\n", None),
        ("NCC_WXYZ001 a warning code\n", None),
        ("2026-01-05T16:25:37Z ERROR 4242 [neuronx-cc]: ****\n", "ERROR"),
        ("01/03/2023 01:12:05 PM ERROR [neuron-cc]: Error message: x\n", "ERROR"),
        ("just some text\n", None),
    ],
)
def test_status_rules(text: str, status):
    assert parse_log(text).status == status


def test_unknown_status_word_is_noted():
    s = parse_log("Compiler status: RUNNING\nCompiler status\n")
    assert s.status is None
    assert s.unparsed == (
        "line 1: unknown compiler status 'RUNNING'",
        "line 2: compiler status line without a status word",
    )


def test_compile_time_units_and_bad_values():
    assert parse_log("Compile time: 214.6 sec\n").compile_time_s == 214.6
    assert parse_log("Compile time: 12s\n").compile_time_s == 12.0
    assert parse_log("Compile time: 1500 ms\n").compile_time_s == 1.5
    assert parse_log("Compile time: 2 min\n").compile_time_s == 120.0
    assert parse_log("Compile time: 7\n").compile_time_s == 7.0
    for bad in ("nan sec", "inf sec", "-3 sec", "soon", "3 parsecs"):
        s = parse_log(f"Compile time: {bad}\n")
        assert s.compile_time_s is None
        assert s.unparsed == (f"line 1: compile time '{bad}' is not a time",)


def test_op_count_with_separators():
    assert parse_log("NEFF op count: 1,234\n").op_count == 1234
    assert parse_log("NEFF op count: 41.\n").op_count == 41


def test_instruction_count_needs_a_parenthesised_number():
    assert parse_log("Too many instructions after unroll for function sg0000 !\n").instruction_count is None
    assert parse_log("Error message:  Compiler generated too many instructions, this may due to x\n").instruction_count is None
    assert parse_log("Compiler generated too many instructions (6,888,787).\n").instruction_count == 6888787


def test_not_codes():
    s = parse_log("INFO 88 [job.Frontend.0]: wrote bir.json [sg0000] [root] [A1] [ABCDEF123] MODULE_NCC_EOOM001\n")
    assert s.diagnostics == ()


def test_first_code_on_a_line_wins_and_level_word_sets_severity():
    assert parse_log("[XCG815] see NCC_EOOM001\n").diagnostics == (Diagnostic("XCG815", "see NCC_EOOM001", 1),)
    assert parse_log("NCC_EOOM001 see [XCG815]\n").diagnostics == (Diagnostic("NCC_EOOM001", "see [XCG815]", 1),)
    assert parse_log("INFO [TEN404] x\n").diagnostics == (Diagnostic("TEN404", "x", 1, "info"),)
    assert parse_log("WARN [TEN404]: y\n").diagnostics == (Diagnostic("TEN404", "y", 1, "warning"),)


# --- state carried between lines ------------------------------------------------------------------


def test_traceback_state_transitions():
    log = (
        "Traceback (most recent call last):\n"  # 1: OUTSIDE -> FRAMES
        '  File "a.py", line 1, in <module>\n'
        "\n"  # 3: a blank line between frames does not end them
        '  File "b.py", line 2, in f\n'
        "OSError: disk full\n"  # 5: the exception line: FRAMES -> AFTER_EXCEPTION
        "\n"
        "\n"  # 6-7: blank lines after the exception are skipped
        "The above exception was the direct cause of the following exception:\n"  # 8: -> AFTER_CHAIN
        "\n"
        "Traceback (most recent call last):\n"  # 10: -> FRAMES again
        '  File "c.py", line 3, in g\n'
        "2026-01-05T16:25:37Z ERROR 7 [neuronx-cc]: Error message: gave up\n"  # 12: ends the traceback
        "    indented after the error line\n"  # 13-14: no longer a traceback, not kept
        "RuntimeError: retry failed\n"
    )
    s = parse_log(log)
    assert s.internal_errors == (
        InternalError("traceback", "Traceback (most recent call last):", 1),
        InternalError("traceback", '  File "a.py", line 1, in <module>', 2),
        InternalError("traceback", '  File "b.py", line 2, in f', 4),
        InternalError("traceback", "OSError: disk full", 5),
        InternalError("traceback", "The above exception was the direct cause of the following exception:", 8),
        InternalError("traceback", "Traceback (most recent call last):", 10),
        InternalError("traceback", '  File "c.py", line 3, in g', 11),
        InternalError("error", "Error message: gave up", 12),
    )
    assert s.status == "ERROR"
    assert failure_reason(s) == "gave up"


def test_nested_time_regions_close_innermost_first():
    s = parse_log(
        "Enter time region\n[x/A]: Enter time region\n[x/B]: Enter time region\n"
        + "".join(f"Exit time region: delta={n}s\n" for n in (1, 2, 3, 4))
    )
    # B and A name the untagged exits; the untagged Enter and the extra Exit get region_<n>.
    assert s.pass_times == {"B": 1.0, "A": 2.0, "region_1": 3.0, "region_2": 4.0}
    assert s.unparsed == ()


def test_running_pass_names_only_the_next_unnamed_finished_line():
    s = parse_log(
        "Running A\n"
        "B finished after 1s\n"  # another pass's name: A stays the running pass
        "finished after 2s\n"  # -> A, which is then done
        "finished after 3s\n"
        "Running C\n"
        "C finished after 4s\n"  # C is done
        "finished after 5s\n"
        "xRunning D\n"  # not a "Running" line
        "unfinished after 6s\n"  # not a "finished after" line
        "finished after 7s\n"
    )
    assert s.pass_times == {"B": 1.0, "A": 2.0, "C": 4.0}
    assert s.unparsed == tuple(f"line {n}: 'finished after' line without a pass name" for n in (4, 7, 10))


# --- robustness -----------------------------------------------------------------------------------


def test_binary_garbage():
    data = random.Random(20260501).randbytes(64 * 1024)
    s = parse_log(data)
    assert s.status is None
    assert s.diagnostics == ()
    expected_bad = sum(1 for ch in data.decode("utf-8", "surrogateescape") if 0xDC80 <= ord(ch) <= 0xDCFF)
    assert s.replaced_bytes == expected_bad > 20000
    assert s.lines == data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    assert s.unparsed[0].startswith(f"{expected_bad} non-UTF-8 byte(s) replaced with U+FFFD (first on line ")
    assert s.unparsed[-1] == f"no known compiler output found in {s.lines} line(s)"
    assert_json_clean(s)


def test_nul_bytes_and_control_characters():
    s = parse_log(b"\x00\x00Compiler status PASS\x00\n\x1b[31m[XCG815] red\x1b[0m\n")
    assert s.status == "PASS"
    assert s.diagnostics == (Diagnostic("XCG815", "red\x1b[0m", 2),)


def test_genuine_replacement_characters_are_not_counted():
    s = parse_log("caf\ufffd ok\n".encode())
    assert s.replaced_bytes == 0
    assert s.unparsed == ("no known compiler output found in 1 line(s)",)


def test_truncated_inside_a_multibyte_character():
    data = "Compiler status PASS\nGr\u00fc\u00dfe".encode()[:-2]  # cuts "ß" in half
    s = parse_log(data)
    assert s.status == "PASS"
    assert s.replaced_bytes == 1
    assert s.unparsed == (
        "1 non-UTF-8 byte(s) replaced with U+FFFD (first on line 2)",
        "log ends mid-line (no newline after line 2)",
    )


def test_every_prefix_of_every_fixture_parses():
    for path in sorted(LOGS.glob("*.log")):
        data = path.read_bytes()
        for end in range(0, len(data) + 1, 7):
            s = parse_log(data[:end])
            assert not any(n.startswith("internal parser error") for n in s.unparsed)


def test_caps_keep_output_small():
    text = "".join(f"[XCG815] boom {i}\n" for i in range(1500)) + "".join(
        f"Compiler status WHAT{i}\n" for i in range(30)
    )
    s = parse_log(text)
    assert len(s.diagnostics) == 1000
    assert s.unparsed[0] == "500 more diagnostics entries not kept (limit 1000)"
    assert s.unparsed[-1] == "... and 10 more notes"
    assert len(s.unparsed) == 1 + 20 + 1
    long = parse_log("[XCG815] " + "x" * 5000 + "\n")
    assert len(long.diagnostics[0].message) == 2003


def test_type_error_for_wrong_type():
    with pytest.raises(TypeError):
        parse_log(None)  # type: ignore[arg-type]


_FRAGMENTS = [
    b"Compiler status PASS", b"Compiler status: ", b"NEFF op count: ", b"Compile time: ", b" sec",
    b"[XCG815] ", b"NCC_EVRF007", b"too many instructions (", b")", b"Running ", b" finished after ",
    b"Exit time region: delta=", b"Enter time region", b"ERROR 12 [neuronx-cc]: ",
    b"Traceback (most recent call last):", b"  File", b"During handling of the above exception",
    b"INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: ", b"Using a cached neff at ",
    b"Got a cached failed neff at ", b"||: Compilation failed", b"[sg00/x]: ", b"\n", b"\r\n", b"\r",
    b"\x00", b"\xff", b"\xe9", b"\xc3", "\u00e9".encode(), b"1e308", b"-1", b"nan", b"0.5", b"6888787",
    b"  ", b":", b"[", b"]", b".", b"\xef\xbf\xbd",
]


def _check_never_raises(data: bytes) -> None:
    s = parse_log(data)
    assert not any(n.startswith("internal parser error") for n in s.unparsed), s.unparsed
    assert s.status in (None, "PASS", "ERROR")
    assert s.lines == data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
    assert_json_clean(s)
    format_summary(s, "fuzz.log")


def test_never_raises_seeded_random():
    rnd = random.Random(1234)
    for _ in range(3000):
        if rnd.random() < 0.3:
            data = rnd.randbytes(rnd.randint(0, 300))
        else:
            data = b"".join(rnd.choice(_FRAGMENTS) for _ in range(rnd.randint(0, 40)))
        _check_never_raises(data)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis is optional; the seeded loop above covers the same property
    pass
else:

    @settings(max_examples=500, deadline=None)
    @given(st.lists(st.one_of(st.binary(max_size=40), st.sampled_from(_FRAGMENTS)), max_size=40))
    def test_never_raises_hypothesis(parts):
        _check_never_raises(b"".join(parts))


def test_large_verbose_log_is_fast():
    chunk = "".join(
        f"2026-03-15T12:00:00Z INFO 901 [sg0000/Tensorizer/Pass{i}]: Running Pass{i}\n"
        f"2026-03-15T12:00:01Z INFO 901 [sg0000/Tensorizer/Pass{i}]: Pass{i} finished after 0.{i:03d} seconds\n"
        for i in range(100)
    ).encode()
    data = chunk * 500  # ~10 MB
    start = time.perf_counter()
    s = parse_log(data)
    elapsed = time.perf_counter() - start
    assert len(s.pass_times) == 100
    assert s.pass_times["Pass7"] == 3.5  # 500 x 0.007
    assert elapsed < 5.0, f"parsing {len(data)} bytes took {elapsed:.2f}s"


# --- to_json and the CLI --------------------------------------------------------------------------


def test_to_json_exact():
    doc = assert_json_clean(parse_fixture("summary_failed.log"))
    assert doc == {
        "status": "ERROR",
        "op_count": None,
        "compile_time_s": 191.25,
        "instruction_count": None,
        "pass_times": {},
        "diagnostics": [],
        "internal_errors": [],
        "cache_events": [],
        "compiler_command": None,
        "unparsed": ["line 2: NEFF op count 'n/a' is not an integer"],
        "lines": 4,
        "replaced_bytes": 0,
    }
    doc = parse_fixture("ncc_eoom001.log").to_json()
    assert doc["diagnostics"] == [
        {
            "code": "NCC_EOOM001",
            "message": "Out of device memory: estimated 21.7 GB of HBM needed, 16.0 GB available.",
            "line": 2,
            "severity": "error",
        }
    ]


def test_cli_human_summary(capsys):
    path = str(LOGS / "ncc_evrf007.log")
    assert parse_log_main(path, as_json=False) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        f"log: {path} (3 lines)",
        "status: ERROR",
        "reason: NCC_EVRF007: Compiler generated too many instructions (6888787). The limit is 5000000; "
        "reduce the batch or sequence length of this bucket.",
        "instruction count: 6888787",
    ]
    assert "  line 2: NCC_EVRF007 (error): Compiler generated too many instructions" in out


def test_cli_pass_times_and_unparsed(capsys):
    parse_log_main(str(LOGS / "verbose_passes.log"), as_json=False)
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = lines.index("pass times (top 5 of 5, seconds):")
    assert [line.split() for line in lines[start + 1 : start + 6]] == [
        ["Tensorizer", "9.500"], ["LoopFusion", "2.263"], ["constant_propagate", "0.003"],
        ["sched", "0.001"], ["DoNothing", "0.000"],
    ]
    assert "could not parse:\n  - line 11: pass time 'soon seconds' is not a time\n" in out


def test_cli_escapes_control_characters(capsys):
    parse_log_main(str(LOGS / "mixed_encoding.log"), as_json=False)
    out = capsys.readouterr().out
    assert "caf\ufffd model" in out
    s = parse_log(b"[XCG815] \x1b[31mred\n")
    assert "\x1b" not in format_summary(s, "x.log")
    assert "\\x1b[31mred" in format_summary(s, "x.log")


def test_cli_json(capsys):
    assert parse_log_main(str(LOGS / "wrapper_cache.log"), as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"schema": "neuron-build/parse-log/v1", **parse_fixture("wrapper_cache.log").to_json()}


def test_cli_missing_and_directory(tmp_path: Path):
    missing = tmp_path / "nope.log"
    with pytest.raises(FileNotFoundError, match=f"compiler log not found: {missing}"):
        parse_log_main(str(missing), as_json=False)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        parse_log_main(str(tmp_path), as_json=True)


def test_cli_refuses_binary_files_and_folders(tmp_path):
    blob = tmp_path / "model.neff"
    blob.write_bytes(bytes(range(256)) * 16)
    r = run_cli("parse-log", str(blob))
    assert r.returncode == 2 and f"{blob} is binary data, not a neuronx-cc log" in r.stderr
    r = run_cli("parse-log", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr
    r = run_cli("parse-log", str(LOGS / "mixed_encoding.log"), "--json")
    assert r.returncode == 0 and '"status"' in r.stdout
