"""``neuron-build releases diff A B``: two releases compared bucket by bucket.

Domain code: no doit, no torch. A release is named by its id (or a unique id prefix, at least 8 characters
as for the other release commands), by ``MODEL@CHANNEL`` (the release the channel holds now) or by
``MODEL@RELEASE``. Buckets are matched by bucket id (``b1-s128``), so two releases of one model for two
dtypes or profiles compare too. Per bucket the diff names whether the artifact key is the same and, when it
changed, which key components changed (``explain``'s words: :func:`neuron_build.project.keys.diff_components`
over the two manifests' key details), and sets the figures of both sides side by side: op count, compile
time (seconds), artifact size (bytes), validation verdict and error per device kind, benchmark p50/p99 (ms)
per benchmark record. Release-wide: the toolchain versions and the gate verdicts of every promotion or
refused promotion of each release.
"""

from __future__ import annotations

from typing import Any

from neuron_build.errors import UserError
from neuron_build.project.keys import diff_components
from neuron_build.release.records import Release, get_history, get_pointer, get_release, results_speak_for
from neuron_build.status import Verdict
from neuron_build.store.contract import ArtifactStore

#: The ``schema`` of ``releases diff --json``.
DIFF_SCHEMA = "neuron-build/releases-diff/v1"


def resolve_release(store: ArtifactStore, ref: str, models: list[str]) -> Release:
    """The release ``ref`` names: ``MODEL@CHANNEL``, ``MODEL@RELEASE`` or a release id / unique prefix of
    one of ``models``.

    Raises:
        UserError: unknown model, an empty channel, no such release, or a prefix that two releases share
            (each message names the reference and how to list what exists).
    """
    if "@" in ref:
        model, _, what = ref.partition("@")
        if model not in models:
            raise UserError(f"{ref}: unknown model '{model}'; models: {', '.join(models)}")
        ptr = get_pointer(store, model, what)
        if ptr is not None:
            return get_release(store, model, ptr.release)
        if what.startswith("r-"):
            return get_release(store, model, what)
        raise UserError(f"{ref}: channel '{what}' of model '{model}' holds no release in {store.location}; "
                        f"see `neuron-build channels {model}`")
    hits: list[tuple[str, str]] = []
    for model in models:
        if store.release(model, ref) is not None:
            return get_release(store, model, ref)
        if len(ref) >= 8:
            hits += [(model, rid) for rid in store.release_ids(model, ref)]
    if len(hits) == 1:
        return get_release(store, *hits[0])
    if len(hits) > 1:
        raise UserError(f"release prefix '{ref}' is ambiguous: {', '.join(f'{m}@{r}' for m, r in hits)}")
    raise UserError(f"no release '{ref}' in {store.location} (give a release id, a prefix of 8 characters or "
                    f"more, or MODEL@CHANNEL); list them with `neuron-build releases MODEL`")


def bucket_figures(store: ArtifactStore, rel: Release, art) -> dict[str, Any]:
    """The figures of one bucket (``art``, a :class:`ReleaseArtifact`) of ``rel``: ``target``, ``key``,
    ``op_count``, ``compile_time_s`` (seconds), ``artifact_bytes`` (bytes: the sum of its files),
    ``validation`` (device kind -> ``{"verdict", "error"}``) and ``bench`` (record name -> ``{"p50_ms",
    "p99_ms"}``). The store's current results first, the figures recorded in the release second; the store's
    only while the key's artifact is the one the release pins (:func:`results_speak_for`: not after a rebuild
    under its key)."""
    recorded = (rel.metrics.get("artifacts") or {}).get(art.target) or {}
    ours = results_speak_for(store, art) is None
    man = store.manifest(art.key) if ours else None
    mt = man.metrics if man is not None else None
    validation: dict[str, dict[str, Any]] = {}
    for kind, r in (store.results(art.key, "validation") if ours else {}).items():
        validation[kind] = {"verdict": r.get("verdict"), "error": r.get("reason")}
    for kind, verdict in (recorded.get("validation") or {}).items():
        validation.setdefault(kind, {"verdict": verdict, "error": None})
    bench: dict[str, dict[str, Any]] = {}
    for name, r in (store.results(art.key, "bench") if ours else {}).items():
        lat = r.get("latency_ms") or {}
        bench[name] = {"p50_ms": lat.get("p50"), "p99_ms": lat.get("p99")}
    for name, lat in (recorded.get("bench") or {}).items():
        bench.setdefault(name, {"p50_ms": lat.get("p50"), "p99_ms": lat.get("p99")})
    size = sum(int(f.get("size") or 0) for f in art.files.values())
    return {"target": art.target, "key": art.key,
            "op_count": mt.op_count if mt is not None else recorded.get("op_count"),
            "compile_time_s": mt.compile_time_s if mt is not None else recorded.get("compile_time_s"),
            "artifact_bytes": size,
            "validation": dict(sorted(validation.items())), "bench": dict(sorted(bench.items()))}


