"""Channels: promotion (gates, then compare-and-swap of the pointer), rollback, and the channel table.

A **promotion** reads the channel's pointer with its version token
(:meth:`~neuron_build.store.contract.ReleaseStore.channel_ref`), evaluates the gates against the release it
points at, then swaps the pointer only if the token is unchanged
(:meth:`~neuron_build.store.contract.ReleaseStore.swap_channel`, compare-and-swap). Of two promotions that
read the same pointer, exactly one swap wins; the other reads the new pointer, checks its gates again
against the winner's release and tries again (up to :data:`SWAP_ATTEMPTS` times, then one line saying the
channel kept moving). Every promotion, refused promotion and rollback is a new entry of the channel's
history.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from neuron_build.errors import ExitCode, StoreError, UserError
from neuron_build.log import get_logger
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.gates import GATES, WAIVABLE, GateCheck, evaluate_gates, format_gates
from neuron_build.release.records import (
    ChannelPointer,
    HistoryEntry,
    Release,
    actor,
    check_channel,
    find_release,
    get_history,
    get_pointer,
    get_release,
)
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import seconds_since, utc_now

#: How many times a promotion or rollback reads, checks and tries to swap a channel that keeps moving
#: before it gives up with one line.
SWAP_ATTEMPTS = 5


class PromotionRefused(UserError):
    """A promotion that did not move the channel: a gate failed, the release was rolled back before and no
    reason was given, the channel already holds it, or another promotion won the race (exit status 3).

    Attributes:
        entry: the history line recorded for the refusal, as JSON (``gates`` holds every gate's verdict).
    """

    exit_code = ExitCode.REFUSED

    def __init__(self, message: str, entry: dict[str, Any]):
        super().__init__(message)
        self.entry = entry


def rollbacks_of(store: ArtifactStore, settings: ReleaseSettings, model: str, release: str) -> list[dict[str, Any]]:
    """The rollbacks that moved a channel of ``model`` away from ``release``: ``{"channel", "time", "who",
    "reason"}`` each, oldest first. A release with any is *rolled back*: ``releases`` and ``channels`` mark
    it, and promoting it again needs a reason."""
    out = []
    for c in settings.channels:
        for e in get_history(store, model, c):
            if e.action == "rollback" and e.from_ == release:
                out.append({"channel": c, "time": e.time, "who": e.who, "reason": e.reason})
    return sorted(out, key=lambda r: r["time"] or "")


def check_waivers(waive: Iterable[str], reason: str, allow_unvalidated: bool = False) -> dict[str, str]:
    """``{gate: reason}`` for ``promote --waive GATE...`` (and ``--allow-unvalidated``).

    Raises:
        UserError: an unknown or unwaivable gate, or a waiver without a reason (``--reason TEXT``).
    """
    names = list(dict.fromkeys(waive))
    for g in names:
        if g not in WAIVABLE:
            raise UserError(f"--waive {g}: not a gate that can be waived; gates: {', '.join(WAIVABLE)}"
                            + (" (channel_order: set allow_skip = true under [release])" if g in GATES else ""))
    if (names or allow_unvalidated) and not reason.strip():
        flag = "--allow-unvalidated" if allow_unvalidated and not names else f"--waive {names[0]}"
        raise UserError(f"{flag} needs --reason TEXT: a waived gate is recorded in the channel's history with "
                        f"why")
    return {g: reason.strip() for g in names}


@dataclass(frozen=True)
class PromotionRequest:
    """What one promotion asks for (the keyword arguments of :func:`promote`).

    Attributes:
        model, to: the model and the channel to promote into.
        release, from_channel: exactly one: a release id (or unique prefix), or a channel to take it from.
        reason: free text recorded in the history.
        allow_unvalidated: let a failed validation gate pass (recorded; needs ``reason``).
        waive: gates (:data:`~neuron_build.release.gates.WAIVABLE`) let through when they fail, verdict
            ``waived``; needs ``reason``; recorded in the history as ``waivers``.
        device_kind: override the channel's serving device kind (``[release]``) for the gates.
        factory_root: where a compile-cache release's model factory imports from for the warm-up gate.
        before_swap: called after the first round's gates and before its swap (tests use it to line up a
            race).
        fresh: the ``fresh`` gate's check (:data:`~neuron_build.release.gates.FreshCheck`; None: not
            checked), called once per round: the caller keeps its answer per release.
    """

    model: str
    to: str
    release: str | None = None
    from_channel: str | None = None
    reason: str = ""
    allow_unvalidated: bool = False
    device_kind: str | None = None
    waive: Iterable[str] = ()
    factory_root: Any = None
    before_swap: Callable[[], None] | None = None
    fresh: Callable[[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Candidate:
    """Step 1 of a promotion (:func:`resolve_release`): the release to promote and what every round needs.

    Attributes:
        release: the release; ``source``: ``{"release": id}`` or ``{"channel", "version"}``.
        device_kind: where the channel serves (the gates read results for it).
        waivers: gate -> reason; ``extra``: the history entry's ``waivers`` and ``rolled_back``.
        rolled: the release's earlier rollbacks (:func:`rollbacks_of`).
        op: the operation id written into the pointer and the history (:func:`new_op`).
    """

    release: Release
    source: dict[str, Any]
    device_kind: str
    waivers: dict[str, str]
    rolled: list[dict[str, Any]]
    extra: dict[str, Any]
    op: str


@dataclass(frozen=True)
class GateRound:
    """Step 2 of a promotion (:func:`check_gates`): the channel as one read saw it (``seen``, ``token``)
    and every gate against the release it holds."""

    seen: ChannelPointer | None
    token: str | None
    gates: list[GateCheck]

    @property
    def seen_version(self) -> int:
        """The channel's version at the read (0: empty)."""
        return self.seen.version if self.seen else 0


