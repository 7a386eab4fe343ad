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
from dataclasses import replace
from typing import Any

from neuron_build.errors import ExitCode, StoreError, UserError
from neuron_build.log import get_logger
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.gates import GATES, WAIVABLE, evaluate_gates, format_gates
from neuron_build.release.records import (
    ChannelPointer,
    HistoryEntry,
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


def promote(store: ArtifactStore, settings: ReleaseSettings, model: str, to: str, *, release: str | None = None,
            from_channel: str | None = None, reason: str = "", allow_unvalidated: bool = False,
            device_kind: str | None = None, before_swap: Callable[[], None] | None = None,
            waive: Iterable[str] = (), factory_root=None) -> dict[str, Any]:
    """Promote a release (by id) or the release another channel holds into channel ``to``.

    Reads ``to``'s pointer and its token, evaluates the gates against the release it points at, then swaps
    the pointer only if the token is unchanged (compare-and-swap). A lost swap reads the pointer again and
    checks the gates again (at most :data:`SWAP_ATTEMPTS` rounds). Adds one history entry either way.

    Args:
        release, from_channel: exactly one: a release id (or unique prefix), or a channel to take it from.
        reason: free text recorded in the history.
        allow_unvalidated: let a failed validation gate pass (recorded; needs ``reason``).
        waive: gates (:data:`~neuron_build.release.gates.WAIVABLE`) let through when they fail, verdict
            ``waived``; needs ``reason``; recorded in the history as ``waivers``.
        device_kind: override the channel's serving device kind (``[release]``) for the gates.
        before_swap: called after the first round's gates and before its swap (tests use it to line up a
            race).
        factory_root: where a compile-cache release's model factory imports from for the warm-up gate.

    Returns:
        The history line of the promotion as JSON (``version`` is the channel's new version).

    Raises:
        UserError: unknown channel or release, empty source channel, both or neither source given; a
            waiver without a reason or of an unknown gate.
        PromotionRefused: a gate failed (checked against the channel's release at the last read); the
            release was rolled back before (:func:`rollbacks_of`) and no reason was given; the channel
            already holds the release; or the channel moved at every one of the :data:`SWAP_ATTEMPTS`
            rounds. Recorded in history (exit 3).
    """
    check_channel(settings, to, "--to")
    waivers = check_waivers(waive, reason, allow_unvalidated)
    if (release is None) == (from_channel is None):
        raise UserError("give either a RELEASE id or --from CHANNEL to promote from, not both or neither")
    if from_channel is not None:
        check_channel(settings, from_channel, "--from")
        if from_channel == to:
            raise UserError(f"--from and --to are both '{to}'")
        src = get_pointer(store, model, from_channel)
        if not src:
            raise UserError(f"channel '{from_channel}' of model '{model}' holds no release yet; promote one "
                            f"into it first")
        rel = get_release(store, model, src.release)
        source = {"channel": from_channel, "version": src.version}
    else:
        rel = get_release(store, model, release)
        source = {"release": rel.id}
    if rel.model != model:
        raise UserError(f"release {rel.id} is of model '{rel.model}', not '{model}'")
    kind = device_kind or settings.device_kind(to)
    gone = missing_artifacts(store, rel)
    if gone:
        raise UserError(f"release {rel.id} cannot be promoted: artifacts missing from the store: "
                        f"{', '.join(gone)}; rebuild them (`neuron-build build {model}`)")

    entry = None
    rolled = rollbacks_of(store, settings, model, rel.id)
    extra: dict[str, Any] = {}
    if waivers:
        extra["waivers"] = [{"gate": g, "reason": r} for g, r in waivers.items()]
    if rolled:
        extra["rolled_back"] = rolled
    op = new_op()
    done: HistoryEntry | None = None  # the entry of the last swap we sent (its answer may be lost)
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        raw, token = store.channel_ref(model, to)
        if done is not None and is_ours(raw, op):  # an earlier swap was applied; its answer was lost
            store.append_history(model, to, done.to_json())
            return done.to_json()
        seen = ChannelPointer.from_json(raw)
        seen_version = seen.version if seen else 0
        baseline = get_release(store, model, seen.release) if seen else None
        gates = evaluate_gates(store, settings, rel, to, from_channel, baseline, kind, allow_unvalidated, waivers,
                               factory_root=factory_root)
        if before_swap is not None and attempt == 1:
            before_swap()
        entry = HistoryEntry(time=utc_now(), who=actor(), action="promote", model=model, channel=to,
                             from_=seen.release if seen else None, to=rel.id, source=source, reason=reason,
                             device_kind=kind, allow_unvalidated=allow_unvalidated,
                             gates=[g.to_json() for g in gates], extra=dict(extra))
        if seen and seen.release == rel.id:
            _refuse(store, entry, f"{model}/{to} already holds {rel.id} (version {seen_version})", seen_version)
        if rolled and not reason.strip():
            last_rb = rolled[-1]
            _refuse(store, entry, f"release {rel.id} was rolled back from {model}/{last_rb['channel']} at "
                    f"{last_rb['time']} by {last_rb['who']}"
                    + (f" (\"{last_rb['reason']}\")" if last_rb["reason"] else "")
                    + "; promoting it again needs --reason TEXT (recorded in the history)", seen_version)
        failed = [g for g in gates if not g.passed]
        if failed:
            why = (f"promotion of {rel.id} into {model}/{to} refused by {len(failed)} gate(s):\n"
                   + format_gates(gates))
            if any(g.name == "validated" for g in failed):
                why += (f"\nvalidate on {kind} with `neuron-build validate {model}`, or pass "
                        f"--allow-unvalidated --reason TEXT (recorded in the history)")
            if any(g.name == "latency" for g in failed):
                why += (f"\nre-measure both in one session with `neuron-build bench {model} --against {to}`, "
                        f"or pass --waive latency --reason TEXT (recorded in the history)")
            _refuse(store, entry, why, seen_version)
        entry = replace(entry, version=seen_version + 1, extra={**entry.extra, "op": op})
        pointer = ChannelPointer(model=model, channel=to, release=rel.id, version=seen_version + 1,
                                 previous=entry.from_, action="promote", time=entry.time, who=entry.who,
                                 reason=reason, extra={"op": op}).to_json()
        done = entry
        if swap(store, model, to, pointer, token, op):
            store.append_history(model, to, entry.to_json())
            return entry.to_json()
        get_logger(model=model, channel=to).info(
            "channel moved while the promotion was checked; checking again", release=rel.id,
            checked_version=seen_version, attempt=attempt)
    assert entry is not None
    why = (f"{model}/{to} moved {SWAP_ATTEMPTS} times while this promotion of {rel.id} was being checked "
           f"(compare-and-swap lost each time); nothing changed. Re-run the promotion")
    _refuse(store, entry, why, entry.version - 1 if entry.version else 0)
    raise AssertionError("unreachable")  # _refuse raises


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


def channel_rows(store: ArtifactStore, settings: ReleaseSettings, models: Iterable[str]) -> list[dict[str, Any]]:
    """One row per (model, declared channel): ``model``, ``channel``, ``release``, ``version``, ``time``,
    ``age_s`` (seconds since ``time``), ``who``, ``action``, ``dtype``, ``profile``, ``rolled_back`` (the
    release was rolled back from some channel before: :func:`rollbacks_of`) (None, version 0 and
    ``rolled_back`` False for an empty channel)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = []
    for m in models:
        for c in settings.channels:
            p = get_pointer(store, m, c)
            rel = find_release(store, m, p.release) if p else None
            rows.append({"model": m, "channel": c, "release": p.release if p else None,
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
    "check_waivers",
    "missing_artifacts",
    "promote",
    "release_stack",
    "rollback",
    "rollbacks_of",
]
