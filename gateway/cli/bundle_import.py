"""`airgate bundle import | list | remove | renew` on a laptop, `bundle renewal create` at HQ.

Imported bundles live in the data dir (`gateway/engines/imported.py`) and `airgate serve` serves
them from its next start, without any configuration but the pinned HQ signer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from bundles import (
    BundleError,
    BundleIntegrityError,
    TrustedKeys,
    create_renewal,
    load_signing_key,
    read_manifest,
    verify_renewal,
)
from bundles.manifest import timestamp

from ..config import ConfigError
from ..engines.import_store import import_bundle, remove_imported, renew_imported, server_holds
from ..engines.imported import ImportedModel, describe, usable_until
from .bundles import bundle_app
from .common import ConfigOpt, DataDirOpt, fail, load_cli_settings, out

__all__ = ["renewal_app"]

renewal_app = typer.Typer(
    help="Renewals of a bundle's offline window, signed at HQ.", no_args_is_help=True
)
bundle_app.add_typer(renewal_app, name="renewal")


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Bundle and clash errors become one red line and exit 1."""
    try:
        yield
    except BundleIntegrityError as exc:
        raise fail(f"{exc} [check: {exc.reason}]") from None
    except (BundleError, ConfigError) as exc:
        raise fail(str(exc)) from None


def _until(model: ImportedModel) -> str:
    return timestamp(model.until) if model.until is not None else "no end"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read the {what} {path}: {exc.strerror}", 2) from None


@bundle_app.command("import")
def import_(
    source: Annotated[Path, typer.Argument(help="The bundle from HQ (directory or .tar).")],
    model_id: Annotated[
        str | None, typer.Option("--id", help="Serve it under this model id (default: its name).")
    ] = None,
    replace: Annotated[
        bool, typer.Option(help="Replace an imported bundle with the same model id.")
    ] = False,
    renewal: Annotated[
        Path | None, typer.Option(help="A renewal from HQ for it (its offline window lapsed).")
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Verify a bundle from HQ and keep it, encrypted, in the data dir for `airgate serve`.

    Only the signers pinned in `[bundles] trusted_keys` are trusted; a server that runs
    serves it from its next start.
    """
    settings = load_cli_settings(config, data_dir)
    offered = _read(renewal, "renewal") if renewal is not None else None
    with _errors():
        model, new = import_bundle(
            settings,
            source,
            now=datetime.now(UTC),
            model_id=model_id,
            replace=replace,
            renewal=offered,
        )
    m = model.verified.manifest
    what = "imported" if new else "already imported"
    out.print(
        f"{what}: model {model.entry.model_id}, bundle {m.bundle_id}, signed by "
        f"{model.verified.signer}, engine {model.engine}, usable until {_until(model)}",
        markup=False,
        highlight=False,
    )
    if new and server_holds(settings):
        out.print("a running `airgate serve` serves it from its next start", highlight=False)


@bundle_app.command("list")
def list_(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Show the imported bundles, verified now against the pinned signers, with their end."""
    settings = load_cli_settings(config, data_dir)
    listed = describe(settings, datetime.now(UTC))
    if not listed:
        out.print("no imported bundles", highlight=False)
        return
    table = Table("model", "bundle id", "signed by", "engine", "usable until", "status")
    for column in table.columns[:4]:
        column.no_wrap = True
    refused = []
    for entry, state in listed:
        model = entry.model_id or "?"
        if isinstance(state, str):
            table.add_row(escape(model), entry.bundle_id, "-", "-", "-", "refused")
            refused.append(f"{model}: {state}")
            continue
        renewed = f" (renewed {state.renewal.renewal.issued})" if state.renewal else ""
        table.add_row(
            escape(model),
            entry.bundle_id,
            state.verified.signer,
            state.engine,
            _until(state) + renewed,
            "ok",
        )
    out.print(table)
    for line in refused:  # what `airgate serve` would say: it refuses to start
        out.print(line, markup=False, highlight=False)


@bundle_app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="The model id or bundle id of an imported bundle.")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Delete an imported bundle from the data dir (stop `airgate serve` first)."""
    settings = load_cli_settings(config, data_dir)
    if server_holds(settings):
        raise fail(
            "a running `airgate serve` uses this data dir and keeps serving the model until it "
            "stops: stop it first, then remove the bundle"
        )
    with _errors():
        entry = remove_imported(settings, name)
    out.print(
        f"removed model {entry.model_id or '?'} (bundle {entry.bundle_id})",
        markup=False,
        highlight=False,
    )


@bundle_app.command("renew")
def renew(
    renewal: Annotated[Path, typer.Argument(help="The renewal file from HQ.")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Verify a renewal from HQ and store it beside the imported bundle it names."""
    settings = load_cli_settings(config, data_dir)
    data = _read(renewal, "renewal")
    with _errors():
        entry, verified, until, stored = renew_imported(settings, data, now=datetime.now(UTC))
    what = "renewed" if stored else "already renewed"
    end = timestamp(until) if until is not None else "no end"
    out.print(
        f"{what}: model {entry.model_id} (bundle {entry.bundle_id}), issued "
        f"{verified.renewal.issued} by {verified.signer}, usable until {end}",
        markup=False,
        highlight=False,
    )
    if stored and server_holds(settings):
        out.print("a running `airgate serve` takes it from its next start", highlight=False)


@renewal_app.command("create")
def renewal_create(
    bundle: Annotated[Path, typer.Option(help="The bundle to renew (directory or .tar).")],
    signing_key: Annotated[Path, typer.Option(help="HQ's Ed25519 bundle signing key (PEM).")],
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the renewal.")],
    days: Annotated[
        int | None, typer.Option(help="Offline days granted (default: the bundle's).", min=1)
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Sign a renewal that restarts the bundle's offline window now (at HQ)."""
    settings = load_cli_settings(config, data_dir)
    now = datetime.now(UTC)
    with _errors():
        key = load_signing_key(signing_key)
        pinned = TrustedKeys.from_texts_or_files(settings.bundles.trusted_keys)
        # only a bundle this key (or a key pinned here) signed is renewed
        head = read_manifest(bundle, TrustedKeys([key.public_key(), *pinned.keys()]))
        data = create_renewal(head.manifest, head.digest, key, issued=now, days=days)
        made = verify_renewal(data, TrustedKeys([key.public_key()]))
    until = usable_until(head.manifest, made)
    try:
        fd = os.open(out_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise fail(f"{out_file} already exists; refusing to overwrite it", 2) from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    out.print(
        f"renewal of bundle {head.manifest.bundle_id} (model {head.manifest.model.name}) "
        f"written to {out_file}: issued {made.renewal.issued}, "
        f"{made.renewal.max_offline_days} days offline, usable until "
        f"{timestamp(until) if until else 'no end'}; signed by {made.signer}",
        markup=False,
        highlight=False,
    )