def promote(store: ArtifactStore, settings: ReleaseSettings, model: str, to: str, **options: Any) -> HistoryEntry:
    """Promote a release (by id) or the release another channel holds into channel ``to``.

    A pipeline of steps that each return a value: :func:`resolve_release` (the release, its source and
    what the rounds need), then per round :func:`check_gates` (read ``to``'s pointer and its token, every
    gate against the release it points at), :func:`admit` (refusals, or the history entry to swap in),
    :func:`swap_pointer` (compare-and-swap: only if the token is unchanged) and :func:`record_history`. A
    lost swap reads the pointer again and checks the gates again (at most :data:`SWAP_ATTEMPTS` rounds);
    a swap whose answer was lost and that the pointer shows applied (its ``op``) is recorded as done.
    Adds one history entry either way.

    Args:
        options: the fields of :class:`PromotionRequest` (``release`` or ``from_channel``, ``reason``,
            ``allow_unvalidated``, ``waive``, ``device_kind``, ``factory_root``, ``before_swap``, ``fresh``).

    Returns:
        The promotion's :class:`~neuron_build.release.records.HistoryEntry` (``version``: the channel's
        new version; ``to_json()``: the history line, what ``promote --json`` prints).

    Raises:
        UserError: unknown channel or release, empty source channel, both or neither source given; a
            waiver without a reason or of an unknown gate.
        PromotionRefused: a gate failed (checked against the channel's release at the last read); the
            release was rolled back before (:func:`rollbacks_of`) and no reason was given; the channel
            already holds the release; or the channel moved at every one of the :data:`SWAP_ATTEMPTS`
            rounds. Recorded in history (exit 3).
    """
    req = PromotionRequest(model=model, to=to, **options)
    cand = resolve_release(store, settings, req)
    entry: HistoryEntry | None = None
    done: HistoryEntry | None = None  # the entry of the last swap we sent (its answer may be lost)
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        raw, token = store.channel_ref(model, to)
        if done is not None and is_ours(raw, cand.op):  # an earlier swap was applied; its answer was lost
            return record_history(store, done)
        gates = check_gates(store, settings, req, cand, ChannelPointer.from_json(raw), token)
        if req.before_swap is not None and attempt == 1:
            req.before_swap()
        entry = done = admit(store, req, cand, gates)
        if swap_pointer(store, entry, gates.token, cand.op):
            return record_history(store, entry)
        get_logger(model=model, channel=to).info(
            "channel moved while the promotion was checked; checking again", release=cand.release.id,
            checked_version=gates.seen_version, attempt=attempt)
    assert entry is not None
    why = (f"{model}/{to} moved {SWAP_ATTEMPTS} times while this promotion of {cand.release.id} was being checked "
           f"(compare-and-swap lost each time); nothing changed. Re-run the promotion")
    _refuse(store, entry, why, entry.version - 1 if entry.version else 0)
    raise AssertionError("unreachable")  # _refuse raises


