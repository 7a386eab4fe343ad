"""The compile fleet, simulated: neuron-build's real dispatch policy and predictor against simulated workers.

A discrete-event clock (no sleeping) drives :class:`neuron_build.build.fleet.dispatch.Dispatcher` exactly as the Dask
executor does (workers join and leave, compiles finish or are killed for memory) over a synthetic release:

* **10,000 targets** in models of one priority graph followed by its buckets (NxD's ``ModelBuilder.trace``:
  the priority HLO first, then the fan-out). Families (``../shared/compile-fleet.md`` §6, [guess] parameters
  anchored on §1's public numbers): 60 % small (median 3 min, 4-24 GiB), 30 % mid (20 min, 24-96 GiB), 10 %
  large (50 min, 96-400 GiB), 0.5 % of all targets pathological at 3-4 h. Times are log-normal per model
  and per target (a model-size factor, a bucket-size factor ``tokens^0.3`` and noise), peak memory correlated
  with time (rho 0.6 in log space).
* **40 hosts**: 30 x (256 GiB, 8 slots), 10 x (2 TiB, 16 slots).

Runs (each the same targets and hosts):

* ``fifo``: today's order (matrix order, no ranks, no reservations), true peak memory reserved;
* ``lpt_oracle``: the dispatch policy with the true durations and peaks;
* ``lpt_predicted``: the dispatch policy with :class:`neuron_build.build.fleet.predict.Predictor` trained on the
  ledger of a previous release (the same targets under other keys: time x exp(N(0, 0.5)), peak x
  exp(N(0, 0.1))); 20 % of the models were never built (their targets get the size prior); each compile that
  ends is shown to the predictor (``Predictor.observe``, what its ledger record would say) and the model's
  targets not started yet are revised (``Dispatcher.revise``) when the predictor now sizes them from the model;
* ``host_loss``: as ``lpt_predicted``, with Slurm-style 12 h walltimes (workers retire at 11 h 50 m with a
  few minutes of stagger, ``--lifetime``, and are replaced at once) and Spot loss at 1 %/h on half the hosts
  (replaced 10 min later); a lost compile goes back to the queue 60 s after the loss (the lease expiry).

A compile whose true peak exceeds what its worker has free when it starts is killed for memory halfway through
(and retried as the dispatcher decides). The lower bound is the largest of the longest job, the total work over
the total slots, the total memory-time over the total memory, and the longest chain (a priority graph plus its
longest bucket). ``double_compiles`` counts a compile started while another copy of its key runs (the lease);
``lost_artifacts`` counts jobs marked done whose artifact was never published.

    .venv/bin/python benchmarks/fleet_sim.py --json [--targets 10000] [--seed 1] [--runs fifo,lpt_oracle]

Goals (issue 32): lpt_oracle <= 1.10 x the lower bound, lpt_predicted <= 1.25, host_loss <= 1.35,
double_compiles and lost_artifacts 0, under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neuron_build.build.fleet.dispatch import Dispatcher, Job
from neuron_build.build.fleet.predict import Predictor
from neuron_build.store.ledger import LedgerRecord

GIB = 2**30
HOUR = 3600.0
#: family -> (share of targets, median minutes, sigma of log time, memory range GiB, model size figure)
FAMILIES = {
    "small": (0.6, 3.0, 0.6, (4, 24), 1e9),
    "mid": (0.3, 20.0, 0.6, (24, 96), 1.3e10),
    "large": (0.1, 50.0, 0.7, (96, 400), 7e10),
}
HOSTS = [("std", 256 * GIB, 8, 30), ("big", 2048 * GIB, 16, 10)]
BUCKETS = [(b, s) for b in (1, 2, 4, 8, 16) for s in (128, 256, 512, 1024, 2048)]  # 25 per model at most
RHO = 0.6
#: the longest compile outside the pathological 0.5 % (those run 3-4 h)
MAX_REGULAR_S = 2.5 * 3600
WALLTIME_S = 12 * HOUR
LIFETIME_S = WALLTIME_S - 600.0
LOSS_PER_H = 0.01
REPLACE_AFTER_S = 600.0
LEASE_EXPIRY_S = 60.0


@dataclass
class Truth:
    id: str
    model: str
    seconds: float
    memory: int
    after: tuple[str, ...]
    size: float


def workload(n: int, rng: random.Random) -> tuple[list[Truth], dict[str, float], list[str]]:
    """(targets in matrix order, model -> size figure, families in model order)."""
    out: list[Truth] = []
    sizes: dict[str, float] = {}
    fams = list(FAMILIES)
    weights = [FAMILIES[f][0] for f in fams]
    i = 0
    while len(out) < n:
        fam = rng.choices(fams, weights)[0]
        _, med_min, sigma, (lo, hi), size0 = FAMILIES[fam]
        name = f"{fam}{i}"
        i += 1
        z_model = rng.gauss(0, 1)
        sizes[name] = size0 * math.exp(0.5 * z_model)
        nb = min(rng.randint(10, 25), n - len(out))
        buckets = sorted(rng.sample(BUCKETS, nb), key=lambda bs: -bs[0] * bs[1])
        prio = None
        for j, (b, s) in enumerate(buckets):
            tokens_f = ((b * s) / 2048) ** 0.3
            z = 0.6 * z_model + rng.gauss(0, 0.8)  # sd ~1 in total: sigma is the family's
            secs = min(med_min * 60 * math.exp(sigma * z) * tokens_f, MAX_REGULAR_S)
            zm = RHO * z + math.sqrt(1 - RHO**2) * rng.gauss(0, 1)
            mem = math.sqrt(lo * hi) * math.exp(zm * math.log(hi / lo) / 4)
            mem = min(max(mem, lo), hi) * GIB
            tid = f"{name}/b{b}-s{s}/bf16/o2"
            out.append(Truth(tid, name, secs, int(mem), (prio,) if prio else (), sizes[name]))
            if j == 0:
                prio = tid
    for t in rng.sample(out, max(1, n // 200)):  # 0.5 % pathological: 3-4 h
        t.seconds = rng.uniform(3 * HOUR, 4 * HOUR)
    return out, sizes, fams


def lower_bound(truth: list[Truth]) -> float:
    slots = sum(s * k for _, _, s, k in HOSTS)
    memory = sum(m * k for _, m, _, k in HOSTS)
    by_id = {t.id: t for t in truth}
    chain = max(t.seconds + (by_id[t.after[0]].seconds if t.after else 0.0) for t in truth)
    return max(max(t.seconds for t in truth), sum(t.seconds for t in truth) / slots,
               sum(t.seconds * t.memory for t in truth) / memory, chain)


def history(truth: list[Truth], rng: random.Random, cold_share: float = 0.2) -> list[LedgerRecord]:
    """The ledger of the previous release: every target of 80 % of the models, under another key."""
    models = sorted({t.model for t in truth})
    cold = set(rng.sample(models, int(len(models) * cold_share)))
    recs = []
    for t in truth:
        if t.model in cold:
            continue
        recs.append(LedgerRecord(target=t.id, key="0" * 64, event="compile", status="PASS",
                                 time="2026-11-01T00:00:00+00:00", backend="neuron",
                                 compile_time_s=t.seconds * math.exp(rng.gauss(0, 0.5)),
                                 peak_rss_bytes=int(t.memory * math.exp(rng.gauss(0, 0.1)))))
    return recs


def predicted_job(t: Truth, p) -> Job:
    """The dispatcher's job for target ``t`` from its prediction ``p``."""
    return Job(t.id, p.seconds or 0.0, p.peak_bytes, seconds_p90=p.seconds_p90, after=t.after,
               memory_p50=p.peak_p50_bytes)


