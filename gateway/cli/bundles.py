"""`airgate bundle|signing-key|kms ...`: sealing, checking and re-keying model bundles offline."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from bundles import (
    BundleError,
    BundleIntegrityError,
    ModelInfo,
    TrustedKeys,
    create_signing_key,
    decrypt_check,
    init_key_file,
    key_id,
    load_signing_key,
    public_key_text,
    read_manifest,
    rekey_bundle,
    seal_bundle,
    sources_from_path,
    verify_bundle,
)

from ..engines.key_providers import KeyProviders, local_key_file, rotate_provider_key
from ..engines.sources import trusted_keys
from .common import ConfigOpt, DataDirOpt, err, fail, load_cli_settings
from .common import out as stdout  # `out` is also an option of `bundle create`

__all__ = ["bundle_app", "kms_app", "signing_key_app"]

bundle_app = typer.Typer(
    help="Seal, inspect, verify and re-key model bundles.", no_args_is_help=True
)
signing_key_app = typer.Typer(help="Ed25519 keys that sign bundle manifests.", no_args_is_help=True)
kms_app = typer.Typer(help="Key-encryption keys: create and rotate.", no_args_is_help=True)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Bundle errors become one red line and exit 1 (integrity failures name the check)."""
    try:
        yield
    except BundleIntegrityError as exc:
        raise fail(f"{exc} [check: {exc.reason}]") from None
    except BundleError as exc:
        raise fail(str(exc)) from None


class _Bars:
    """Rich progress bars keyed by step name, fed by the bundles' progress callback."""

    def __init__(self, totals: dict[str, int]) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<18}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        self._totals = totals
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _Bars:
        self._progress.__enter__()
        for step, total in self._totals.items():
            self._tasks[step] = self._progress.add_task(step, total=total)
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)

    def __call__(self, step: str, done: int, total: int) -> None:
        if step not in self._tasks:
            self._tasks[step] = self._progress.add_task(step, total=total)
        self._progress.advance(self._tasks[step], done)