def resolve_release(store: ArtifactStore, settings: ReleaseSettings, req: PromotionRequest) -> Candidate:
    """Step 1: check the request and find the release to promote (by id, or the one ``from_channel``
    holds), its artifacts in the store, its earlier rollbacks and the waivers; a new operation id.

    Raises:
        UserError: unknown channel or release, empty source channel, both or neither source given, the
            release of another model, artifacts missing; a waiver without a reason or of an unknown gate.
    """
    model, to = req.model, req.to
    check_channel(settings, to, "--to")
    waivers = check_waivers(req.waive, req.reason, req.allow_unvalidated)
    if (req.release is None) == (req.from_channel is None):
        raise UserError("give either a RELEASE id or --from CHANNEL to promote from, not both or neither")
    if req.from_channel is not None:
        check_channel(settings, req.from_channel, "--from")
        if req.from_channel == to:
            raise UserError(f"--from and --to are both '{to}'")
        src = get_pointer(store, model, req.from_channel)
        if not src:
            unshared = _unshared_channel(store, model, req.from_channel)
            if unshared:
                raise UserError(unshared)
            raise UserError(f"channel '{req.from_channel}' of model '{model}' holds no release yet; promote one "
                            f"into it first")
        rel = get_release(store, model, src.release)
        source: dict[str, Any] = {"channel": req.from_channel, "version": src.version}
    else:
        rel = get_release(store, model, req.release)
        source = {"release": rel.id}
    if rel.model != model:
        raise UserError(f"release {rel.id} is of model '{rel.model}', not '{model}'")
    kind = req.device_kind or settings.device_kind(to)
    gone = missing_artifacts(store, rel)
    if gone:
        raise UserError(f"release {rel.id} cannot be promoted: artifacts missing from the store: "
                        f"{', '.join(gone)}; rebuild them (`neuron-build build {model}`)")
    rolled = rollbacks_of(store, settings, model, rel.id)
    extra: dict[str, Any] = {}
    if waivers:
        extra["waivers"] = [{"gate": g, "reason": r} for g, r in waivers.items()]
    if rolled:
        extra["rolled_back"] = rolled
    return Candidate(release=rel, source=source, device_kind=kind, waivers=waivers, rolled=rolled, extra=extra,
                     op=new_op())


def _unshared_channel(store: ArtifactStore, model: str, channel: str) -> str | None:
    """Why a channel the local tier of a local+remote pair holds, and the remote does not account for (one
    promoted before the remote was added), cannot be promoted from yet: one line naming both stores and
    ``push``; None for any other store."""
    local, remote = store.local_tier, store.remote_tier
    if remote is None or local is store:
        return None
    from neuron_build.store.sync import channel_disagreement

    return channel_disagreement(remote, local, model, channel)