def simulate(truth: list[Truth], jobs: list[Job], rng: random.Random, max_reserved: int,  # noqa: C901 (one event loop)
             host_loss: bool = False, predictor: Predictor | None = None) -> dict:
    """Run one dispatch over the simulated fleet; returns makespan and counters. With ``predictor``, each compile
    that ends is shown to it (its time and peak, as its ledger record would say; only the peak of one killed
    for memory) and the model's targets not started yet that it now predicts from the model are revised."""
    by_id = {t.id: t for t in truth}
    of_model: dict[str, list[Truth]] = {}
    for t in truth:
        of_model.setdefault(t.model, []).append(t)

    def learn(jid: str, seconds: float | None) -> None:
        if predictor is None:
            return
        predictor.observe(jid, backend="neuron", seconds=seconds, peak_bytes=by_id[jid].memory)
        for t in of_model[by_id[jid].model]:
            if t.id in running or t.id in d.done:
                continue
            p = predictor.predict(t.id, key="1" * 64, backend="neuron")
            if p.source == "model":
                j = predicted_job(t, p)
                d.revise(t.id, j.seconds, j.memory, seconds_p90=j.seconds_p90, memory_p50=j.memory_p50)

    d = Dispatcher(jobs, max_reserved=max_reserved, max_lifetime=LIFETIME_S if host_loss else None)
    give_up = 10 * lower_bound(truth)
    events: list[tuple[float, int, str, tuple]] = []
    seq = 0

    def at(when: float, kind: str, *payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, kind, payload))

    counter = 0
    spot: set[str] = set()

    def join(now: float, kind: str) -> None:
        nonlocal counter
        _, mem, slots, _ = next(h for h in HOSTS if h[0] == kind)
        counter += 1
        name = f"{kind}-{counter}"
        life = None
        if host_loss:
            life = now + LIFETIME_S + rng.uniform(-240, 0)
            at(now + WALLTIME_S - 60 + rng.uniform(-240, 0), "retire", name, kind)
            if counter % 2 == 0:  # half the hosts are Spot
                spot.add(name)
                at(now + rng.expovariate(LOSS_PER_H / HOUR), "loss", name, kind)
        d.add_worker(name, mem, slots, life)

    for kind, _, _, k in HOSTS:
        for _ in range(k):
            join(0.0, kind)
    running: dict[str, tuple[str, int]] = {}  # job -> (worker, token)
    true_used: dict[str, int] = {}  # worker -> true peak memory of what runs there
    published: set[str] = set()
    alive: dict[str, int] = {}  # job -> copies running now
    double = oom_kills = 0
    tokens = 0
    now = 0.0
    finished_at = 0.0

    def start_all() -> None:
        nonlocal double, tokens, oom_kills
        for jid, w in d.assign(now):
            t = by_id[jid]
            tokens += 1
            if alive.get(jid):
                double += 1
            alive[jid] = alive.get(jid, 0) + 1
            running[jid] = (w, tokens)
            cap = d.workers[w].memory
            if true_used.get(w, 0) + t.memory > cap:  # the true peak does not fit: killed halfway
                at(now + t.seconds / 2, "oom", jid, tokens)
                true_used[w] = true_used.get(w, 0) + min(t.memory, cap - true_used.get(w, 0))
            else:
                true_used[w] = true_used.get(w, 0) + t.memory
                at(now + t.seconds, "done", jid, tokens)

    def stop(jid: str) -> str:
        w, _ = running.pop(jid)
        alive[jid] -= 1
        true_used[w] = max(true_used.get(w, 0) - by_id[jid].memory, 0)
        return w

    start_all()
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > give_up:  # a policy that never finishes: report what is left
            break
        if kind in ("done", "oom"):
            jid, token = payload
            if running.get(jid, (None, None))[1] != token:
                continue  # its worker was lost: this event is stale
            stop(jid)
            if kind == "done":
                published.add(jid)
                learn(jid, by_id[jid].seconds)
                d.finished(jid)
                finished_at = now
            else:
                oom_kills += 1
                learn(jid, None)
                d.out_of_memory(jid, by_id[jid].memory)
        elif kind in ("loss", "retire"):
            name, hk = payload
            if name not in d.workers:
                continue
            lost = [j for j, (w, _) in running.items() if w == name]
            for j in lost:
                stop(j)  # the compile dies with its host; its lease expires
            d.drain(name)  # takes nothing more
            at(now + LEASE_EXPIRY_S, "requeue", name)
            true_used.pop(name, None)
            if len(d.done) < len(d.jobs):
                at(now + (REPLACE_AFTER_S if kind == "loss" else 0.0), "join", hk)
        elif kind == "requeue":
            d.lose_worker(payload[0])
        elif kind == "join":
            if len(d.done) < len(d.jobs):
                join(now, payload[0])
        start_all()
        if len(d.done) == len(d.jobs) and not running:
            break
    lost_artifacts = sum(1 for j in d.done if j not in published and j not in d.refused)
    return {"makespan_s": round(finished_at, 1), "oom_retries": d.oom_retries, "oom_kills": oom_kills,
            "refused": len(d.refused), "unfinished": len(d.jobs) - len(d.done), "double": double,
            "lost": lost_artifacts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default prints it too)")
    ap.add_argument("--targets", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", default="fifo,lpt_oracle,lpt_predicted,host_loss")
    ap.add_argument("--max-reserved", type=int, default=4)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    rng = random.Random(a.seed)
    truth, sizes, _ = workload(a.targets, rng)
    lb = lower_bound(truth)
    recs = history(truth, random.Random(a.seed + 1))
    pred = Predictor(recs, default_peak_bytes=64 * GIB, sizes=sizes)
    predicted = {t.id: pred.predict(t.id, key="1" * 64, backend="neuron") for t in truth}
    sources = {}
    for p in predicted.values():
        sources[p.source] = sources.get(p.source, 0) + 1
    runs: dict[str, dict] = {}
    double = lost = 0
    for name in a.runs.split(","):
        if name == "fifo":
            jobs = [Job(t.id, 0.0, t.memory, after=t.after) for t in truth]
            res = simulate(truth, jobs, random.Random(a.seed + 2), max_reserved=0)
        elif name == "lpt_oracle":
            jobs = [Job(t.id, t.seconds, t.memory, after=t.after) for t in truth]
            res = simulate(truth, jobs, random.Random(a.seed + 2), max_reserved=a.max_reserved)
        elif name in ("lpt_predicted", "host_loss"):
            jobs = [predicted_job(t, predicted[t.id]) for t in truth]
            res = simulate(truth, jobs, random.Random(a.seed + 2), max_reserved=a.max_reserved,
                           host_loss=name == "host_loss",
                           predictor=Predictor(recs, default_peak_bytes=64 * GIB, sizes=sizes))
        else:
            ap.error(f"unknown run {name!r}: give fifo, lpt_oracle, lpt_predicted or host_loss")
        double += res.pop("double")
        lost += res.pop("lost")
        runs[name] = {"makespan_s": res["makespan_s"], "lower_bound_s": round(lb, 1),
                      "makespan_over_lb": round(res["makespan_s"] / lb, 3), **res}
    doc = {"targets": len(truth), "hosts": sum(k for *_, k in HOSTS), "seed": a.seed, "predicted_from": sources,
           "runs": runs, "double_compiles": double,
           "lost_artifacts": lost, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
