"""Promotion (compare-and-swap) and rollback on the tiny project: racing promotions, a moving channel, the serving torch checked before a promotion."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from neuron_build.errors import UserError
from neuron_build.project.config import load_project
from neuron_build.release import (
    SWAP_ATTEMPTS,
    PromotionRefused,
    channel_history,
    channel_pointer,
    promote,
    rollback,
)
from neuron_build.store.local import LocalStore
from tests.helpers.releases import ACTOR, ctx, gate, make, refused, set_release_config, validate_all


def test_unknown_channel_and_source(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    with pytest.raises(UserError, match=r"unknown channel 'qa' \(--to\); channels under \[release\] in "
                                        r"buckets.toml: dev, staging, prod"):
        promote(store, settings, "tiny", "qa", release=r1["id"])
    with pytest.raises(UserError, match="channel 'dev' of model 'tiny' holds no release yet"):
        promote(store, settings, "tiny", "staging", from_channel="dev")
    with pytest.raises(UserError, match="no release 'r-0000000000000000' of model 'tiny'"):
        promote(store, settings, "tiny", "dev", release="r-0000000000000000")
    with pytest.raises(UserError, match="either a RELEASE id or --from CHANNEL"):
        promote(store, settings, "tiny", "dev")
    assert store.history("tiny", "qa") == []


def _race(cfg: str, release: str, barrier, queue) -> None:
    os.environ["NEURON_BUILD_ACTOR"] = f"racer-{release}"
    project = load_project(cfg)
    store = LocalStore(project.store_url())
    try:
        e = promote(store, project.config.release, "tiny", "dev", release=release, allow_unvalidated=True,
                    reason=f"race {release}", before_swap=lambda: barrier.wait(timeout=120))
        queue.put(("won", release, e.version, ""))
    except PromotionRefused as ex:
        queue.put(("lost", release, ex.entry["version"], str(ex)))
    except BaseException as ex:  # report anything else to the test instead of hanging it
        queue.put(("error", release, None, repr(ex)))


def test_two_racing_promotions_both_land_each_checked_against_the_other(proj):
    """Two promotions read the empty channel at once; exactly one compare-and-swap wins. The loser reads
    the channel again, checks its gates again against the winner's release, and lands on top of it."""
    _, _, store, _ = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    mp = multiprocessing.get_context("spawn")
    barrier, queue = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=_race, args=(str(proj), r["id"], barrier, queue)) for r in (r1, r2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == ["won", "won"], results
    first, second = sorted(results, key=lambda r: r[2])
    assert (first[2], second[2]) == (1, 2)
    ptr = channel_pointer(store, "tiny", "dev")
    assert (ptr["release"], ptr["version"], ptr["previous"]) == (second[1], 2, first[1])
    hist = channel_history(store, "tiny", "dev")
    assert [(h["action"], h["from"], h["to"], h["version"]) for h in hist] == [
        ("promote", None, first[1], 1), ("promote", first[1], second[1], 2)]
    assert all(g["passed"] for h in hist for g in h["gates"])


def test_a_promotion_gives_up_on_a_channel_that_keeps_moving(proj, monkeypatch):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    calls = []

    def always_lose(model, channel, pointer, expected):
        calls.append(expected)
        return False

    monkeypatch.setattr(store, "swap_channel", always_lose)
    with pytest.raises(PromotionRefused) as ei:
        promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    assert len(calls) == SWAP_ATTEMPTS
    assert str(ei.value) == (f"tiny/dev moved {SWAP_ATTEMPTS} times while this promotion of {r1['id']} was being "
                             f"checked (compare-and-swap lost each time); nothing changed. Re-run the promotion")
    assert channel_pointer(store, "tiny", "dev") is None
    assert [h["action"] for h in channel_history(store, "tiny", "dev")] == ["refuse"]


def test_rollback_restores_previous_release(proj):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    for r in (r1, r2):
        validate_all(store, r)
    with pytest.raises(UserError, match="tiny/dev holds no release; nothing to roll back"):
        rollback(store, settings, "tiny", "dev")
    promote(store, settings, "tiny", "dev", release=r1["id"], reason="first")
    with pytest.raises(UserError, match=f"tiny/dev has held only {r1['id']}; there is no earlier release"):
        rollback(store, settings, "tiny", "dev")
    promote(store, settings, "tiny", "dev", release=r2["id"], reason="bf16")
    e = rollback(store, settings, "tiny", "dev", reason="bf16 too slow")
    assert (e["from"], e["to"], e["version"], e["action"]) == (r2["id"], r1["id"], 3, "rollback")
    ptr = channel_pointer(store, "tiny", "dev")
    assert (ptr["release"], ptr["version"], ptr["previous"], ptr["action"]) == (r1["id"], 3, r2["id"], "rollback")
    # rolling back again has nowhere to go: the stack is back to [r1]
    with pytest.raises(UserError, match="has held only"):
        rollback(store, settings, "tiny", "dev")
    # r2 was rolled back: promoting it again needs a reason; then a rollback returns to r1 again
    with pytest.raises(PromotionRefused, match=f"release {r2['id']} was rolled back from tiny/dev at .* "
                                               r'\("bf16 too slow"\); promoting it again needs --reason TEXT'):
        promote(store, settings, "tiny", "dev", release=r2["id"])
    e = promote(store, settings, "tiny", "dev", release=r2["id"], reason="fixed the slow path")
    assert [(x["channel"], x["reason"]) for x in e.extra["rolled_back"]] == [("dev", "bf16 too slow")]
    assert rollback(store, settings, "tiny", "dev")["to"] == r1["id"]
    hist = channel_history(store, "tiny", "dev")
    assert [(h["action"], h["from"], h["to"], h["version"]) for h in hist] == [
        ("promote", None, r1["id"], 1), ("promote", r1["id"], r2["id"], 2), ("rollback", r2["id"], r1["id"], 3),
        ("refuse", r1["id"], r2["id"], 3), ("promote", r1["id"], r2["id"], 4), ("rollback", r2["id"], r1["id"], 5)]
    assert hist[2]["reason"] == "bf16 too slow" and hist[2]["who"] == ACTOR


def test_rollback_refuses_when_artifacts_are_gone(proj):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    store.quarantine(r1["artifacts"][0]["key"], "test")
    with pytest.raises(UserError, match=f"cannot roll tiny/dev back to {r1['id']}: artifacts missing from the "
                                        f"store: tiny/b1/fp32/p1"):
        rollback(store, settings, "tiny", "dev")
    assert channel_pointer(store, "tiny", "dev")["release"] == r2["id"]
    with pytest.raises(UserError, match=f"release {r1['id']} cannot be promoted: artifacts missing from the "
                                        f"store: tiny/b1/fp32/p1"):
        promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")


def test_promote_refuses_a_release_built_for_another_serving_torch(proj):
    import importlib.metadata as md

    torch_v = md.version("torch")
    set_release_config(proj, 'serving = { torch = "2.12.*" }\nchannel_serving = { staging = { torch = "2.13.*" } }')
    _, _, store, settings = ctx(proj)
    assert settings.serving_for("dev") == {"torch": "==2.12.*"}
    r1 = make(proj)
    e = refused(store, settings, "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    g = gate(e, "serving_toolchain")
    assert not g["passed"]
    assert g["message"] == (f"built with torch {torch_v}, but channel 'dev' serves torch==2.12.* "
                            f"([release] serving / channel_serving)")
    assert f"FAIL serving_toolchain: built with torch {torch_v}" in e["message"]
    settings = settings.model_copy(update={"allow_skip": True})
    ok = promote(store, settings, "tiny", "staging", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    assert gate(ok, "serving_toolchain")["passed"]


def test_serving_config_errors(proj):
    from neuron_build.errors import ConfigError

    set_release_config(proj, 'channel_serving = { qa = { torch = "2.13.*" } }\nserving = { torch = "two" }')
    with pytest.raises(ConfigError) as ei:
        load_project(proj)
    text = str(ei.value)
    assert "release.serving: torch = 'two' is not a version specifier" in text
    assert "release.channel_serving: names channel 'qa', which is not in channels (dev, staging, prod)" in text