def check_gates(store: ArtifactStore, settings: ReleaseSettings, req: PromotionRequest, cand: Candidate,
                seen: ChannelPointer | None, token: str | None) -> GateRound:
    """Step 2: every gate (:func:`~neuron_build.release.gates.evaluate_gates`, in ``GATES`` order) of the
    candidate against the release the channel held at this read (``seen``, with its version ``token``)."""
    baseline = get_release(store, req.model, seen.release) if seen else None
    gates = evaluate_gates(store, settings, cand.release, req.to, req.from_channel, baseline, cand.device_kind,
                           req.allow_unvalidated, cand.waivers, factory_root=req.factory_root, fresh=req.fresh)
    return GateRound(seen=seen, token=token, gates=gates)


def admit(store: ArtifactStore, req: PromotionRequest, cand: Candidate, rnd: GateRound) -> HistoryEntry:
    """Step 3: the history entry of the promotion this round would swap in (the channel's next version,
    the operation id), or a refusal recorded in the history.

    Raises:
        PromotionRefused: the channel already holds the release; it was rolled back before and no reason
            is given; a gate failed (the fixes named).
    """
    model, to, rel, kind, seen = req.model, req.to, cand.release, cand.device_kind, rnd.seen
    seen_version = rnd.seen_version
    entry = HistoryEntry(time=utc_now(), who=actor(), action="promote", model=model, channel=to,
                         from_=seen.release if seen else None, to=rel.id, source=cand.source, reason=req.reason,
                         device_kind=kind, allow_unvalidated=req.allow_unvalidated,
                         gates=[g.to_json() for g in rnd.gates], extra=dict(cand.extra))
    if seen and seen.release == rel.id:
        _refuse(store, entry, f"{model}/{to} already holds {rel.id} (version {seen_version})", seen_version)
    if cand.rolled and not req.reason.strip():
        last_rb = cand.rolled[-1]
        _refuse(store, entry, f"release {rel.id} was rolled back from {model}/{last_rb['channel']} at "
                f"{last_rb['time']} by {last_rb['who']}"
                + (f" (\"{last_rb['reason']}\")" if last_rb["reason"] else "")
                + "; promoting it again needs --reason TEXT (recorded in the history)", seen_version)
    failed = [g for g in rnd.gates if not g.passed]
    if failed:
        why = (f"promotion of {rel.id} into {model}/{to} refused by {len(failed)} gate(s):\n"
               + format_gates(rnd.gates))
        if any(g.name == "validated" for g in failed):
            why += (f"\nvalidate on {kind} with `neuron-build validate {model}`, or pass "
                    f"--allow-unvalidated --reason TEXT (recorded in the history)")
        if any(g.name == "fresh" for g in failed):
            why += (f"\nbuild {model} from today's source (`neuron-build build {model}`) and release it again, or "
                    f"pass --waive fresh --reason TEXT (recorded in the history)")
        if any(g.name == "latency" for g in failed):
            why += (f"\nre-measure both in one session with `neuron-build bench {model} --against {to}`, "
                    f"or pass --waive latency --reason TEXT (recorded in the history)")
        _refuse(store, entry, why, seen_version)
    return replace(entry, version=seen_version + 1, extra={**entry.extra, "op": cand.op})


def swap_pointer(store: ArtifactStore, entry: HistoryEntry, token: str | None, op: str) -> bool:
    """Step 4: compare-and-swap the channel's pointer to the entry's release (:func:`swap`); True when the
    channel now holds it, False when it moved since the read."""
    pointer = ChannelPointer(model=entry.model, channel=entry.channel, release=entry.to, version=entry.version,
                             previous=entry.from_, action="promote", time=entry.time, who=entry.who,
                             reason=entry.reason, extra={"op": op}).to_json()
    return swap(store, entry.model, entry.channel, pointer, token, op)


def record_history(store: ArtifactStore, entry: HistoryEntry) -> HistoryEntry:
    """Step 5: append the entry of a done swap to the channel's history; returns it."""
    store.append_history(entry.model, entry.channel, entry.to_json())
    return entry


