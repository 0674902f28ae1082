"""Imported bundles: weights a laptop received from HQ, kept in the data dir and served as is.

    <data_dir>/bundles/imported/<bundle id>/      0700
        bundle/                                   the bundle, still encrypted (0600 files)
        entry.json                                {"model_id", "imported"}
        renewal.json                              the latest renewal from HQ, when there is one

Trust never comes from the data dir: an attacker may write it.  Every bundle and renewal is
verified against the signers pinned in configuration (`[bundles] trusted_keys`) only, never the
data dir's own signing key (which seals the embedded defaults, and which such an attacker could
use): at import, at renewal, and again at every start.  Entries are written under a temporary
name and renamed into place (`import_store.py`), so a crash never leaves half an entry.  A
running server keeps what it loaded at start: an import, renewal or removal takes effect at the
next start.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from bundles import (
    BundleError,
    BundleFormatError,
    BundleIntegrityError,
    BundlePolicyError,
    BundleSignatureError,
    Manifest,
    TrustedKeys,
    VerifiedBundle,
    VerifiedRenewal,
    check_bundle,
    key_id,
    offline_window,
    parse_public_key,
    read_manifest,
    verify_renewal,
)
from bundles.manifest import parse_timestamp, timestamp

from ..config import ConfigError, ModelSettings, Settings
from .registry import ServedModel
from .sources import (
    DEFAULT_EMBEDDING_ALIASES,
    DEFAULT_EMBEDDING_MODEL_ID,
    DEFAULT_MODEL_ID,
    BundleSource,
    signing_key_file,
)

__all__ = [
    "Entry",
    "EntryFile",
    "ImportedModel",
    "ImportedSource",
    "describe",
    "engine_for",
    "find",
    "imported_root",
    "lapsed_at",
    "load_imported",
    "pinned_keys",
    "scan",
    "served_names",
    "stored_renewal",
    "usable_until",
    "valid_model_id",
    "verify_entry",
]

_log = logging.getLogger("airgate.model")
_BUNDLE_ID = re.compile(r"^[0-9a-f]{32}$")
_BY_FORMAT: dict[str, Literal["llama.cpp", "vllm"]] = {"gguf": "llama.cpp", "safetensors": "vllm"}


class EntryFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_id: str
    imported: str


@dataclass(frozen=True)
class Entry:
    """One imported bundle as the data dir holds it (nothing here is verified)."""

    bundle_id: str
    model_id: str
    directory: Path

    @property
    def bundle(self) -> Path:
        return self.directory / "bundle"

    @property
    def renewal(self) -> Path:
        return self.directory / "renewal.json"


@dataclass(frozen=True)
class ImportedModel:
    """An imported bundle, verified against the pinned keys now (with its stored renewal)."""

    entry: Entry
    verified: VerifiedBundle
    renewal: VerifiedRenewal | None
    engine: Literal["llama.cpp", "vllm"]
    until: datetime | None  # the end of its offline window or validity, whichever is first


def imported_root(settings: Settings) -> Path:
    return Path(settings.data_dir) / "bundles" / "imported"


def pinned_keys(settings: Settings) -> TrustedKeys:
    """The signers configuration pins (`[bundles] trusted_keys`); never the data dir's key.

    A key file inside the data dir is refused (whoever writes the data dir could replace it),
    and the data dir's own signing key is left out even when pinned (its private half lies
    in the data dir).
    """
    data_dir = Path(settings.data_dir).resolve()
    for entry in settings.bundles.trusted_keys:
        if not entry.startswith("ed25519:") and data_dir in Path(entry).resolve().parents:
            raise BundleSignatureError(
                f"[bundles] trusted_keys names {entry}, inside the data dir, where anyone who "
                "can write the data dir could replace it: keep pinned keys outside it"
            )
    trusted = TrustedKeys.from_texts_or_files(settings.bundles.trusted_keys)
    own = signing_key_file(settings).with_name("signing.key.pub")
    with contextlib.suppress(OSError, BundleError):
        own_id = key_id(parse_public_key(own.read_text()))
        if trusted.get(own_id) is not None:
            _log.warning(
                "[bundles] trusted_keys pins the data dir's own signing key %s: it is not "
                "trusted for imported bundles",
                own_id,
            )
            pinned = trusted.keys()
            trusted = TrustedKeys(k for k in pinned if key_id(k) != own_id)
    if not len(trusted):
        raise BundleSignatureError(
            "no bundle signer is pinned: add HQ's bundle-signing public key to [bundles] "
            "trusted_keys in airgate.toml (the data dir's own signing key is never trusted "
            "for imported bundles)"
        )
    return trusted


def engine_for(manifest: Manifest) -> Literal["llama.cpp", "vllm"]:
    """llama.cpp for GGUF, vLLM for safetensors, if the bundle's policy allows it."""
    engine = _BY_FORMAT[manifest.model.weight_format]
    if engine not in manifest.policy.allowed_engines:
        raise BundlePolicyError(
            f"the bundle holds {manifest.model.weight_format} weights, which only {engine} "
            f"serves, but allows only {', '.join(manifest.policy.allowed_engines)}"
        )
    return engine


