"""``weights = "external"`` against the backend that would build it: a profile that asks for the weights
apart, used by a model, on a backend whose compilers compile them in (torchscript, compile-cache,
torchneuron: :attr:`neuron_build.backends.BackendSpec.weights_apart`) is a config error, not a choice that is
silently ignored while it changes the key.

Checked twice: when ``buckets.toml`` loads, for a ``[build] backend`` that names a backend
(:func:`backend_weights`, one of :data:`neuron_build.project.config_checks.PROJECT_CHECKS`); and once the
backend is resolved for this host (:class:`neuron_build.project.keys.KeyMaker`: ``--backend`` and
``backend = "auto"``). ``auto`` is not refused when the file loads: it resolves per host to ``neuron``,
``torchneuron`` or ``inductor`` (:func:`neuron_build.project.toolchain.resolve_backend`), and only
``torchneuron`` (a trn2/trn3 target with the native torch-neuronx installed) cannot keep weights apart, so
the same file is right on one host and wrong on another; the check after resolution names the backend
``auto`` chose there.
"""

from __future__ import annotations

from typing import Any

from neuron_build.backends import BACKENDS, find_backend
from neuron_build.project.config_errors import toml_path

# Reads the models of neuron_build.project.config (ConfigFile, Profile) by attribute: config imports the
# checks, and an import back would be a cycle.
ConfigFile = Any


def _apart() -> str:
    return " or ".join(f'"{b.name}"' for b in BACKENDS.values() if b.weights_apart)


def weights_faults(cfg: ConfigFile, backend: str, named_by: str) -> list[str]:
    """One fault per profile with ``weights = "external"`` (or ``inline_weights_to_neff = false``) that a
    model uses, when ``backend`` cannot keep weights apart; empty for a backend that can, and for ``auto``
    or an unknown name (resolved and checked later).

    Args:
        cfg: the parsed ``buckets.toml`` (a :class:`~neuron_build.project.config.ConfigFile`).
        backend: the backend name the targets build with.
        named_by: where it comes from, for the message (``[build] backend``, ``--backend``, ``backend =
            "auto" on this host``).

    Returns:
        One line per profile: its TOML path and key, the backend, the models that use it, and the fix.
    """
    spec = find_backend(backend)
    if spec is None or spec.weights_apart:
        return []
    faults = []
    for name, prof in cfg.profiles.items():
        users = [m for m, spec_m in cfg.models.items() if name in spec_m.profiles]
        if prof.weights != "external" or not users:
            continue
        given = "weights" if "weights" in prof.model_fields_set else "inline_weights_to_neff"
        said = 'weights = "external"' if given == "weights" else "inline_weights_to_neff = false"
        faults.append(f"{toml_path(('profiles', name, given))}: {said} asks for the weights apart from the compiled "
                      f"artifact, but the {backend} backend ({named_by}) compiles them in, so it would be ignored "
                      f"(model{'s' if len(users) > 1 else ''} {', '.join(users)}); set weights = \"inline\" in "
                      f"[profiles.{name}], or a backend that keeps weights apart: backend = {_apart()} under [build]")
    return faults


def backend_weights(cfg: ConfigFile, root: Any) -> list[str]:
    """The load-time check (a :data:`~neuron_build.project.config_checks.ProjectCheck`): :func:`weights_faults`
    of ``[build] backend`` when it names a backend (``auto`` is checked once resolved)."""
    return weights_faults(cfg, cfg.build.backend, "[build] backend")


def keeps_choice(backend: str, graph: str | None) -> bool:
    """Does the profile's ``weights`` choice change what ``backend`` builds for a target of ``graph`` (None: a
    forward model)? False for a text-generation target of a backend whose text-generation compiler keeps the
    weights apart whatever the profile says (NxDI): the choice then stays out of its key."""
    spec = find_backend(backend)
    return not (graph and spec is not None and spec.textgen_weights_apart)


__all__ = ["backend_weights", "keeps_choice", "weights_faults"]
