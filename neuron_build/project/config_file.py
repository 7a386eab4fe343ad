"""Reading ``buckets.toml`` before its schema: the TOML parse that :func:`neuron_build.project.config.load_project`
checks, and ``[build] state_dir``, which the plan cache's no-op path needs without the schema (no pydantic
import: a no-op build stays fast)."""

from __future__ import annotations

import sys
from typing import Any

from neuron_build.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["DEFAULT_STATE_DIR", "parse_config", "state_dir_setting"]

#: ``[build] state_dir`` when the config does not set it (relative to the config's folder)
DEFAULT_STATE_DIR = ".neuron-build"


def parse_config(shown: str, raw: bytes) -> dict[str, Any]:
    """The TOML document of a config file's bytes ``raw`` (``shown``: the file as its errors name it).

    Raises:
        ConfigError: not UTF-8 text, or not valid TOML (naming a UTF-8 byte-order mark, which TOML does not
            allow, when the file starts with one).
    """
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(shown, [f"not UTF-8 text: {e}"]) from None
    except tomllib.TOMLDecodeError as e:
        bom = "; the file starts with a UTF-8 byte-order mark, which TOML does not allow: save it as UTF-8 " \
              "without BOM" if raw.startswith(b"\xef\xbb\xbf") else ""
        raise ConfigError(shown, [f"not valid TOML: {e}{bom}"]) from None


def state_dir_setting(shown: str, raw: bytes) -> str | None:
    """``[build] state_dir`` of a config file's bytes ``raw``, as its schema reads it (default
    :data:`DEFAULT_STATE_DIR`); None when it is not a string (the schema's check says what is wrong).
    The TOML is parsed only when the bytes name ``state_dir``.

    Raises:
        ConfigError: as :func:`parse_config`, when it parses.
    """
    if b"state_dir" not in raw:
        return DEFAULT_STATE_DIR
    build = parse_config(shown, raw).get("build")
    state = build.get("state_dir", DEFAULT_STATE_DIR) if isinstance(build, dict) else DEFAULT_STATE_DIR
    return state if isinstance(state, str) else None