def _refuse(store: ArtifactStore, entry: HistoryEntry, why: str, version: int) -> None:
    """Record a refused promotion in the channel's history and raise :class:`PromotionRefused`."""
    refused = replace(entry, action="refuse", refused=why, version=version).to_json()
    store.append_history(entry.model, entry.channel, refused)
    raise PromotionRefused(why, refused)


def release_stack(history: Iterable[HistoryEntry]) -> list[str]:
    """Replay a channel's history: each promotion pushes its release, each rollback pops one. The last
    item is the current release; the one before it is where a rollback goes."""
    stack: list[str] = []
    for e in history:
        if e.action == "promote" and e.to is not None:
            stack.append(e.to)
        elif e.action == "rollback" and stack:
            stack.pop()
    return stack


def rollback(store: ArtifactStore, settings: ReleaseSettings, model: str, channel: str, *,
             reason: str = "") -> dict[str, Any]:
    """Move ``channel`` back to the release it held before the current one (by its history: promotions
    push, rollbacks pop, so repeated rollbacks walk further back). No gates: that release was promoted
    before. Recorded in the history.

    Returns:
        The history line as JSON (``from`` the current release, ``to`` the restored one, ``version``).

    Raises:
        UserError: unknown channel; the channel is empty or has held a single release; the history does
            not end at the pointer's release; or the restored release's artifacts are gone from the store.
    """
    check_channel(settings, channel, "--channel")
    op = new_op()
    done: HistoryEntry | None = None
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        raw, token = store.channel_ref(model, channel)
        if done is not None and is_ours(raw, op):  # an earlier swap was applied; its answer was lost
            store.append_history(model, channel, done.to_json())
            return done.to_json()
        ptr = ChannelPointer.from_json(raw)
        if not ptr:
            raise UserError(f"channel {model}/{channel} holds no release; nothing to roll back")
        stack = release_stack(get_history(store, model, channel))
        if not stack or stack[-1] != ptr.release:
            raise UserError(f"the history of {model}/{channel} does not "
                            f"end at the channel's release {ptr.release}; promote a release explicitly")
        if len(stack) < 2:
            raise UserError(f"{model}/{channel} has held only {ptr.release}; there is no earlier release "
                            f"to roll back to")
        target = get_release(store, model, stack[-2])
        gone = missing_artifacts(store, target)
        if gone:
            raise UserError(f"cannot roll {model}/{channel} back to {target.id}: artifacts missing from the "
                            f"store: {', '.join(gone)}; rebuild them or promote another release")
        version = ptr.version + 1
        entry = HistoryEntry(time=utc_now(), who=actor(), action="rollback", model=model, channel=channel,
                             from_=ptr.release, to=target.id, reason=reason, version=version, extra={"op": op})
        pointer = ChannelPointer(model=model, channel=channel, release=target.id, version=version,
                                 previous=ptr.release, action="rollback", time=entry.time, who=entry.who,
                                 reason=reason, extra={"op": op}).to_json()
        done = entry
        if swap(store, model, channel, pointer, token, op):
            store.append_history(model, channel, entry.to_json())
            return entry.to_json()
        get_logger(model=model, channel=channel).info("channel moved during the rollback; checking again",
                                                      attempt=attempt)
    raise UserError(f"{model}/{channel} moved {SWAP_ATTEMPTS} times while this rollback was being checked "
                    f"(compare-and-swap lost each time); nothing changed. Re-run the rollback")


def new_op() -> str:
    """A fresh operation id (16 hex chars): a promotion or rollback writes it into the pointer it swaps
    in and into its history entry, so that it can tell its own swap when the answer to it was lost."""
    return secrets.token_hex(8)


def is_ours(raw: Any, op: str) -> bool:
    """Does the pointer ``raw`` carry the operation id ``op`` (it is the swap of this operation)?"""
    return isinstance(raw, dict) and raw.get("op") == op


