"""The ``fresh`` gate's verdicts from a fresh-capture report (:func:`neuron_build.release.gates.fresh_gate`;
the capture itself is tests/flows/test_fresh_gate.py): a differing artifact fails naming its component, a
target that could not be keyed fails (fail closed), unverifiable targets are named but do not fail, and a
waiver lets a failure through with its reason."""

from __future__ import annotations

from neuron_build.release.gates import GATES, WAIVABLE, fresh_gate, waive


def report(*rows: tuple[str, str, str | None]) -> dict:
    targets = [{"target": t, "verdict": v, "component": c, "reason": f"{t} {v}"} for t, v, c in rows]
    return {"targets": targets, "probes": [{"model": "m", "targets": len(rows), "seconds": 1.0, "exit": 0}],
            "counts": {}, "clean": all(v not in ("differs", "unchecked") for _, v, _ in rows)}


def test_the_fresh_gate_is_listed_last_and_waivable():
    assert GATES[-1] == "fresh" and "fresh" in WAIVABLE


def test_a_differing_artifact_fails_the_gate_naming_the_graph():
    g = fresh_gate(object(), lambda rel: report(("m/b1/fp32/p1", "fresh", None), ("m/b2/fp32/p1", "differs", "graph")))
    assert not g.passed and g.message.startswith("1 artifact(s) not what today's code builds: m/b2/fp32/p1 graph")
    assert g.figures["not_fresh"] == [{"target": "m/b2/fp32/p1", "verdict": "differs", "component": "graph",
                                       "reason": "m/b2/fp32/p1 differs"}]
    w = waive(g, "on purpose")
    assert w.passed and str(w.verdict) == "waived" and w.figures["waiver_reason"] == "on purpose"


def test_a_target_the_probe_could_not_key_fails_the_gate():
    g = fresh_gate(object(), lambda rel: report(("m/b1/fp32/p1", "unchecked", None)))
    assert not g.passed and "m/b1/fp32/p1 unchecked" in g.message


def test_unverifiable_targets_are_named_and_do_not_fail_it():
    g = fresh_gate(object(), lambda rel: report(("m/b1/fp32/p1", "fresh", None), ("n/x/fp32/p1", "unverifiable", None)))
    assert g.passed and g.message == ("1 artifact(s) match a fresh capture of their graph; unverifiable (no graph "
                                      "key): n/x/fp32/p1")
    assert g.figures["unverifiable"] == ["n/x/fp32/p1"]


def test_without_a_check_the_gate_says_it_did_not_check():
    g = fresh_gate(object(), None)
    assert g.passed and g.figures == {"checked": False} and g.message.startswith("not checked")
