"""Normalisation and checking of neuronx-cc compiler args.

``--optlevel 2``, ``--optlevel=2``, ``-O2`` and ``-O 2`` are one setting [doc: neuronx-cc CLI reference],
so a profile's args are parsed into (flag, value) pairs, spelled canonically (``--optlevel=2``) and sorted
by flag name. The result is order-independent, which keeps the key stable when a user reorders flags.

Facts used here come from the Neuron SDK's neuronx-cc reference (tags: [doc] = stated in the Neuron SDK
documentation, [seen] = seen in real output; the user's view is ``docs/neuron.md``): the enumerated values of ``--optlevel``, ``--model-type``,
``--auto-cast``, ``--auto-cast-type`` and ``--lnc`` [doc]; ``cnn-training`` is accepted by the
compiler but undocumented [seen].
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Iterable

#: canonical flag -> allowed values (None: any value). [doc]
ENUMERATED: dict[str, tuple[str, ...]] = {
    "--optlevel": ("1", "2", "3"),
    "--model-type": ("generic", "transformer", "unet-inference", "cnn-training"),
    "--auto-cast": ("none", "matmult", "all"),
    "--auto-cast-type": ("bf16", "fp16", "tf32", "fp8_e4m3"),
    "--lnc": ("1", "2"),
    "--verbose": ("debug", "info", "warning", "error", "critical"),
}
#: flags that take a value, beyond the enumerated ones.
VALUE_FLAGS = {"--logfile", "--target", "--output", "--framework", "--pipeline", "--distribution-strategy",
               "--internal-hlo2tensorizer-options", "--internal-backend-options", "--tensorizer-options"}
#: flags that never take a value. [doc]
BOOL_FLAGS = {"--enable-mixed-precision-accumulation", "--disable-mixed-precision-accumulation",
              "--enable-saturate-infinity", "--enable-fast-loading-neuron-binaries",
              "--enable-fast-context-switch", "--fast-math"}
#: other spellings -> canonical flag.
ALIASES = {"-O": "--optlevel", "--logical-nc-config": "--lnc"}
#: flags neuron-build sets itself; a profile may not set them.
RESERVED = {
    "--target": "set the hardware target with `target` under [build]",
    "--output": "neuron-build chooses the output path inside the compiler workdir",
    "--logfile": "neuron-build pins the log at <workdir>/log-neuron-cc.txt and stores it as compile.log",
    "--framework": "torch_neuronx.trace passes --framework itself",
}
#: flags that do not change the compiled artifact, left out of the key.
NOT_IN_KEY = {"--verbose"}
#: pairs of flags that contradict each other.
OPPOSITES = {"--enable-mixed-precision-accumulation": "--disable-mixed-precision-accumulation"}


def _allowed_hint(value: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    close = difflib.get_close_matches(value, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"allowed: {', '.join(allowed)}{hint}"


def _tokens(args: str | Iterable[str]) -> list[str]:
    if isinstance(args, str):
        return shlex.split(args)
    out: list[str] = []
    for a in args:
        if not isinstance(a, str):
            raise ValueError(f"compiler args must be strings, got {a!r}")
        out.extend(shlex.split(a))
    return out


def _split(tokens: list[str]) -> list[tuple[str, str | None]]:
    """Turn tokens into (flag, value) pairs in the order given."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("-O") and not tok.startswith("--"):
            flag, value = "--optlevel", tok[2:].lstrip("=") or None
        elif tok.startswith("--"):
            flag, eq, value = tok.partition("=")
            flag = ALIASES.get(flag, flag)
            if not eq:
                value = None
        elif tok.startswith("-"):
            flag, value = tok, None
        else:
            raise ValueError(f"stray value {tok!r}: a value must follow its flag (e.g. '--optlevel 2')")
        if value is None and flag not in BOOL_FLAGS and i < len(tokens) and not tokens[i].startswith("-"):
            takes_value = flag in ENUMERATED or flag in VALUE_FLAGS or flag not in BOOL_FLAGS
            if takes_value:
                value = tokens[i]
                i += 1
        if value is None and (flag in ENUMERATED or flag in VALUE_FLAGS):
            raise ValueError(f"{flag} needs a value")
        pairs.append((flag, value))
    return pairs


