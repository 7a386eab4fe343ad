"""A named AWS profile that does not exist, said in one line before any S3 client is made.

botocore raises ``ProfileNotFound`` from deep inside client creation when ``AWS_PROFILE`` (or
``[build] remote_options = { profile = ... }``) names a profile that neither the config file
(``AWS_CONFIG_FILE``, default ``~/.aws/config``) nor the credentials file (``AWS_SHARED_CREDENTIALS_FILE``,
default ``~/.aws/credentials``) defines. :func:`check_profile` turns that into a :class:`UserError` (exit 2)
naming the store, the profile, where it was set, the files looked in and the fix.
"""

from __future__ import annotations

import os
from typing import Any

from neuron_build.errors import UserError


def profile_problem(url: str, options: dict[str, Any], environ: dict[str, str] | None = None) -> str | None:
    """One line saying why the AWS profile the S3 store ``url`` would use does not exist, or None (no
    profile named, or it exists). ``options``: the store's fsspec options (``profile`` wins over
    ``AWS_PROFILE``, then ``AWS_DEFAULT_PROFILE``, as s3fs and boto3 read them)."""
    env = os.environ if environ is None else environ
    if options.get("profile"):
        name, source = str(options["profile"]), "[build] remote_options.profile (buckets.toml)"
    elif env.get("AWS_PROFILE"):
        name, source = env["AWS_PROFILE"], "AWS_PROFILE"
    elif env.get("AWS_DEFAULT_PROFILE"):
        name, source = env["AWS_DEFAULT_PROFILE"], "AWS_DEFAULT_PROFILE"
    else:
        return None
    import botocore.session

    saved = {v: os.environ.pop(v) for v in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE") if v in os.environ}
    try:  # a session that is not itself bound to the missing profile, to list the profiles there are
        known = sorted(botocore.session.Session().available_profiles)
    except Exception:  # an unreadable config file: let botocore say so where it reads it
        return None
    finally:
        os.environ.update(saved)
    if name in known:
        return None
    files = (f"{env.get('AWS_CONFIG_FILE') or '~/.aws/config'} or "
             f"{env.get('AWS_SHARED_CREDENTIALS_FILE') or '~/.aws/credentials'}")
    there = f"profiles there: {', '.join(known)}" if known else "no profiles are defined there"
    return (f"{url}: AWS profile '{name}' (set by {source}) is not defined in {files} ({there}); create it with "
            f"`aws configure --profile {name}`, or set {source} to a profile that exists")


def check_profile(url: str, options: dict[str, Any]) -> None:
    """Raise :class:`UserError` (exit 2, :func:`profile_problem`'s line) when the named profile is missing."""
    why = profile_problem(url, options)
    if why is not None:
        raise UserError(why)


__all__ = ["check_profile", "profile_problem"]