def _parse_time(text: str | None, what: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise fail(f"{what} must be an ISO 8601 time such as 2027-01-31T00:00:00Z", 2) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _weight_format(source: Path) -> Literal["gguf", "safetensors"]:
    if source.is_file() and source.suffix == ".gguf":
        return "gguf"
    if source.is_dir() and any(source.glob("*.safetensors")):
        return "safetensors"
    raise fail(f"{source} is neither a .gguf file nor a directory of .safetensors files", 2)


@bundle_app.command("create")
def create(
    source: Annotated[Path, typer.Argument(help="A GGUF file or a safetensors model directory.")],
    name: Annotated[str, typer.Option(help="Model name recorded in the manifest.")],
    version: Annotated[str, typer.Option(help="Model version recorded in the manifest.")],
    recipient: Annotated[
        list[str], typer.Option(help="<provider>:<key-ref> that may unwrap the key (repeat).")
    ],
    signing_key: Annotated[Path, typer.Option(help="Ed25519 private key (PEM) to sign with.")],
    out: Annotated[
        Path | None, typer.Option(help="Bundle path (a .tar name makes one tar file).")
    ] = None,
    architecture: Annotated[str, typer.Option(help="e.g. gemma3, llama.")] = "",
    quantisation: Annotated[str, typer.Option(help="e.g. Q4_K_M, bf16.")] = "",
    chat_template: Annotated[
        str | None, typer.Option(help="Builtin template name or a Jinja file.")
    ] = None,
    context_length: Annotated[int | None, typer.Option(help="Engine hint.")] = None,
    task: Annotated[
        str | None, typer.Option(help="generate or embed (an embedding model); engine hint.")
    ] = None,
    not_before: Annotated[str | None, typer.Option(help="Not valid before (ISO 8601).")] = None,
    not_after: Annotated[str | None, typer.Option(help="Not valid after (ISO 8601).")] = None,
    valid_days: Annotated[int | None, typer.Option(help="Not valid after now + N days.")] = None,
    max_offline_days: Annotated[
        int | None, typer.Option(help="Usable for N days after sealing, offline.")
    ] = None,
    allowed_engine: Annotated[
        list[str] | None, typer.Option(help="llama.cpp or vllm (repeat; default by format).")
    ] = None,
    segment_size: Annotated[int, typer.Option(help="Payload segment size in bytes.")] = 1 << 20,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Encrypt a model under a fresh data key for the recipients and sign the manifest."""
    settings = load_cli_settings(config, data_dir)
    weight_format = _weight_format(source)
    template = chat_template
    if template is not None and Path(template).is_file():
        template = Path(template).read_text(encoding="utf-8")
    now = datetime.now(UTC)
    after = _parse_time(not_after, "--not-after")
    if valid_days is not None:
        after = now + timedelta(days=valid_days)
    if task not in (None, "generate", "embed"):
        raise fail(f"--task must be generate or embed, not {task!r}", 2)
    hints: dict[str, str | int] = {}
    if context_length:
        hints["context_length"] = context_length
    if task:
        hints["task"] = task
    engines = allowed_engine or None
    for engine in engines or ():
        if engine not in ("llama.cpp", "vllm"):
            raise fail(f"--allowed-engine must be llama.cpp or vllm, not {engine!r}", 2)
    target = out or Path(f"{name}-{version}.bundle")
    providers = KeyProviders(settings)
    with _errors():
        sources = sources_from_path(source)
        key = load_signing_key(signing_key)
        # (a .tar target adds a "pack tar" bar when packing starts)
        with _Bars({"encrypt": sum(s.size for s in sources)}) as bars:
            manifest = seal_bundle(
                sources,
                target,
                model=ModelInfo(
                    name=name,
                    version=version,
                    architecture=architecture,
                    weight_format=weight_format,
                    quantisation=quantisation,
                    chat_template=template,
                    engine_hints=hints,
                ),
                recipients=recipient,
                providers=providers,
                signing_key=key,
                now=now,
                not_before=_parse_time(not_before, "--not-before"),
                not_after=after,
                allowed_engines=engines,  # type: ignore[arg-type]
                max_offline_days=max_offline_days,
                segment_size=segment_size,
                progress=bars,
            )
    providers.close()
    stdout.print(
        f"sealed [bold]{escape(str(target))}[/]: bundle {manifest.bundle_id}, "
        f"{len(manifest.files)} file(s), "
        f"recipients {', '.join(w.provider + ':' + w.key_ref for w in manifest.key_wraps)}, "
        f"signed by {key_id(key.public_key())}",
        highlight=False,
    )


@bundle_app.command("inspect")
def inspect(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory or .tar.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Show a bundle's manifest (the signature is not checked; use `verify`)."""
    with _errors():
        info = read_manifest(bundle, None)
    m = info.manifest
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(m), indent=2, sort_keys=True))
        return
    table = Table(show_header=False, box=None)
    rows = [
        ("bundle id", m.bundle_id),
        ("manifest sha256", info.digest),
        ("signed by key", info.signer or "(no signature)"),
        ("model", f"{m.model.name} {m.model.version} ({m.model.weight_format})"),
        ("architecture", m.model.architecture or "-"),
        ("quantisation", m.model.quantisation or "-"),
        ("created", m.created),
        ("valid", f"{m.not_before or '-'} .. {m.not_after or '-'}"),
        ("engines", ", ".join(m.policy.allowed_engines)),
        ("max offline days", str(m.policy.max_offline_days or "-")),
        ("segment size", str(m.crypto.segment_size)),
    ]
    rows += [(f"file {f.path}", f"{f.plaintext_size:,} bytes") for f in m.files]
    rows += [
        ("recipient", f"{w.provider}:{w.key_ref} v{w.key_version} ({w.algorithm})")
        for w in m.key_wraps
    ]
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", escape(value))
    stdout.print(table)


