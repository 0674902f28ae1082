"""`airgate audit-signer create|public`: the key that signs audit checkpoints (`[audit.signer]`).

Both print the public key as a trusted-keys file wants it: a `#` line naming the key id, the
algorithm and where the key is held, then the key text.  So
`airgate audit-signer public >> /etc/airgate/audit-trusted.keys` pins it, and the file can be
named in `[audit] trusted_keys`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer

from bundles import BundleError
from bundles.kms.signer import VerifyKey, parse_verify_key

from ..access.audit_signer import (
    create_audit_signing_key,
    default_audit_key_file,
    open_audit_signer,
)
from ..config import ConfigError, Settings
from .common import ConfigOpt, DataDirOpt, err, fail, load_cli_settings

__all__ = ["audit_signer_app"]

audit_signer_app = typer.Typer(
    help="The key that signs audit checkpoints ([audit.signer]): create it, print its public key.",
    no_args_is_help=True,
)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        raise fail(f"configuration error: {exc}", 2) from None
    except BundleError as exc:
        raise fail(str(exc)) from None


def _where(settings: Settings) -> str:
    signer = settings.audit.signer
    if signer.provider == "local":
        return f"local:{signer.key_ref or default_audit_key_file(settings)}"
    return f"{signer.provider}:{signer.key_ref}"


def _print(key: VerifyKey, where: str) -> None:
    typer.echo(f"# audit checkpoint key {key.key_id} ({key.alg}), held by {where}")
    typer.echo(key.text)


@audit_signer_app.command("create")
def create(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Create the signing key in the configured provider; print the public key to pin in
    `[audit] trusted_keys`.  An existing key is never replaced."""
    settings = load_cli_settings(config, data_dir)
    with _errors():
        key = parse_verify_key(create_audit_signing_key(settings))
    err.print(f"created the audit signing key {key.key_id}", highlight=False, markup=False)
    _print(key, _where(settings))


@audit_signer_app.command("public")
def public(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Print the configured signer's public key and key id (read from the provider; nothing
    is created)."""
    settings = load_cli_settings(config, data_dir)
    with _errors():
        signer = open_audit_signer(settings, create_default=False)
        try:
            key = signer.verify_key
        finally:
            signer.close()
    _print(key, _where(settings))
