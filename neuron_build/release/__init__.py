"""Releases, channels, gates, promotion, rollback, history and pull.

Domain code: no doit, no torch. Store layout (``shared/DESIGN.md``)::

    <store>/releases/<model>/<release id>.json        immutable release records
    <store>/channels/<model>/<channel>.json           the channel pointer: {"release", "version", ...}
    <store>/channels/<model>/<channel>.lock           taken while a pointer is checked and swapped
    <store>/channels/<model>/<channel>.history.jsonl  one JSON line per promotion, refusal and rollback

A **release** names the artifact keys of all of one model's buckets for one dtype, profile and backend,
with their files, the toolchain, what the runtime needs (input specs, pad values, serving options) and
summary metrics. Its id is ``r-`` + the first 16 hex digits of the sha256 over the canonical JSON of its
content (model, dtype, profile, backend, hardware target, artifacts, toolchain, runtime): releasing the
same artifacts twice gives the same id, and the record first written stays (created time, creator, git
commit and metrics are not part of the id).

A **promotion** reads the channel's pointer, evaluates the gates against the release it points at, then
takes ``<channel>.lock`` and swaps the pointer only if its ``version`` is still the one it read
(compare-and-swap). Of two promotions that read the same version, exactly one wins; the other is refused
with the winner named. Every promotion, refused promotion and rollback is appended to the channel's
history.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable

from filelock import Timeout

from neuron_build.artifact import artifact_file
from neuron_build.project.config import Project, ReleaseSettings
from neuron_build.errors import UserError
from neuron_build.release.gates import GateCheck, latency_gate, validation_gate
from neuron_build.project.keys import canonical_json, diff_components, sha256_hex
from neuron_build.store.manifest import MANIFEST
from neuron_build.status import Status
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import age, percentile, read_json, swap_in_folder, utc_now

RELEASE_FORMAT = 1
PULL_FORMAT = 1
#: Seconds a promotion or rollback waits for another one on the same channel to finish.
LOCK_TIMEOUT_S = 120.0
#: The order in which promotion gates are evaluated and reported.
GATES = ("channel_order", "validated", "artifact_count", "op_count", "p99_latency", "compile_time_p95")


class PromotionRefused(UserError):
    """A promotion that did not move the channel: a gate failed, or another promotion won the race.

    Attributes:
        entry: the history line recorded for the refusal (``gates`` holds every gate's verdict).
    """

    def __init__(self, message: str, entry: dict[str, Any]):
        super().__init__(message)
        self.entry = entry


# --------------------------------------------------------------------------------------------------
# small helpers

def actor() -> str:
    """Who acts: ``$NEURON_BUILD_ACTOR`` when set (e.g. the CI user), else ``user@host``."""
    env = os.environ.get("NEURON_BUILD_ACTOR")
    if env:
        return env
    try:
        user = getpass.getuser()
    except Exception:
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def git_state(folder: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding ``folder``; (None, None) when it is not one or git is
    missing. ``dirty`` is True when ``git status --porcelain`` lists anything."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return None, None
        st = subprocess.run(["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True,
                            timeout=60)
        return head.stdout.strip(), (bool(st.stdout.strip()) if st.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def release_id(content: dict[str, Any]) -> str:
    """``r-`` + the first 16 hex digits of the sha256 over the canonical JSON of ``content``."""
    return "r-" + sha256_hex(canonical_json(content))[:16]


#: The fields of a release record that its id is derived from.
ID_FIELDS = ("format", "model", "dtype", "profile", "backend", "hardware_target", "artifacts", "toolchain",
             "runtime")


def channel_pointer(store: ArtifactStore, model: str, channel: str) -> dict[str, Any] | None:
    """The pointer of a channel (``{"release", "version", "time", "who", ...}``), or None when the channel
    has never held a release."""
    return store.channel(model, channel)


def channel_history(store: ArtifactStore, model: str, channel: str) -> list[dict[str, Any]]:
    """Every history line of a channel, oldest first (unparsable lines are skipped)."""
    return store.history(model, channel)


# --------------------------------------------------------------------------------------------------
# releases

def _pick(what: str, given: str | None, allowed: tuple[str, ...], model: str, flag: str) -> str:
    if given is not None:
        if given not in allowed:
            raise UserError(f"model '{model}' is not built for {what} '{given}'; its {what}s in buckets.toml: "
                            f"{', '.join(allowed)}")
        return given
    if len(allowed) == 1:
        return allowed[0]
    raise UserError(f"model '{model}' has several {what}s ({', '.join(allowed)}); choose one with {flag}")


def _known_model(project: Project, model: str) -> None:
    if model not in project.config.models:
        raise UserError(f"unknown model '{model}' in {project.path}; models: {', '.join(project.config.models)}")


def _candidates(builder, target) -> tuple[dict[str, str], str | None]:
    """The artifacts a bucket can be released from: ({toolchain JSON: key}, None), or ({}, problem).

    Candidates are the target's current key when the store holds it, and the key the target was last
    built with when that build passed and differs from this checkout only in the toolchain (a store filled
    by another host's toolchain). With neither, the bucket is missing or failed.
    """
    store: ArtifactStore = builder.store
    ki = builder.key(target)
    out: dict[str, str] = {}
    if store.is_complete(ki.key):
        out[canonical_json(ki.details["toolchain"]).decode()] = ki.key
    rec = store.target(target.id)
    stale: list[str] = []
    if rec and rec.status == Status.PASS and rec.key != ki.key and rec.details is not None \
            and store.is_complete(rec.key):
        changed = diff_components(rec.details, ki.details)
        if all(c.split(":")[0] == "toolchain" for c in changed):
            out.setdefault(canonical_json(rec.details["toolchain"]).decode(), rec.key)
        else:
            stale = changed
    if out:
        return out, None
    fail = store.failure(target.id)
    if fail and fail.key == ki.key:
        return {}, f"failed: {fail.status}: {fail.reason}".rstrip(": ")
    if stale:
        return {}, (f"missing: not built for this checkout (changed since its last build: {'; '.join(stale)}); "
                    f"run `neuron-build build {target.id}`")
    return {}, f"missing: not built (key {ki.key[:12]}); run `neuron-build build {target.id}`"


def _toolchain_text(tc_json: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(json.loads(tc_json).items()))


def _summary(store: ArtifactStore, key: str, manifest) -> dict[str, Any]:
    validation = {kind: r.get("verdict") for kind, r in store.results(key, "validation").items()}
    bench = {}
    for name, r in store.results(key, "bench").items():
        lat = r.get("latency_ms") or {}
        bench[name] = {k: lat.get(k) for k in ("p50", "p90", "p99", "mean") if k in lat}
        if "throughput_per_s" in r:
            bench[name]["throughput_per_s"] = r["throughput_per_s"]
    mt = manifest.metrics
    return {"op_count": mt.op_count, "op_count_source": mt.op_count_source, "compile_time_s": mt.compile_time_s,
            "artifact_bytes": mt.artifact_bytes, "peak_rss_bytes": mt.peak_rss_bytes, "validation": validation,
            "bench": bench}


def _artifact_file(manifest) -> tuple[str, str]:
    """(file name, loader) of the loadable model in an artifact (:func:`neuron_build.artifact.artifact_file`)."""
    found = artifact_file(manifest.compiler, manifest.files)
    if found is None:
        raise UserError(f"artifact {manifest.key[:12]} ({manifest.target}) holds no model.pt or model.pt2; "
                        f"files: {', '.join(manifest.files)}")
    return found


def create_release(builder, model: str, dtype: str | None = None, profile: str | None = None,
                   creator: str | None = None) -> dict[str, Any]:
    """Record an immutable release of all of ``model``'s buckets for one dtype and profile (and the
    builder's backend), or return the existing record with the same content.

    Args:
        builder: a :class:`neuron_build.build.builder.Builder` (its backend decides which keys are released).
        dtype, profile: required when the model has several.
        creator: recorded as who made it; default :func:`actor`.

    Returns:
        The release record (see the module docstring); also written to
        ``<store>/releases/<model>/<id>.json``.

    Raises:
        UserError: unknown model, dtype or profile; or a bucket that is missing, failed, or built with a
            different toolchain than the others (every offending target is named).
    """
    project: Project = builder.project
    store: ArtifactStore = builder.store
    _known_model(project, model)
    spec = project.config.models[model]
    unchosen = [f"{flag} ({', '.join(allowed)})" for given, allowed, flag in
                ((dtype, spec.dtypes, "--dtype"), (profile, spec.profiles, "--profile"))
                if given is None and len(allowed) > 1]
    if unchosen:
        raise UserError(f"model '{model}' is built for several dtypes or profiles; choose with "
                        f"{' and '.join(unchosen)}")
    dtype = _pick("dtype", dtype, spec.dtypes, model, "--dtype")
    profile = _pick("profile", profile, spec.profiles, model, "--profile")
    targets = [t for t in builder.targets if t.model == model and t.dtype == dtype and t.profile == profile]
    combo = f"{model} {dtype}/{profile} ({builder.keys.backend})"

    problems: list[str] = []
    cands: dict[str, dict[str, str]] = {}
    for t in targets:
        c, problem = _candidates(builder, t)
        if problem:
            problems.append(f"{t.id}: {problem}")
        else:
            cands[t.id] = c
    found: list[tuple[Any, str, Any]] = []
    if not problems:
        # one toolchain for every bucket: this checkout's when it covers them all
        common = set.intersection(*(set(c) for c in cands.values()))
        current = canonical_json(builder.key(targets[0]).details["toolchain"]).decode()
        if common:
            tc = current if current in common else sorted(common)[0]
            found = [(t, cands[t.id][tc], store.manifest(cands[t.id][tc])) for t in targets]
        else:
            for t in targets:
                tcs = " or ".join(_toolchain_text(x) for x in cands[t.id])
                problems.append(f"{t.id}: built with a different toolchain than the others: {tcs}")
            problems.append("rebuild them with one toolchain (`neuron-build build` on one host)")
    if problems:
        bad = len(targets) - len(cands)
        head = (f"cannot release {combo}: {bad} of {len(targets)} bucket(s) missing or failed" if bad
                else f"cannot release {combo}: its buckets were built with different toolchains")
        raise UserError(head + "\n" + "\n".join(f"  {p}" for p in problems))

    artifacts, metrics = [], {}
    for t, key, m in found:
        name, loader = _artifact_file(m)
        artifacts.append({
            "target": t.id, "key": key, "bucket": dict(t.bucket), "bucket_id": t.bucket_id,
            "inputs": [i.to_json() for i in t.inputs(spec)],
            "files": {n: {"sha256": f.sha256, "size": f.size} for n, f in sorted(m.files.items())},
            "artifact": name, "loader": loader})
        metrics[t.id] = _summary(store, key, m)
    times = [v["compile_time_s"] for v in metrics.values()]
    runtime = {
        "dims": list(spec.buckets),
        "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype or dtype, "pad": i.pad_value}
                   for i in spec.inputs],
        "truncate": spec.truncate, "convert_dtypes": spec.convert_dtypes}
    first = found[0][2]
    content = {"format": RELEASE_FORMAT, "model": model, "dtype": dtype, "profile": profile,
               "backend": first.backend, "hardware_target": first.hardware_target, "artifacts": artifacts,
               "toolchain": first.toolchain, "runtime": runtime}
    rid = release_id(content)
    existing = store.release(model, rid)
    if existing is not None:
        return existing
    commit, dirty = git_state(project.root)
    ops = [v["op_count"] for v in metrics.values() if v["op_count"] is not None]
    record = {"id": rid, **content,
              "metrics": {"op_count_total": sum(ops) if ops else None,
                          "compile_time_p95_s": percentile(times, 95, method="nearest-rank"),
                          "compile_time_max_s": max(times),
                          "artifact_bytes_total": sum(v["artifact_bytes"] for v in metrics.values()),
                          "artifacts": metrics},
              "git_commit": commit, "git_dirty": dirty, "created": utc_now(), "creator": creator or actor()}
    store.put_release(model, rid, record)
    return store.release(model, rid) or record


def list_releases(store: ArtifactStore, model: str) -> list[dict[str, Any]]:
    """Every release record of ``model``, oldest first (by created time)."""
    recs = [r for _, rid, r in store.releases(model) if rid.startswith("r-") and r is not None]
    return sorted(recs, key=lambda r: r.get("created", ""))


def load_release(store: ArtifactStore, model: str, ref: str) -> dict[str, Any]:
    """A release of ``model`` by id or unique id prefix (``r-1a2b3c``, at least 6 hex digits).

    Raises:
        UserError: no such release, or the prefix is ambiguous.
    """
    rec = store.release(model, ref)
    if rec is not None:
        return rec
    hits = store.release_ids(model, ref) if len(ref) >= 8 else []
    if len(hits) == 1:
        return store.release(model, hits[0])
    if len(hits) > 1:
        raise UserError(f"release prefix '{ref}' of model '{model}' is ambiguous: {', '.join(hits)}")
    known = [r["id"] for r in list_releases(store, model)][-5:]
    raise UserError(f"no release '{ref}' of model '{model}' in {store.location}; "
                    + (f"recent releases: {', '.join(known)}" if known else
                       f"make one with `neuron-build release {model}`"))


# --------------------------------------------------------------------------------------------------
# gates

def _check_channel(settings: ReleaseSettings, channel: str, flag: str) -> None:
    if channel not in settings.channels:
        raise UserError(f"unknown channel '{channel}' ({flag}); channels under [release] in buckets.toml: "
                        f"{', '.join(settings.channels)}")


def order_gate(settings: ReleaseSettings, store: ArtifactStore, model: str, to: str, from_channel: str | None,
               release: str) -> GateCheck:
    """Is the promotion in channel order? Into the first channel: from a release id. Into channel ``i``:
    ``--from`` channel ``i - 1``, or the release id that channel ``i - 1`` holds now. ``allow_skip``
    also allows any earlier channel, or any release id."""
    chans = list(settings.channels)
    i = chans.index(to)
    required = chans[i - 1] if i > 0 else "a release id"
    figures = {"to": to, "from": from_channel or release, "required_from": required,
               "allow_skip": settings.allow_skip}
    if from_channel is not None:
        j = chans.index(from_channel)
        ok = j == i - 1 or (settings.allow_skip and j < i)
        if ok:
            return GateCheck("channel_order", True, f"{from_channel} -> {to}", figures)
        return GateCheck("channel_order", False, f"{to} takes releases from {required}, not from "
                         f"{from_channel}" + ("" if settings.allow_skip else " (allow_skip = false)"), figures)
    if i == 0 or settings.allow_skip:
        return GateCheck("channel_order", True, f"release {release} -> {to}", figures)
    prev = channel_pointer(store, model, chans[i - 1])
    if prev and prev.get("release") == release:
        return GateCheck("channel_order", True, f"release {release} is the one in {chans[i - 1]}", figures)
    return GateCheck("channel_order", False, f"{to} takes releases from {required}; release {release} is not the "
                     f"one {required} holds ({prev.get('release') if prev else 'none'}); promote it with "
                     f"--from {required}", figures)


def artifact_count_gate(release: dict[str, Any], max_artifacts: int) -> GateCheck:
    """At most ``max_artifacts`` artifacts (buckets) in the release."""
    n = len(release["artifacts"])
    figures = {"artifacts": n, "max": max_artifacts}
    if n > max_artifacts:
        return GateCheck("artifact_count", False, f"{n} artifacts, more than max_artifacts_per_model = "
                         f"{max_artifacts}", figures)
    return GateCheck("artifact_count", True, f"{n} artifact(s), at most {max_artifacts}", figures)


def _by_bucket(release: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not release:
        return {}
    metrics = release.get("metrics", {}).get("artifacts", {})
    return {a["bucket_id"]: {"key": a["key"], **metrics.get(a["target"], {})} for a in release["artifacts"]}


def op_count_gate(release: dict[str, Any], baseline: dict[str, Any] | None, max_regression: float) -> GateCheck:
    """Is each bucket's op count at most ``max_regression`` (a fraction) above the same bucket's in the
    baseline release? Buckets are matched by bucket id, so a new dtype is compared with the old one."""
    if not baseline:
        return GateCheck("op_count", True, "no baseline release to compare with", {"max_regression": max_regression})
    cand, base = _by_bucket(release), _by_bucket(baseline)
    rows: dict[str, dict[str, Any]] = {}
    skipped = []
    for b, c in cand.items():
        old = base.get(b, {}).get("op_count")
        new = c.get("op_count")
        if not old or new is None:
            skipped.append(b)
            continue
        rows[b] = {"baseline": old, "candidate": new, "change": round(new / old - 1, 4)}
    figures = {"buckets": rows, "max_regression": max_regression, "not_compared": skipped}
    worst = max(rows.items(), key=lambda kv: kv[1]["change"]) if rows else None
    if worst and worst[1]["change"] > max_regression:
        b, r = worst
        return GateCheck("op_count", False, f"{b} op count {r['candidate']} is {r['change']:.1%} above the "
                         f"baseline's {r['baseline']} (allowed {max_regression:.1%})", figures)
    msg = (f"worst change {worst[1]['change']:+.1%} ({worst[0]}), allowed +{max_regression:.1%}" if worst
           else "no op counts to compare")
    return GateCheck("op_count", True, msg, figures)


def compile_time_gate(release: dict[str, Any], max_p95_s: float) -> GateCheck:
    """Is the nearest-rank p95 of the release's compile times (seconds) at most ``max_p95_s``?"""
    times = {t: m["compile_time_s"] for t, m in release["metrics"]["artifacts"].items()}
    p95 = percentile(times.values(), 95, method="nearest-rank")
    figures = {"p95_s": p95, "max_p95_s": max_p95_s, "compile_times_s": times}
    if p95 > max_p95_s:
        return GateCheck("compile_time_p95", False, f"compile-time p95 {p95:.1f} s is above "
                         f"max_compile_time_p95_s = {max_p95_s:g} s", figures)
    return GateCheck("compile_time_p95", True, f"compile-time p95 {p95:.1f} s, at most {max_p95_s:g} s", figures)


def evaluate_gates(store: ArtifactStore, settings: ReleaseSettings, release: dict[str, Any], to: str,
                   from_channel: str | None, baseline: dict[str, Any] | None, device_kind: str,
                   allow_unvalidated: bool = False) -> list[GateCheck]:
    """Every gate of a promotion of ``release`` into ``to``, in :data:`GATES` order.

    Args:
        baseline: the release ``to`` holds now (None: the channel is empty).
        device_kind: where ``to`` is served: validation and p99 results are read for it.
        allow_unvalidated: a failed validation gate passes, marked ``overridden`` in its figures.
    """
    model = release["model"]
    keys = {a["target"]: a["key"] for a in release["artifacts"]}
    val = validation_gate(store, keys, device_kind)
    if not val.passed and allow_unvalidated:
        val = GateCheck("validated", True, f"overridden by --allow-unvalidated ({val.message})",
                        {**val.figures, "overridden": True, "device_kind": device_kind})
    else:
        val = GateCheck(val.name, val.passed, val.message, {**val.figures, "device_kind": device_kind})
    cand_b = {b: v["key"] for b, v in _by_bucket(release).items()}
    base_b = {b: v["key"] for b, v in _by_bucket(baseline).items()} or None
    return [
        order_gate(settings, store, model, to, from_channel, release["id"]),
        val,
        artifact_count_gate(release, settings.max_artifacts_per_model),
        op_count_gate(release, baseline, settings.max_op_count_regression),
        latency_gate(store, cand_b, base_b, device_kind, settings.max_p99_ratio),
        compile_time_gate(release, settings.max_compile_time_p95_s),
    ]


def format_gates(gates: Iterable[GateCheck | dict[str, Any]]) -> str:
    """One line per gate: ``PASS name: message``."""
    lines = []
    for g in gates:
        d = g.to_json() if isinstance(g, GateCheck) else g
        lines.append(f"  {'PASS' if d['passed'] else 'FAIL'} {d['name']}: {d['message']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# promotion and rollback

def promote(store: ArtifactStore, settings: ReleaseSettings, model: str, to: str, *, release: str | None = None,
            from_channel: str | None = None, reason: str = "", allow_unvalidated: bool = False,
            device_kind: str | None = None, before_swap: Callable[[], None] | None = None) -> dict[str, Any]:
    """Promote a release (by id) or the release another channel holds into channel ``to``.

    Reads ``to``'s pointer, evaluates the gates against the release it points at, then, holding
    ``<to>.lock``, swaps the pointer only if its version is unchanged. Appends one history line either way.

    Args:
        release, from_channel: exactly one: a release id (or unique prefix), or a channel to take it from.
        reason: free text recorded in the history.
        allow_unvalidated: let a failed validation gate pass (recorded).
        device_kind: override the channel's serving device kind (``[release]``) for the gates.
        before_swap: called after the gates and before the lock (tests use it to line up a race).

    Returns:
        The history line of the promotion (``version`` is the channel's new version).

    Raises:
        UserError: unknown channel or release, empty source channel, both or neither source given.
        PromotionRefused: a gate failed, the channel already holds the release, or another promotion moved
            the channel between the read and the swap (the message names the winner). Recorded in history.
    """
    _check_channel(settings, to, "--to")
    if (release is None) == (from_channel is None):
        raise UserError("give either a RELEASE id or --from CHANNEL to promote from, not both or neither")
    if from_channel is not None:
        _check_channel(settings, from_channel, "--from")
        if from_channel == to:
            raise UserError(f"--from and --to are both '{to}'")
        src = channel_pointer(store, model, from_channel)
        if not src:
            raise UserError(f"channel '{from_channel}' of model '{model}' holds no release yet; promote one "
                            f"into it first")
        rel = load_release(store, model, src["release"])
        source = {"channel": from_channel, "version": src.get("version")}
    else:
        rel = load_release(store, model, release)
        source = {"release": rel["id"]}
    if rel.get("model") != model:
        raise UserError(f"release {rel['id']} is of model '{rel.get('model')}', not '{model}'")
    kind = device_kind or settings.device_kind(to)
    gone = [a["target"] for a in rel["artifacts"] if not store.is_complete(a["key"])]
    if gone:
        raise UserError(f"release {rel['id']} cannot be promoted: artifacts missing from the store: "
                        f"{', '.join(gone)}; rebuild them (`neuron-build build {model}`)")

    seen = channel_pointer(store, model, to)
    seen_version = int(seen.get("version", 0)) if seen else 0
    baseline = load_release(store, model, seen["release"]) if seen else None
    gates = evaluate_gates(store, settings, rel, to, from_channel, baseline, kind, allow_unvalidated)
    if before_swap is not None:
        before_swap()

    entry = {"time": utc_now(), "who": actor(), "action": "promote", "model": model, "channel": to,
             "from": seen.get("release") if seen else None, "to": rel["id"], "source": source,
             "reason": reason, "device_kind": kind, "allow_unvalidated": allow_unvalidated,
             "gates": [g.to_json() for g in gates]}
    try:
        with store.channel_lock(model, to, LOCK_TIMEOUT_S):
            now = channel_pointer(store, model, to)
            now_version = int(now.get("version", 0)) if now else 0
            if now_version != seen_version:
                why = (f"{model}/{to} moved to {now['release']} (version {now_version}, promoted by "
                       f"{now.get('who')} at {now.get('time')}) while this promotion of {rel['id']} was checked "
                       f"against version {seen_version}; nothing changed. Re-run it to check it against "
                       f"{now['release']}")
                _refuse(store, model, to, entry, why, now_version)
            if seen and seen.get("release") == rel["id"]:
                _refuse(store, model, to, entry, f"{model}/{to} already holds {rel['id']} "
                        f"(version {seen_version})", seen_version)
            failed = [g for g in gates if not g.passed]
            if failed:
                why = (f"promotion of {rel['id']} into {model}/{to} refused by {len(failed)} gate(s):\n"
                       + format_gates(gates))
                if any(g.name == "validated" for g in failed):
                    why += (f"\nvalidate on {kind} with `neuron-build validate {model}`, or pass "
                            f"--allow-unvalidated (recorded in the history)")
                _refuse(store, model, to, entry, why, seen_version)
            entry["version"] = seen_version + 1
            store.set_channel(model, to, {
                "model": model, "channel": to, "release": rel["id"], "version": seen_version + 1,
                "previous": entry["from"], "action": "promote", "time": entry["time"], "who": entry["who"],
                "reason": reason})
            store.append_history(model, to, entry)
    except Timeout:
        raise UserError(f"channel {model}/{to} is locked by another promotion for over {LOCK_TIMEOUT_S:g} s; "
                        f"if none is running, remove {store.channel_lock_path(model, to)}") from None
    return entry


def _refuse(store: ArtifactStore, model: str, channel: str, entry: dict[str, Any], why: str, version: int) -> None:
    entry.update(action="refuse", refused=why, version=version)
    store.append_history(model, channel, entry)
    raise PromotionRefused(why, entry)


def release_stack(history: list[dict[str, Any]]) -> list[str]:
    """Replay a channel's history: each promotion pushes its release, each rollback pops one. The last
    item is the current release; the one before it is where a rollback goes."""
    stack: list[str] = []
    for e in history:
        if e.get("action") == "promote":
            stack.append(e["to"])
        elif e.get("action") == "rollback" and stack:
            stack.pop()
    return stack


def rollback(store: ArtifactStore, settings: ReleaseSettings, model: str, channel: str, *, reason: str = "") -> dict[str, Any]:
    """Move ``channel`` back to the release it held before the current one (by its history: promotions
    push, rollbacks pop, so repeated rollbacks walk further back). No gates: that release was promoted
    before. Recorded in the history.

    Returns:
        The history line (``from`` the current release, ``to`` the restored one, ``version``).

    Raises:
        UserError: unknown channel; the channel is empty or has held a single release; the history does
            not end at the pointer's release; or the restored release's artifacts are gone from the store.
    """
    _check_channel(settings, channel, "--channel")
    try:
        with store.channel_lock(model, channel, LOCK_TIMEOUT_S):
            ptr = channel_pointer(store, model, channel)
            if not ptr:
                raise UserError(f"channel {model}/{channel} holds no release; nothing to roll back")
            stack = release_stack(channel_history(store, model, channel))
            if not stack or stack[-1] != ptr["release"]:
                raise UserError(f"the history of {model}/{channel} does not "
                                f"end at the channel's release {ptr['release']}; promote a release explicitly")
            if len(stack) < 2:
                raise UserError(f"{model}/{channel} has held only {ptr['release']}; there is no earlier release "
                                f"to roll back to")
            target = load_release(store, model, stack[-2])
            gone = [a["target"] for a in target["artifacts"] if not store.is_complete(a["key"])]
            if gone:
                raise UserError(f"cannot roll {model}/{channel} back to {target['id']}: artifacts missing from the "
                                f"store: {', '.join(gone)}; rebuild them or promote another release")
            version = int(ptr.get("version", 0)) + 1
            entry = {"time": utc_now(), "who": actor(), "action": "rollback", "model": model, "channel": channel,
                     "from": ptr["release"], "to": target["id"], "reason": reason, "version": version}
            store.set_channel(model, channel, {
                "model": model, "channel": channel, "release": target["id"], "version": version,
                "previous": ptr["release"], "action": "rollback", "time": entry["time"], "who": entry["who"],
                "reason": reason})
            store.append_history(model, channel, entry)
    except Timeout:
        raise UserError(f"channel {model}/{channel} is locked for over {LOCK_TIMEOUT_S:g} s") from None
    return entry


def channel_rows(store: ArtifactStore, settings: ReleaseSettings, models: Iterable[str]) -> list[dict[str, Any]]:
    """One row per (model, declared channel): release, version, when, who, age, dtype."""
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = []
    for m in models:
        for c in settings.channels:
            p = channel_pointer(store, m, c)
            rel = store.release(m, p["release"]) if p else None
            rows.append({"model": m, "channel": c, "release": p.get("release") if p else None,
                         "version": p.get("version") if p else 0, "time": p.get("time") if p else None,
                         "age": age(p.get("time"), now) if p else None, "who": p.get("who") if p else None,
                         "action": p.get("action") if p else None,
                         "dtype": rel.get("dtype") if rel else None, "profile": rel.get("profile") if rel else None})
    return rows


# --------------------------------------------------------------------------------------------------
# pull

def _copy_verified(src: Path, dst: Path, sha256: str, size: int, what: str) -> None:
    h = hashlib.sha256()
    n = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            while b := fi.read(1 << 20):
                h.update(b)
                n += len(b)
                fo.write(b)
    except FileNotFoundError:
        raise UserError(f"{what}: file {src} is missing from the store") from None
    if h.hexdigest() != sha256 or n != size:
        raise UserError(f"{what}: {src} does not match its manifest (sha256 {h.hexdigest()[:16]}..., "
                        f"{n} bytes; expected {sha256[:16]}..., {size} bytes): the stored object is corrupt; "
                        f"move {src.parent} aside and rebuild the target")


def pull(store: ArtifactStore, model: str, channel: str, dest: str | Path, settings: ReleaseSettings | None = None) -> dict[str, Any]:
    """Write the release a channel holds into ``dest``: ``<bucket id>/<files>`` and ``release.json``.

    Every file is copied while its sha256 and size are checked against the artifact's manifest, and the
    manifest against the files the release recorded. Everything is written into a staging folder beside
    ``dest`` and swapped in with renames only when all checks pass: a missing or corrupt object fails the
    pull and leaves ``dest`` as it was.

    Returns:
        The content of ``release.json`` (see :mod:`neuron_build.runtime`).

    Raises:
        UserError: unknown channel, empty channel, missing release record, or a missing or corrupt object
            (the message names the file).
    """
    if settings is not None:
        _check_channel(settings, channel, "--channel")
    ptr = channel_pointer(store, model, channel)
    if not ptr:
        raise UserError(f"channel {model}/{channel} holds no release; promote one into it first")
    rel = load_release(store, model, ptr["release"])
    if not str(dest).strip():
        raise UserError("--dest is empty; give the folder to pull into (e.g. --dest serve/minilm)")
    dest = Path(dest).absolute()
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--dest {dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / "release.json").is_file():
        raise UserError(f"--dest {dest} is a folder with other content (no release.json from an earlier "
                        f"pull); pull into a new or empty folder, or into one an earlier pull wrote")
    blocker = next((p for p in dest.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--dest {dest}: {blocker} is a file, not a folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.pull.{os.getpid()}.{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        buckets = []
        for a in rel["artifacts"]:
            what = f"{a['target']} (key {a['key'][:12]})"
            obj = store.artifact_dir(a["key"])
            mf = read_json(obj / MANIFEST)
            if not isinstance(mf, dict) or mf.get("key") != a["key"]:
                raise UserError(f"{what}: object {obj} is missing from the store or has no valid {MANIFEST}; "
                                f"rebuild the target")
            files = mf.get("files", {})
            for name, ent in a["files"].items():
                have = files.get(name)
                if have is None or have.get("sha256") != ent["sha256"]:
                    raise UserError(f"{what}: {obj / MANIFEST} lists {name} with sha256 "
                                    f"{(have or {}).get('sha256', 'none')[:16]}..., but release {rel['id']} "
                                    f"recorded {ent['sha256'][:16]}...: the object changed since the release")
            for name, ent in files.items():
                _copy_verified(obj / name, staging / a["bucket_id"] / name, ent["sha256"], ent["size"], what)
            shutil.copyfile(obj / MANIFEST, staging / a["bucket_id"] / MANIFEST)
            buckets.append({
                "id": a["bucket_id"], "target": a["target"], "key": a["key"], "sizes": a["bucket"],
                "inputs": [{"name": i["name"], "shape": i["shape"], "dtype": i["dtype"]} for i in a["inputs"]],
                "artifact": f"{a['bucket_id']}/{a['artifact']}", "loader": a["loader"],
                "files": {f"{a['bucket_id']}/{n}": ent for n, ent in files.items()}})
        rt = rel["runtime"]
        doc = {"format": PULL_FORMAT, "release": rel["id"], "model": model, "channel": channel,
               "channel_version": ptr.get("version"), "dtype": rel["dtype"], "profile": rel["profile"],
               "backend": rel["backend"], "hardware_target": rel["hardware_target"], "dims": rt["dims"],
               "inputs": rt["inputs"], "truncate": rt["truncate"], "convert_dtypes": rt["convert_dtypes"],
               "buckets": buckets, "toolchain": rel["toolchain"], "pulled": utc_now(), "pulled_by": actor()}
        (staging / "release.json").write_text(json.dumps(doc, indent=2) + "\n")
        swap_in_folder(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return doc


__all__ = ["PromotionRefused", "create_release", "load_release", "list_releases", "promote", "rollback",
           "pull", "channel_pointer", "channel_history", "channel_rows", "evaluate_gates", "format_gates",
           "release_stack", "percentile", "actor", "git_state", "GATES"]