def _key_change(store: ArtifactStore, a, b) -> dict[str, Any]:
    """``{"same", "components", "files"}``: components None when a manifest is not in the store; ``files``: the
    files whose pinned sha256 differs under one key (a stale artifact rebuilt under its key: new weights a
    factory read from a recorded file, relinked), which makes the bucket ``changed``."""
    if a.key == b.key:
        files = sorted(n for n in set(a.files) | set(b.files)
                       if (a.files.get(n) or {}).get("sha256") != (b.files.get(n) or {}).get("sha256"))
        return {"same": True, "components": [], "files": files}
    ma, mb = store.manifest(a.key), store.manifest(b.key)
    if ma is None or mb is None:
        return {"same": False, "components": None}
    return {"same": False, "components": diff_components(ma.key_details, mb.key_details, ma.component_hashes,
                                                         mb.component_hashes)}


def gate_verdicts(store: ArtifactStore, rel: Release, channels: list[str],
                  histories: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """Every promotion and refused promotion of ``rel`` into one of ``channels``, channel by channel in the
    order given, oldest first within a channel (history times have whole seconds: across channels they tie);
    ``histories`` (channel -> :class:`HistoryEntry` list) saves reading them again:
    ``{"channel", "action", "time", "who", "version", "gates": [{"name", "verdict", "message"}]}``."""
    out = []
    for c in channels:
        hist = histories[c] if histories is not None and c in histories else get_history(store, rel.model, c)
        for e in hist:
            if e.to == rel.id and e.action in ("promote", "refuse"):
                out.append({"channel": c, "action": e.action, "time": e.time, "who": e.who, "version": e.version,
                            "gates": [{"name": g.get("name"), "verdict": g.get("verdict")
                                       or Verdict.of(bool(g.get("passed"))), "message": g.get("message")}
                                      for g in e.gates or [] if isinstance(g, dict)]})
    return out


def _about(rel: Release, store: ArtifactStore, channels: list[str]) -> dict[str, Any]:
    holding = [c for c in channels if (p := get_pointer(store, rel.model, c)) is not None and p.release == rel.id]
    return {"id": rel.id, "model": rel.model, "dtype": rel.dtype, "profile": rel.profile, "backend": rel.backend,
            "hardware_target": rel.hardware_target, "created": rel.created, "creator": rel.creator,
            "git_commit": rel.git_commit, "toolchain": rel.toolchain, "channels": holding,
            "gates": gate_verdicts(store, rel, channels)}


def diff_releases(store: ArtifactStore, a: Release, b: Release, channels: list[str] | None = None) -> dict[str, Any]:
    """The diff of release ``a`` (old) and ``b`` (new), as ``releases diff --json`` prints it.

    Args:
        channels: the channels whose history is searched for gate verdicts (default: every channel the
            store holds a pointer of for the model).

    Returns:
        ``{"schema", "a", "b", "toolchain": {"same", "changed": {package: [a, b]}}, "buckets": [...],
        "added", "removed", "changed", "same"}``; each bucket ``{"bucket_id", "state"`` (``same``,
        ``changed``, ``added``, ``removed``), ``"key": {"same", "components", "files"?}`` (None when added or
        removed; ``files``: under one key, the files whose pinned sha256 differs: the bucket is ``changed``), ``"a"`` and ``"b"`` (None on the side that lacks it): ``target``, ``key``, ``op_count``,
        ``compile_time_s`` (seconds), ``artifact_bytes`` (bytes), ``validation`` (device kind ->
        ``{"verdict", "error"}``), ``bench`` (record name -> ``{"p50_ms", "p99_ms"}``)}``.

    Raises:
        UserError: ``a`` and ``b`` are releases of two different models (their buckets are not comparable).
    """
    if a.model != b.model:
        raise UserError(f"releases diff: {a.id} is a release of model '{a.model}' and {b.id} of model "
                        f"'{b.model}'; a diff compares two releases of one model (list them with "
                        f"`neuron-build releases {a.model}` or `neuron-build releases {b.model}`)")
    if channels is None:
        channels = sorted({c for m, c, _ in store.channels() if m == a.model})
    arts_a = {x.bucket_id: x for x in a.artifacts}
    arts_b = {x.bucket_id: x for x in b.artifacts}
    order = list(arts_a) + [k for k in arts_b if k not in arts_a]
    buckets = []
    for bid in order:
        xa, xb = arts_a.get(bid), arts_b.get(bid)
        if xa is not None and xb is not None:
            key = _key_change(store, xa, xb)
            state = "same" if key["same"] and not key.get("files") else "changed"
        else:
            key, state = None, "added" if xa is None else "removed"
        buckets.append({"bucket_id": bid, "state": state, "key": key,
                        "a": bucket_figures(store, a, xa) if xa is not None else None,
                        "b": bucket_figures(store, b, xb) if xb is not None else None})
    pkgs = sorted(set(a.toolchain) | set(b.toolchain))
    changed_tc = {p: [a.toolchain.get(p), b.toolchain.get(p)] for p in pkgs if a.toolchain.get(p) != b.toolchain.get(p)}
    return {"schema": DIFF_SCHEMA, "a": _about(a, store, channels), "b": _about(b, store, channels),
            "toolchain": {"same": not changed_tc, "changed": changed_tc},
            "buckets": buckets,
            **{s: [x["bucket_id"] for x in buckets if x["state"] == s] for s in ("added", "removed", "changed", "same")}}


def _fig(v: Any, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def _pair(a: dict | None, b: dict | None, field: str, fmt: str = "{}") -> str:
    va = a.get(field) if a else None
    vb = b.get(field) if b else None
    if a is None:
        return _fig(vb, fmt)
    if b is None or va == vb:
        return _fig(va, fmt)
    return f"{_fig(va, fmt)} -> {_fig(vb, fmt)}"


def _verdicts(side: dict | None) -> str:
    if not side or not side["validation"]:
        return "not validated"
    return ", ".join(f"{k} {v['verdict']}" + (f" ({v['error']})" if v.get("error") else "")
                     for k, v in side["validation"].items())


def _latency(side: dict | None) -> str:
    if not side or not side["bench"]:
        return "-"
    return ", ".join(f"{n} p50 {_fig(v['p50_ms'], '{:.3g}')}/p99 {_fig(v['p99_ms'], '{:.3g}')} ms"
                     for n, v in side["bench"].items())


def format_diff(doc: dict[str, Any]) -> str:
    """:func:`diff_releases`' document as text for people: one block per bucket, then the gates."""
    a, b = doc["a"], doc["b"]
    lines = [f"--- {a['id']}  {a['model']} {a['dtype']}/{a['profile']} ({a['backend']}, {a['hardware_target']})"
             f"  channels: {', '.join(a['channels']) or '-'}",
             f"+++ {b['id']}  {b['model']} {b['dtype']}/{b['profile']} ({b['backend']}, {b['hardware_target']})"
             f"  channels: {', '.join(b['channels']) or '-'}"]
    if doc["toolchain"]["same"]:
        lines.append("toolchain: same (" + ", ".join(f"{k}={v}" for k, v in sorted(a["toolchain"].items())) + ")")
    else:
        lines.append("toolchain: " + ", ".join(f"{k} {x} -> {y}" for k, (x, y) in doc["toolchain"]["changed"].items()))
    for x in doc["buckets"]:
        sa, sb = x["a"], x["b"]
        mark = {"same": " ", "changed": "~", "added": "+", "removed": "-"}[x["state"]]
        if x["state"] == "changed" and x["key"]["same"]:
            head = f"key same ({sa['key'][:12]}), files changed: {', '.join(x['key']['files'])}"
        elif x["state"] == "changed":
            comps = x["key"]["components"]
            why = "; ".join(comps) if comps else ("manifests not in the store" if comps is None else "")
            head = f"key changed ({sa['key'][:12]} -> {sb['key'][:12]}): {why}"
        elif x["state"] == "same":
            head = f"key same ({sa['key'][:12]})"
        else:
            head = f"{x['state']} ({(sa or sb)['target']}, key {(sa or sb)['key'][:12]})"
        lines.append(f"{mark} {x['bucket_id']}: {head}")
        lines.append(f"    op count {_pair(sa, sb, 'op_count')}; compile {_pair(sa, sb, 'compile_time_s', '{:.2f}')} s; "
                     f"artifact {_pair(sa, sb, 'artifact_bytes', '{:,}')} bytes")
        va, vb = _verdicts(sa), _verdicts(sb)
        lines.append(f"    validation {va if sa is None or sb is None or va == vb else f'{va} -> {vb}'}")
        la, lb = _latency(sa), _latency(sb)
        if la != "-" or lb != "-":
            lines.append(f"    bench {la if sa is None or sb is None or la == lb else f'{la} -> {lb}'}")
    for side, rel in (("---", a), ("+++", b)):
        for g in rel["gates"]:
            gates = ", ".join(f"{x['name']} {x['verdict']}" for x in g["gates"])
            lines.append(f"{side} gates {g['action']} into {g['channel']} at {g['time']}: {gates or '-'}")
    lines.append(f"{len(doc['changed'])} changed, {len(doc['same'])} same, {len(doc['added'])} added, "
                 f"{len(doc['removed'])} removed")
    return "\n".join(lines)


__all__ = ["DIFF_SCHEMA", "bucket_figures", "diff_releases", "format_diff", "gate_verdicts", "resolve_release"]
