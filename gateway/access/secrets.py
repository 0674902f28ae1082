"""Secrets that replicas share, and the one way each is given to them.

Replicas behind one load balancer read one database of API keys, so they must key it with one
pepper: a replica that minted its own would reject every key the others accept.  A shared
secret therefore comes from the platform's secret store, never from the data directory, in one
of two forms:

- a file the platform mounts (a Kubernetes Secret volume, a systemd credential), named in the
  configuration; a path that starts with `${CREDENTIALS_DIRECTORY}/` is resolved against the
  variable systemd sets for `LoadCredential=`, so the unit need not know where systemd puts it;
- an environment variable holding the value (Kubernetes `env.valueFrom.secretKeyRef`).

    shared secret            variable                        file
    API key pepper           AIRGATE_PEPPER                  [auth] pepper_file
    PKCS#11 PIN, Vault token [kms.pkcs11] pin_env,           -
                             [kms.vault_transit] token_env
    local KMS key (bundles)  -                               [kms.local] key_file

Derived, so shared with the pepper: the prefix-cache salts and the audit chain ids.  Public but
pinned alike on every replica: `[audit] trusted_keys`, `[bundles] trusted_keys` (keys or files).

A secret given either way is refused, not replaced, when it is missing or malformed; only when
neither is given does a single node mint its own in the data directory.  Errors are
`ConfigError`s that name the file or the variable, never the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .. import env
from ..config import ConfigError, Settings
from .auth import (
    AuthConfigError,
    default_pepper_path,
    load_or_create_pepper,
    pepper_from_text,
    read_pepper_file,
)

__all__ = ["load_pepper", "secret_path"]

_CREDENTIALS = "${" + env.CREDENTIALS_DIRECTORY + "}/"


def secret_path(text: str, environ: Mapping[str, str] | None = None) -> Path:
    """The path of a configured secret file, `${CREDENTIALS_DIRECTORY}/` resolved."""
    if not text.startswith(_CREDENTIALS):
        return Path(text)
    directory = (os.environ if environ is None else environ).get(env.CREDENTIALS_DIRECTORY)
    if not directory:
        raise ConfigError(
            f"{text} names a systemd credential, but ${env.CREDENTIALS_DIRECTORY} is not set "
            "(the unit's LoadCredential= sets it)"
        )
    return Path(directory) / text.removeprefix(_CREDENTIALS)


def load_pepper(
    settings: Settings, environ: Mapping[str, str] | None = None, *, create: bool = True
) -> bytes:
    """The deployment's API key pepper: `$AIRGATE_PEPPER`, else `[auth] pepper_file` (which
    must exist), else the data dir's own file, created when missing if `create`.

    Giving both is refused rather than ranked: two sources that may disagree are a replica
    waiting to reject the others' keys.
    """
    environ = os.environ if environ is None else environ
    configured = settings.auth.pepper_file
    try:
        if env.PEPPER in environ:
            if configured:
                raise ConfigError(
                    f"both ${env.PEPPER} and [auth] pepper_file give the pepper: give one"
                )
            return pepper_from_text(environ[env.PEPPER], env.PEPPER)
        if configured:
            path = secret_path(configured, environ)
            try:
                return read_pepper_file(path, mounted=True)
            except FileNotFoundError:
                raise ConfigError(
                    f"[auth] pepper_file {path} does not exist; refusing to start with a new "
                    "pepper, which would reject every API key made with the shared one"
                ) from None
            except OSError as exc:  # not readable by this user, a directory, ...
                raise ConfigError(
                    f"[auth] pepper_file {path} cannot be read ({type(exc).__name__})"
                ) from None
        path = default_pepper_path(settings.data_dir)
        if not create and not path.exists():
            raise ConfigError(
                f"no pepper: neither ${env.PEPPER} nor [auth] pepper_file is set, and this "
                f"data directory has none ({path}): it never started a gateway"
            )
        return load_or_create_pepper(path)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