def normalize_compiler_args(args: str | Iterable[str]) -> tuple[str, ...]:
    """Parse, check and canonicalise neuronx-cc compiler args.

    Args:
        args: a string (split like a shell would) or a list of strings, each of which may itself hold
            a flag and its value (``"--optlevel 2"``).

    Returns:
        A sorted tuple of ``--flag=value`` / ``--flag`` strings, one per flag.

    Raises:
        ValueError: a flag reserved to neuron-build (``--target``, ``--output``, ``--logfile``,
            ``--framework``), an enumerated flag with a value outside its allowed set (``matmul`` for
            ``matmult``), a flag given twice with different values, contradictory flags, or a stray
            value. The message names the flag and what is allowed.
    """
    seen: dict[str, str | None] = {}
    for flag, value in _split(_tokens(args)):
        if flag in RESERVED:
            raise ValueError(f"{flag} may not be set in a profile: {RESERVED[flag]}")
        if flag in ENUMERATED and value is not None:
            allowed = ENUMERATED[flag]
            ok = value in allowed or (flag == "--verbose" and value.isdigit())
            if not ok:
                raise ValueError(f"{flag}={value} is not a valid value; {_allowed_hint(value, allowed)}")
        if flag in seen and seen[flag] != value:
            raise ValueError(
                f"{flag} is given twice with different values ({_show(flag, seen[flag])} and "
                f"{_show(flag, value)}); keep one")
        seen[flag] = value
    for a, b in OPPOSITES.items():
        if a in seen and b in seen:
            raise ValueError(f"{a} and {b} contradict each other; keep one")
    return tuple(_show(f, seen[f]) for f in sorted(seen))


#: The flags documented for neuronx-cc that a profile may set (the user's list: ``docs/neuron.md``).
DOCUMENTED = tuple(sorted((set(ENUMERATED) | VALUE_FLAGS | BOOL_FLAGS) - set(RESERVED)))


def unknown_flags(normalized: Iterable[str], unchecked: Iterable[str] = ()) -> list[str]:
    """The flags of normalised args that are neither :data:`DOCUMENTED` nor reserved nor in ``unchecked``
    (flag names a profile accepts on purpose: ``unchecked_args``), in order."""
    known = set(DOCUMENTED) | set(RESERVED) | {ALIASES.get(f, f) for f in unchecked} | set(unchecked)
    return [f for f in (a.partition("=")[0] for a in normalized) if f not in known]


def flag_faults(profile: str, normalized: Iterable[str], unchecked: Iterable[str] = ()) -> list[str]:
    """The one line for a profile whose compiler args hold a flag that is not documented (it is in the key:
    a misspelt flag would make new keys and fail, or be ignored, at compile time): it names the flag, the
    documented ones and the escape hatch (``unchecked_args``); empty when there is none."""
    unknown = unknown_flags(normalized, unchecked)
    if not unknown:
        return []
    u = unknown[0]
    return [f"profiles.{profile}.compiler_args: {u} is not a documented neuronx-cc flag (documented: "
            f"{', '.join(DOCUMENTED)}); fix the spelling, or if your neuronx-cc takes it, add unchecked_args = "
            f"[\"{u}\"] to [profiles.{profile}]"]


def _show(flag: str, value: str | None) -> str:
    return flag if value is None else f"{flag}={value}"


def key_args(normalized: Iterable[str]) -> tuple[str, ...]:
    """The normalised args that belong in the key: all but those that do not change the artifact
    (``--verbose``)."""
    return tuple(a for a in normalized if a.partition("=")[0] not in NOT_IN_KEY)


__all__ = ["ALIASES", "BOOL_FLAGS", "DOCUMENTED", "ENUMERATED", "flag_faults", "NOT_IN_KEY", "OPPOSITES", "RESERVED", "VALUE_FLAGS", "key_args",
           "normalize_compiler_args", "unknown_flags"]
