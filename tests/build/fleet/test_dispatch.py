"""The dispatch policy (neuron_build.build.fleet.dispatch) on small cases, checked against brute force."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from neuron_build.build.fleet.dispatch import NO_WORKER, Dispatcher, Job

GIB = 2**30


def run(d: Dispatcher, seconds: dict[str, float]) -> tuple[float, dict[str, tuple[float, float, str]]]:
    """Drive ``d`` on a discrete clock with true durations ``seconds``: (makespan, id -> (start, end, worker)),
    checking at every start that no worker holds more memory or jobs than it has."""
    events: list[tuple[float, str]] = []
    spans: dict[str, tuple[float, float, str]] = {}
    now = 0.0
    while True:
        for jid, w in d.assign(now):
            ws = d.workers[w]
            assert ws.free_memory >= 0 and len(ws.running) <= ws.slots
            spans[jid] = (now, now + seconds[jid], w)
            heapq.heappush(events, (now + seconds[jid], jid))
        if not events:
            return now, spans
        now, jid = heapq.heappop(events)
        d.finished(jid)


def brute_force_makespan(times: list[float], m: int) -> float:
    """The optimal makespan of independent jobs on ``m`` identical single-slot machines: every assignment."""
    best = float("inf")
    for assign in itertools.product(range(m), repeat=len(times)):
        loads = [0.0] * m
        for t, k in zip(times, assign, strict=True):
            loads[k] += t
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_longest_first_is_within_grahams_bound_of_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    m = rng.choice([2, 3])
    times = [float(rng.randint(1, 20)) for _ in range(rng.randint(m + 1, 7))]
    jobs = [Job(f"j{i}", t, GIB) for i, t in enumerate(times)]
    d = Dispatcher(jobs)
    for k in range(m):
        d.add_worker(f"w{k}", 8 * GIB, 1)
    makespan, spans = run(d, {j.id: j.seconds for j in jobs})
    opt = brute_force_makespan(times, m)
    assert len(spans) == len(jobs)
    assert makespan <= (4 / 3 - 1 / (3 * m)) * opt + 1e-9, (times, makespan, opt)


def test_longest_first_beats_matrix_order_on_the_long_job_submitted_last():
    # eight 1 s jobs then one 4 s job on two slots: FIFO ends at 8 s, longest-first at 6 s (the optimum)
    times = [1.0] * 8 + [4.0]
    jobs = [Job(f"j{i}", t, GIB) for i, t in enumerate(times)]
    fifo = Dispatcher([Job(j.id, 0.0, j.memory) for j in jobs])  # no prediction: matrix order
    lpt = Dispatcher(jobs)
    for d in (fifo, lpt):
        d.add_worker("w", 8 * GIB, 2)
    assert run(fifo, {j.id: j.seconds for j in jobs})[0] == 8.0
    assert run(lpt, {j.id: j.seconds for j in jobs})[0] == brute_force_makespan(times, 2) == 6.0


@pytest.mark.parametrize("seed", range(30))
def test_no_ready_job_waits_while_a_free_worker_could_take_it(seed):
    """After every assign (no reservations), brute force over every (ready job, free worker) pair: none fits."""
    rng = random.Random(seed)
    jobs = [Job(f"j{i}", float(rng.randint(1, 30)), rng.randint(1, 60) * GIB) for i in range(rng.randint(3, 14))]
    d = Dispatcher(jobs, max_reserved=0)
    d.add_worker("small", 64 * GIB, 3)
    d.add_worker("big", 128 * GIB, 2)
    events: list[tuple[float, str]] = []
    now = 0.0
    while True:
        for jid, _ in d.assign(now):
            heapq.heappush(events, (now + d.jobs[jid].seconds, jid))
        for jid in d.ready:
            for w in d.workers.values():
                assert not (w.free_slots > 0 and w.free_memory >= d.jobs[jid].memory), (jid, w.name)
        for w in d.workers.values():
            assert w.used == sum(d.jobs[j].memory for j in w.running) <= w.memory
        if not events:
            break
        now, jid = heapq.heappop(events)
        d.finished(jid)
    assert d.done == set(d.jobs)


def test_the_tightest_worker_takes_a_job_so_the_big_one_stays_free_for_a_big_job():
    d = Dispatcher([Job("small", 10.0, 10 * GIB), Job("huge", 5.0, 900 * GIB)])
    d.add_worker("big", 1024 * GIB, 2)
    d.add_worker("std", 256 * GIB, 2)
    assert sorted(d.assign(0.0)) == [("huge", "big"), ("small", "std")]


def test_a_model_priority_graph_goes_first_and_carries_its_longest_bucket():
    jobs = [Job("a/prio", 5.0, GIB), Job("a/b1", 50.0, GIB, after=("a/prio",)), Job("b/only", 30.0, GIB)]
    d = Dispatcher(jobs)
    assert d.rank["a/prio"] == 55.0 and d.priority("a/prio") == 55
    assert d.ready == ["a/prio", "b/only"]  # a/b1 waits for its priority graph
    d.add_worker("w", 8 * GIB, 1)
    assert d.assign(0.0) == [("a/prio", "w")]
    assert d.finished("a/prio") == ["a/b1"]
    assert d.assign(5.0) == [("a/b1", "w")]


def test_a_big_job_that_fits_no_free_worker_reserves_one_instead_of_starving():
    d = Dispatcher([Job("big", 100.0, 200 * GIB), Job("s1", 10.0, 100 * GIB), Job("s2", 9.0, 100 * GIB)])
    d.add_worker("w", 256 * GIB, 4)
    d.workers["w"].take("other", 100 * GIB)  # something else runs there
    assert d.assign(0.0) == []  # s1 would fit, but the worker is held for "big"
    d.workers["w"].drop("other")
    assert d.assign(1.0) == [("big", "w")]


def test_an_out_of_memory_kill_is_retried_once_on_a_bigger_worker_then_refused():
    d = Dispatcher([Job("t", 10.0, 100 * GIB)])
    d.add_worker("std", 256 * GIB, 1)
    d.add_worker("big", 2048 * GIB, 1)
    assert d.assign(0.0) == [("t", "std")]
    assert d.out_of_memory("t", peak_bytes=260 * GIB) is None  # over std's 256 GiB
    assert d.oom_retries == 1 and d.ready == ["t"]
    assert d.assign(5.0) == [("t", "big")]  # not std again, though it is free
    why = d.out_of_memory("t", peak_bytes=2000 * GIB)
    assert why is not None and why.startswith(NO_WORKER) and "\n" not in why
    assert d.refused == {"t": why} and d.done == {"t"} and d.assign(9.0) == []


def test_an_out_of_memory_kill_beside_other_compiles_is_retried_with_its_peak_reserved():
    d = Dispatcher([Job("t", 10.0, 100 * GIB), Job("u", 5.0, 100 * GIB)])
    d.add_worker("only", 256 * GIB, 2)
    assert sorted(d.assign(0.0)) == [("t", "only"), ("u", "only")]
    assert d.out_of_memory("t", 180 * GIB) is None  # 180 + 100 > 256: crowded, not too big
    assert d.assign(1.0) == []  # waits until u leaves room for 180 GiB
    d.finished("u")
    assert d.assign(5.0) == [("t", "only")] and d.workers["only"].used == 180 * GIB


def test_an_out_of_memory_kill_on_the_largest_worker_says_no_worker_big_enough():
    d = Dispatcher([Job("t", 10.0, 100 * GIB)])
    d.add_worker("only", 256 * GIB, 1)
    d.assign(0.0)
    why = d.out_of_memory("t", 300 * GIB)
    assert why == f"{NO_WORKER}: ran out of memory on a worker with 256 GiB and no worker has more; add a worker " \
                  "with more memory"
    assert d.oom_retries == 0


def test_a_job_larger_than_every_worker_is_refused_in_one_line():
    d = Dispatcher([Job("t", 10.0, 600 * GIB)])
    d.add_worker("w", 256 * GIB, 8)
    assert d.assign(0.0) == []
    assert d.refused == {"t": f"{NO_WORKER}: needs 600.0 GiB, the largest worker has 256 GiB"}


def test_a_compile_does_not_start_on_a_worker_retiring_before_its_p90():
    d = Dispatcher([Job("long", 3000.0, GIB, seconds_p90=4000.0), Job("short", 100.0, GIB, seconds_p90=150.0)])
    d.add_worker("old", 8 * GIB, 2, lifetime_end=1000.0)
    assert d.assign(0.0) == [("short", "old")]
    d.add_worker("new", 8 * GIB, 1, lifetime_end=5000.0)
    assert d.assign(10.0) == [("long", "new")]


def test_a_lost_worker_returns_its_jobs_to_the_queue_not_as_failures():
    d = Dispatcher([Job("a", 10.0, GIB), Job("b", 5.0, GIB)])
    d.add_worker("w1", 8 * GIB, 2)
    assert sorted(d.assign(0.0)) == [("a", "w1"), ("b", "w1")]
    assert d.lose_worker("w1") == ["a", "b"]
    assert d.done == set() and d.refused == {} and d.ready == ["a", "b"]
    d.add_worker("w2", 8 * GIB, 1)
    assert d.assign(1.0) == [("a", "w2")]


def test_an_uncertain_job_goes_out_before_a_known_one_of_the_same_p50():
    # the same p50; "cold" (a never-built model, predicted by the prior) may run far longer: its p90 ranks it
    d = Dispatcher([Job("known", 600.0, GIB, seconds_p90=700.0), Job("cold", 600.0, GIB, seconds_p90=3000.0)])
    d.add_worker("w", 8 * GIB, 1)
    assert d.assign(0.0) == [("cold", "w")]


def test_a_revised_prediction_reorders_the_queue_and_keeps_an_out_of_memory_floor():
    d = Dispatcher([Job("a", 100.0, 10 * GIB), Job("b", 50.0, 10 * GIB), Job("c", 10.0, 10 * GIB)])
    d.add_worker("w", 100 * GIB, 1)
    assert d.assign(0.0) == [("a", "w")]
    assert not d.revise("a", 1.0, GIB)  # running: kept as it is
    assert d.revise("c", 500.0, 20 * GIB, seconds_p90=900.0) and d.ready == ["c", "b"]
    assert d.jobs["c"].memory == 20 * GIB and d.priority("c") == 900
    assert d.out_of_memory("a", 60 * GIB) is None  # killed at 60 GiB beside nothing else: back in the queue
    assert d.revise("a", 100.0, 5 * GIB, memory_p50=4 * GIB) and d.jobs["a"].memory == 60 * GIB
    assert d.jobs["a"].memory_p50 == 60 * GIB