def usable_until(manifest: Manifest, renewal: VerifiedRenewal | None) -> datetime | None:
    """When the bundle stops being usable: its offline window's end or `not_after`."""
    ends = []
    if manifest.not_after:
        ends.append(parse_timestamp(manifest.not_after))
    window = offline_window(manifest, renewal.renewal if renewal else None)
    if window is not None:
        ends.append(window[2])
    return min(ends, default=None)


def valid_model_id(text: str) -> str:
    """`text` if it is a valid `[[models]] id` (the same rule), else BundleFormatError."""
    try:
        return msgspec.convert({"id": text}, ModelSettings).id
    except msgspec.ValidationError:
        raise BundleFormatError(
            f"{text!r} is not a valid model id (letters, digits and . _ : / -, starting with a "
            "letter or digit, at most 128): choose one with --id"
        ) from None


def scan(settings: Settings) -> list[Entry]:
    """The imported entries on disk, by bundle id (unverified; unreadable ones included with
    model id "")."""
    root = imported_root(settings)
    if not root.is_dir():
        return []
    entries = []
    for directory in sorted(root.iterdir()):
        if not _BUNDLE_ID.match(directory.name) or not directory.is_dir():
            continue  # temporary names start with "."
        try:
            meta = msgspec.json.decode((directory / "entry.json").read_bytes(), type=EntryFile)
            model_id = meta.model_id
        except (OSError, msgspec.DecodeError):
            model_id = ""
        entries.append(Entry(directory.name, model_id, directory))
    return entries


def stored_renewal(entry: Entry, trusted: TrustedKeys) -> VerifiedRenewal | None:
    """The stored renewal if a pinned key signed it; a bad one is ignored with a warning."""
    try:
        data = entry.renewal.read_bytes()
    except FileNotFoundError:
        return None
    try:
        renewal = verify_renewal(data, trusted)
    except BundleError as exc:
        _log.warning("bundle %s: the stored renewal is ignored: %s", entry.bundle_id, exc)
        return None
    if renewal.renewal.bundle_id != entry.bundle_id:
        _log.warning("bundle %s: the stored renewal is for another bundle", entry.bundle_id)
        return None
    return renewal


def verify_entry(entry: Entry, trusted: TrustedKeys, now: datetime) -> ImportedModel:
    """Signature (pinned keys), validity, offline window, engine, files and sizes of an entry."""
    if not entry.model_id:
        raise BundleFormatError("its entry.json is missing or unreadable; import it again")
    valid_model_id(entry.model_id)
    renewal = stored_renewal(entry, trusted)
    if renewal is not None:
        head = read_manifest(entry.bundle, trusted)
        try:
            renewal.check(head.manifest, head.digest, now=now)
        except BundlePolicyError as exc:
            _log.warning("bundle %s: the stored renewal is ignored: %s", entry.bundle_id, exc)
            renewal = None
    verified = check_bundle(entry.bundle, trusted, now=now, renewal=renewal)
    if verified.manifest.bundle_id != entry.bundle_id:
        raise BundleFormatError("the bundle in it is not the bundle its directory names")
    engine = engine_for(verified.manifest)
    until = usable_until(verified.manifest, renewal)
    return ImportedModel(entry, verified, renewal, engine, until)