def swap(store: ArtifactStore, model: str, channel: str, pointer: dict[str, Any], token: str | None,
         op: str) -> bool:
    """Compare-and-swap the pointer; True when the channel now holds ``pointer``. A wire fault whose
    request may have been applied (a reset after the server wrote it) reads the pointer back: when it
    carries ``op`` the swap was ours and it counts as done; when it does not, the swap lost (False) and the
    caller checks again; when the pointer cannot be read either, the fault is raised.

    Raises:
        StoreError: the swap failed and the pointer cannot be read back.
    """
    try:
        return store.swap_channel(model, channel, pointer, token)
    except StoreError as first:
        try:
            raw, _ = store.channel_ref(model, channel)
        except StoreError:
            raise first from None
        get_logger(model=model, channel=channel).warning(
            "the answer to a channel swap was lost; read the pointer back", error=str(first), ours=is_ours(raw, op))
        return is_ours(raw, op)


def missing_artifacts(store: ArtifactStore, rel) -> list[str]:
    """The targets of a release whose artifact is not complete in the store, or whose pinned files (by
    sha256 and size) are not all there as blobs: such a release cannot be promoted or rolled back to."""
    return [a.target for a in rel.artifacts
            if not store.is_complete(a.key)
            or any(store.blob_size(e["sha256"]) != e["size"] for e in a.files.values())]


def corrupt_pointer(store: ArtifactStore, model: str, channel: str) -> str | None:
    """One line for a channel pointer that is there but is not one (not a JSON object, or no release named):
    the file, what is wrong and the fix (promote the release its history last recorded: a promotion replaces
    an unreadable pointer); None when the pointer is absent or reads."""
    from neuron_build.store import layout

    raw, token = store.channel_ref(model, channel)
    if token is None or ChannelPointer.from_json(raw) is not None:
        return None
    where = f"{store.shared_tier.location}/{layout.channel_path(model, channel)}"
    why = "not a JSON object" if raw is None else "JSON, but no release named"
    last = next((e.get("to") for e in reversed(store.history(model, channel)) if isinstance(e.get("to"), str)), None)
    fix = (f"promote the release its history last recorded again (`neuron-build promote {model} {last} --to "
           f"{channel}`) to rewrite it" if last else
           f"its history records no promotion: move it aside, then promote a release into {channel}")
    return f"{where}: not a channel pointer ({why}); {fix}"


def channel_rows(store: ArtifactStore, settings: ReleaseSettings, models: Iterable[str]) -> list[dict[str, Any]]:
    """One row per (model, declared channel): ``model``, ``channel``, ``release``, ``version``, ``time``,
    ``age_s`` (seconds since ``time``), ``who``, ``action``, ``dtype``, ``profile``, ``rolled_back`` (the
    release was rolled back from some channel before: :func:`rollbacks_of`) (None, version 0 and
    ``rolled_back`` False for an empty channel), ``corrupt`` (:func:`corrupt_pointer`: the one line for a
    pointer file that is there but does not parse; None otherwise)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = []
    for m in models:
        for c in settings.channels:
            p = get_pointer(store, m, c)
            rel = find_release(store, m, p.release) if p else None
            rows.append({"model": m, "channel": c, "corrupt": None if p else corrupt_pointer(store, m, c),
                         "release": p.release if p else None,
                         "version": p.version if p else 0, "time": p.time if p else None,
                         "age_s": seconds_since(p.time, now) if p else None, "who": p.who if p else None,
                         "action": p.action if p else None,
                         "dtype": rel.dtype if rel else None, "profile": rel.profile if rel else None,
                         "rolled_back": bool(p and rollbacks_of(store, settings, m, p.release))})
    return rows


__all__ = [
    "SWAP_ATTEMPTS",
    "PromotionRefused",
    "channel_rows",
    "check_channel",
    "corrupt_pointer",
    "check_waivers",
    "missing_artifacts",
    "promote",
    "release_stack",
    "rollback",
    "rollbacks_of",
]