@bundle_app.command("verify")
def verify(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory or .tar.")],
    trusted_key: Annotated[
        list[str] | None,
        typer.Option(help="ed25519:<base64> or a .pub file (repeat; adds to the config's)."),
    ] = None,
    decrypt: Annotated[
        bool, typer.Option(help="Also unwrap, decrypt (in memory) and check plaintext digests.")
    ] = False,
    engine: Annotated[str | None, typer.Option(help="Also check this engine may load it.")] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Check signature, validity and ciphertext digests with no key (--decrypt: all of it)."""
    settings = load_cli_settings(config, data_dir)
    with _errors():
        trusted = trusted_keys(settings)
        extra = TrustedKeys.from_texts_or_files(trusted_key or [])
        trusted = TrustedKeys([*trusted.keys(), *extra.keys()])
        if not len(trusted):
            raise fail("no trusted keys: pass --trusted-key or set [bundles] trusted_keys", 2)
        info = read_manifest(bundle, trusted)  # a bad signature fails before any bar shows
        sizes = {
            "verify ciphertext": sum(f.ciphertext_size for f in info.manifest.files),
        }
        if decrypt:
            sizes["decrypt"] = sum(f.plaintext_size for f in info.manifest.files)
        with _Bars(sizes) as bars:
            verified = verify_bundle(
                bundle, trusted, now=datetime.now(UTC), engine=engine, progress=bars
            )
            if decrypt:
                providers = KeyProviders(settings)
                try:
                    decrypt_check(verified, providers, progress=bars)
                finally:
                    providers.close()
    what = "signature, validity, ciphertext" + (" and plaintext" if decrypt else "")
    stdout.print(
        f"[green]ok[/]: {escape(str(bundle))} ({what} verified; signed by {verified.signer})",
        highlight=False,
    )


@bundle_app.command("rekey")
def rekey(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory or .tar.")],
    signing_key: Annotated[Path, typer.Option(help="Ed25519 private key to re-sign with.")],
    add: Annotated[list[str] | None, typer.Option(help="<provider>:<key-ref> to add.")] = None,
    remove: Annotated[
        list[str] | None, typer.Option(help="<provider>:<key-ref> to remove.")
    ] = None,
    rewrap: Annotated[
        bool, typer.Option(help="Re-wrap every recipient under its key's current version.")
    ] = False,
    trusted_key: Annotated[
        list[str] | None, typer.Option(help="Keys the bundle may be signed by (repeat).")
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Change recipients or rotate key versions; the encrypted payload is not touched."""
    if not (add or remove or rewrap):
        raise fail("nothing to do: give --add, --remove or --rewrap", 2)
    settings = load_cli_settings(config, data_dir)
    providers = KeyProviders(settings)
    with _errors():
        key = load_signing_key(signing_key)
        configured = trusted_keys(settings)
        extra = TrustedKeys.from_texts_or_files(trusted_key or [])
        trusted = TrustedKeys([*configured.keys(), *extra.keys(), key.public_key()])
        current = read_manifest(bundle, None).manifest
        copy = sum(f.ciphertext_size for f in current.files) if bundle.is_file() else 0
        try:
            with _Bars({"copy payload": copy} if copy else {}) as bars:
                manifest = rekey_bundle(
                    bundle,
                    trusted=trusted,
                    providers=providers,
                    signing_key=key,
                    add=add or (),
                    remove=remove or (),
                    rewrap=rewrap,
                    progress=bars,
                )
        finally:
            providers.close()
    recipients = ", ".join(f"{w.provider}:{w.key_ref} v{w.key_version}" for w in manifest.key_wraps)
    stdout.print(f"re-keyed {bundle}: recipients now {recipients}", markup=False, highlight=False)


@signing_key_app.command("create")
def signing_key_create(
    path: Annotated[Path, typer.Argument(help="Where to write the private key (0600).")],
) -> None:
    """Create an Ed25519 signing key; its public key is written beside it as PATH.pub."""
    with _errors():
        public = create_signing_key(path)
    stdout.print(
        f"created {escape(str(path))} (key id {key_id(public)}); public key in {path}.pub:",
        markup=False,
        highlight=False,
    )
    typer.echo(public_key_text(public))


@signing_key_app.command("public")
def signing_key_public(
    path: Annotated[Path, typer.Argument(help="A private signing key file.")],
) -> None:
    """Print the public key to pin in `[bundles] trusted_keys`."""
    with _errors():
        key = load_signing_key(path)
    typer.echo(public_key_text(key.public_key()))


@kms_app.command("init")
def kms_init(
    key: Annotated[str, typer.Option(help="Key name (local:<name>).")] = "default",
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create the local key file (0600) with a new key."""
    settings = load_cli_settings(config, data_dir)
    path = local_key_file(settings)
    if not init_key_file(path, key):
        raise fail(f"{path} already exists; use `airgate kms rotate` for a new version")
    stdout.print(f"created {path} with key local:{key}", markup=False, highlight=False)


@kms_app.command("rotate")
def kms_rotate(
    key: Annotated[str, typer.Option(help="Key name (<key-ref>) to add a version to.")] = "default",
    provider: Annotated[
        str, typer.Option(help="local, pkcs11 or vault-transit (as configured in [kms.*]).")
    ] = "local",
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Add a new key version; `bundle rekey --rewrap` then moves bundles onto it."""
    settings = load_cli_settings(config, data_dir)
    with _errors():
        message = rotate_provider_key(settings, provider, key)
    stdout.print(message, markup=False, highlight=False)