class ImportedSource(BundleSource):
    """A `BundleSource` for an imported bundle: pinned keys only, its renewal, its end."""

    def __init__(
        self, imported: ImportedModel, *, trusted: TrustedKeys, providers: Any, settings: Settings
    ) -> None:
        super().__init__(
            imported.entry.bundle,
            trusted=trusted,
            providers=providers,
            engine=imported.engine,
            allowed_providers=settings.bundles.allowed_providers,
        )
        self.renewal = imported.renewal
        self.usable_until = imported.until


def lapsed_at(model: ServedModel, now: datetime) -> datetime | None:
    """When the model stopped being usable, if every deployment is an imported bundle past
    its end (a cheap check before each request: a long-running server stops serving it)."""
    ends = []
    for deployment in model.deployments:
        source = deployment.source
        if not isinstance(source, ImportedSource) or source.usable_until is None:
            return None
        ends.append(source.usable_until)
    latest = max(ends)
    return latest if now >= latest else None


def served_names(settings: Settings) -> set[str]:
    """Model ids, aliases and deployment names configuration serves (or the defaults do)."""
    if not settings.models:
        return {DEFAULT_MODEL_ID, DEFAULT_EMBEDDING_MODEL_ID, *DEFAULT_EMBEDDING_ALIASES}
    return {name for m in settings.models for name in (m.id, m.deployment, *m.aliases)}


def load_imported(
    settings: Settings, providers: Any, taken: Iterable[str], now: datetime
) -> list[tuple[ModelSettings, ImportedSource, Manifest]]:
    """Every imported bundle, verified now, as a model to serve with its source; raises
    (naming the model) when one cannot be served, and ConfigError when its id is one of
    `taken` (served already by configuration or the defaults)."""
    entries = scan(settings)
    if not entries:
        return []
    trusted = pinned_keys(settings)
    names = set(taken)
    loaded = []
    for entry in entries:
        what = f"imported model {entry.model_id or '?'!r} (bundle {entry.bundle_id})"
        try:
            imported = verify_entry(entry, trusted, now)
        except BundleIntegrityError as exc:
            _log.error("%s failed the %s check (%s)", what, exc.reason, exc.file)
            raise BundleError(f"{what}: {exc}") from None
        except BundleError as exc:
            raise BundleError(f"{what}: {exc}") from None
        if entry.model_id in names:
            raise ConfigError(
                f"{what}: the id is already served (by airgate.toml, the embedded defaults or "
                f"another import); `airgate bundle remove {entry.model_id}` and import it again "
                "with --id"
            )
        names.add(entry.model_id)
        model = ModelSettings(id=entry.model_id, bundle=str(entry.bundle), engine=imported.engine)
        source = ImportedSource(imported, trusted=trusted, providers=providers, settings=settings)
        _log.info(
            "model %s: imported bundle %s (digest %s, signed by %s), usable until %s",
            entry.model_id,
            entry.bundle_id,
            imported.verified.digest,
            imported.verified.signer,
            timestamp(imported.until) if imported.until else "-",
        )
        loaded.append((model, source, imported.verified.manifest))
    return loaded


def find(settings: Settings, name: str) -> Entry:
    """The entry whose model id or bundle id is `name`."""
    for entry in scan(settings):
        if name in (entry.model_id, entry.bundle_id):
            return entry
    raise BundleFormatError(f"no imported bundle has the model id or bundle id {name!r}")


def describe(settings: Settings, now: datetime) -> Sequence[tuple[Entry, ImportedModel | str]]:
    """Each entry with its verification now, or why it failed (for `bundle list`)."""
    try:
        trusted = pinned_keys(settings)
    except BundleError as exc:
        return [(e, str(exc)) for e in scan(settings)]
    listed: list[tuple[Entry, ImportedModel | str]] = []
    for entry in scan(settings):
        try:
            listed.append((entry, verify_entry(entry, trusted, now)))
        except BundleError as exc:
            listed.append((entry, str(exc)))
    return listed
