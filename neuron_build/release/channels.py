"""Channels: promotion (gates, then compare-and-swap of the pointer), rollback, and the channel table.

A **promotion** reads the channel's pointer, evaluates the gates against the release it points at, then
takes the channel's lock (:meth:`~neuron_build.store.contract.ArtifactStore.channel_lock`) and swaps the
pointer only if its ``version`` is still the one it read (compare-and-swap). Of two promotions that read
the same version, exactly one wins; the other is refused with the winner named. Every promotion, refused
promotion and rollback is appended to the channel's history.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from filelock import Timeout

from neuron_build.errors import UserError
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.gates import evaluate_gates, format_gates
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
from neuron_build.util import age, utc_now

#: Seconds a promotion or rollback waits for another one on the same channel to finish.
LOCK_TIMEOUT_S = 120.0


class PromotionRefused(UserError):
    """A promotion that did not move the channel: a gate failed, or another promotion won the race.

    Attributes:
        entry: the history line recorded for the refusal, as JSON (``gates`` holds every gate's verdict).
    """

    def __init__(self, message: str, entry: dict[str, Any]):
        super().__init__(message)
        self.entry = entry


def promote(store: ArtifactStore, settings: ReleaseSettings, model: str, to: str, *, release: str | None = None,
            from_channel: str | None = None, reason: str = "", allow_unvalidated: bool = False,
            device_kind: str | None = None, before_swap: Callable[[], None] | None = None,
            factory_root=None) -> dict[str, Any]:
    """Promote a release (by id) or the release another channel holds into channel ``to``.

    Reads ``to``'s pointer, evaluates the gates against the release it points at, then, holding
    ``to``'s lock, swaps the pointer only if its version is unchanged. Appends one history line either way.

    Args:
        release, from_channel: exactly one: a release id (or unique prefix), or a channel to take it from.
        reason: free text recorded in the history.
        allow_unvalidated: let a failed validation gate pass (recorded).
        device_kind: override the channel's serving device kind (``[release]``) for the gates.
        before_swap: called after the gates and before the lock (tests use it to line up a race).
        factory_root: where a compile-cache release's model factory imports from for the warm-up gate.

    Returns:
        The history line of the promotion as JSON (``version`` is the channel's new version).

    Raises:
        UserError: unknown channel or release, empty source channel, both or neither source given.
        PromotionRefused: a gate failed, the channel already holds the release, or another promotion moved
            the channel between the read and the swap (the message names the winner). Recorded in history.
    """
    check_channel(settings, to, "--to")
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
    gone = [a.target for a in rel.artifacts if not store.is_complete(a.key)]
    if gone:
        raise UserError(f"release {rel.id} cannot be promoted: artifacts missing from the store: "
                        f"{', '.join(gone)}; rebuild them (`neuron-build build {model}`)")

    seen = get_pointer(store, model, to)
    seen_version = seen.version if seen else 0
    baseline = get_release(store, model, seen.release) if seen else None
    gates = evaluate_gates(store, settings, rel, to, from_channel, baseline, kind, allow_unvalidated,
                           factory_root=factory_root)
    if before_swap is not None:
        before_swap()

    entry = HistoryEntry(time=utc_now(), who=actor(), action="promote", model=model, channel=to,
                         from_=seen.release if seen else None, to=rel.id, source=source, reason=reason,
                         device_kind=kind, allow_unvalidated=allow_unvalidated, gates=[g.to_json() for g in gates])
    try:
        with store.channel_lock(model, to, LOCK_TIMEOUT_S):
            now = get_pointer(store, model, to)
            now_version = now.version if now else 0
            if now_version != seen_version:
                why = (f"{model}/{to} moved to {now.release} (version {now_version}, promoted by "
                       f"{now.who} at {now.time}) while this promotion of {rel.id} was checked "
                       f"against version {seen_version}; nothing changed. Re-run it to check it against "
                       f"{now.release}")
                _refuse(store, entry, why, now_version)
            if seen and seen.release == rel.id:
                _refuse(store, entry, f"{model}/{to} already holds {rel.id} (version {seen_version})", seen_version)
            failed = [g for g in gates if not g.passed]
            if failed:
                why = (f"promotion of {rel.id} into {model}/{to} refused by {len(failed)} gate(s):\n"
                       + format_gates(gates))
                if any(g.name == "validated" for g in failed):
                    why += (f"\nvalidate on {kind} with `neuron-build validate {model}`, or pass "
                            f"--allow-unvalidated (recorded in the history)")
                _refuse(store, entry, why, seen_version)
            entry = replace(entry, version=seen_version + 1)
            store.set_channel(model, to, ChannelPointer(
                model=model, channel=to, release=rel.id, version=seen_version + 1, previous=entry.from_,
                action="promote", time=entry.time, who=entry.who, reason=reason).to_json())
            store.append_history(model, to, entry.to_json())
    except Timeout:
        raise UserError(f"channel {model}/{to} is locked by another promotion for over {LOCK_TIMEOUT_S:g} s; "
                        f"if none is running, remove {store.channel_lock_path(model, to)}") from None
    return entry.to_json()


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
    try:
        with store.channel_lock(model, channel, LOCK_TIMEOUT_S):
            ptr = get_pointer(store, model, channel)
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
            gone = [a.target for a in target.artifacts if not store.is_complete(a.key)]
            if gone:
                raise UserError(f"cannot roll {model}/{channel} back to {target.id}: artifacts missing from the "
                                f"store: {', '.join(gone)}; rebuild them or promote another release")
            version = ptr.version + 1
            entry = HistoryEntry(time=utc_now(), who=actor(), action="rollback", model=model, channel=channel,
                                 from_=ptr.release, to=target.id, reason=reason, version=version)
            store.set_channel(model, channel, ChannelPointer(
                model=model, channel=channel, release=target.id, version=version, previous=ptr.release,
                action="rollback", time=entry.time, who=entry.who, reason=reason).to_json())
            store.append_history(model, channel, entry.to_json())
    except Timeout:
        raise UserError(f"channel {model}/{channel} is locked for over {LOCK_TIMEOUT_S:g} s") from None
    return entry.to_json()


def channel_rows(store: ArtifactStore, settings: ReleaseSettings, models: Iterable[str]) -> list[dict[str, Any]]:
    """One row per (model, declared channel): ``model``, ``channel``, ``release``, ``version``, ``time``,
    ``age`` (``3h``), ``who``, ``action``, ``dtype``, ``profile`` (None and version 0 for an empty channel)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = []
    for m in models:
        for c in settings.channels:
            p = get_pointer(store, m, c)
            rel = find_release(store, m, p.release) if p else None
            rows.append({"model": m, "channel": c, "release": p.release if p else None,
                         "version": p.version if p else 0, "time": p.time if p else None,
                         "age": age(p.time, now) if p else None, "who": p.who if p else None,
                         "action": p.action if p else None,
                         "dtype": rel.dtype if rel else None, "profile": rel.profile if rel else None})
    return rows


__all__ = [
    "LOCK_TIMEOUT_S",
    "PromotionRefused",
    "channel_rows",
    "check_channel",
    "promote",
    "release_stack",
    "rollback",
]
