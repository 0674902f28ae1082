"""Changing the imported-bundle store (`airgate bundle import | remove | renew`).

See `imported.py` for the layout and the trust model: everything here is verified against the
pinned signers, the bundle is copied (still encrypted, 0600 files in 0700 directories) under a
temporary name, verified again as copied (every ciphertext digest), then renamed into place.
A running server keeps what it loaded: changes take effect at its next start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

import msgspec

from bundles import (
    BundleError,
    BundleFormatError,
    BundlePolicyError,
    VerifiedBundle,
    VerifiedRenewal,
    check_bundle,
    offline_window,
    read_manifest,
    verify_bundle,
    verify_renewal,
)
from bundles.manifest import timestamp

from ..config import ConfigError, Settings
from .imported import (
    Entry,
    EntryFile,
    ImportedModel,
    engine_for,
    find,
    imported_root,
    pinned_keys,
    scan,
    served_names,
    stored_renewal,
    usable_until,
    valid_model_id,
    verify_entry,
)

__all__ = ["import_bundle", "remove_imported", "renew_imported", "server_holds"]

_COPY_BLOCK = 8 << 20


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def _write(path: Path, blocks: Iterable[bytes | memoryview]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        for block in blocks:
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def _blocks(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), _COPY_BLOCK):
        with view[start : start + _COPY_BLOCK] as block:
            yield block


def _copy(head: VerifiedBundle, target: Path) -> None:
    """The bundle's files (checked names only) into the directory `target`, 0600."""
    for name in sorted(head.store.names()):
        parts = name.split("/")
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise BundleFormatError(f"bundle file {name} has an unsafe path")
        for depth in range(1, len(parts)):
            _mkdir(target.joinpath(*parts[:depth]))
        with head.store.map(name) as view:
            _write(target / name, _blocks(view))


def _entries(settings: Settings, model_id: str, bundle_id: str) -> list[Entry]:
    return [e for e in scan(settings) if model_id == e.model_id or bundle_id == e.bundle_id]


def _discard(directory: Path) -> None:
    """Remove an entry: first renamed away (it vanishes at once), then deleted."""
    gone = directory.with_name(f".removed-{directory.name}-{secrets.token_hex(4)}")
    os.rename(directory, gone)
    shutil.rmtree(gone)


def import_bundle(
    settings: Settings,
    source: Path,
    *,
    now: datetime,
    model_id: str | None = None,
    replace: bool = False,
    renewal: bytes | None = None,
) -> tuple[ImportedModel, bool]:
    """Verify `source` against the pinned keys and place a copy in the data dir.

    Returns the imported model and whether it was new (False: the same bundle under the same
    id was there already).  Raises BundleError (or ConfigError for a clash) otherwise.
    """
    trusted = pinned_keys(settings)
    head = read_manifest(source, trusted)  # the signature first: nothing unsigned is copied
    manifest = head.manifest
    wanted = valid_model_id(model_id or manifest.model.name)
    if wanted in served_names(settings):
        raise ConfigError(
            f"model id {wanted!r} is already served by airgate.toml or the embedded defaults: "
            "import it under another id with --id"
        )
    offered = verify_renewal(renewal, trusted) if renewal is not None else None
    window = offline_window(manifest)
    if offered is None and window is not None and now > window[2]:
        raise BundlePolicyError(
            f"the bundle may be used offline for {window[1]} days after it was sealed "
            f"({manifest.created}); that window lapsed at {timestamp(window[2])}: import it "
            "with the renewal HQ signed for it (--renewal FILE)"
        )
    check_bundle(source, trusted, now=now, engine=engine_for(manifest), renewal=offered)
    existing = _entries(settings, wanted, manifest.bundle_id)
    for entry in existing:
        if (entry.bundle_id, entry.model_id) == (manifest.bundle_id, wanted) and not replace:
            same = False
            with contextlib.suppress(BundleError):
                same = read_manifest(entry.bundle, trusted).digest == head.digest
            if same:  # imported already: at most its renewal is new
                if offered is not None:
                    renew_imported(settings, offered.data, now=now)
                return verify_entry(entry, trusted, now), False
    if existing and not replace:
        names = ", ".join(f"{e.model_id or '?'} (bundle {e.bundle_id})" for e in existing)
        raise ConfigError(
            f"already imported: {names}; pass --replace to replace it, or --id to import "
            "this bundle under another model id"
        )
    root = imported_root(settings)
    _mkdir(root)
    work = root / f".import-{manifest.bundle_id}-{secrets.token_hex(4)}"
    _mkdir(work)
    try:
        _mkdir(work / "bundle")
        _copy(head, work / "bundle")
        copied = verify_bundle(  # what counts is the copy: every digest, now
            work / "bundle", trusted, now=now, engine=engine_for(manifest), renewal=offered
        )
        if copied.digest != head.digest:
            raise BundleFormatError("the bundle changed while it was being imported")
        meta = EntryFile(model_id=wanted, imported=timestamp(now))
        _write(work / "entry.json", [msgspec.json.encode(meta)])
        if offered is not None:
            _write(work / "renewal.json", [offered.data])
        # replaced entries go: the one in the way of the rename first, the others once the
        # new one is in place
        others = [old for old in existing if old.bundle_id != manifest.bundle_id]
        for old in existing:
            if old not in others:
                _discard(old.directory)
        os.rename(work, root / manifest.bundle_id)
        for old in others:
            _discard(old.directory)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    placed = Entry(manifest.bundle_id, wanted, root / manifest.bundle_id)
    return verify_entry(placed, trusted, now), True


def remove_imported(settings: Settings, name: str) -> Entry:
    """Delete the imported bundle whose model id or bundle id is `name`."""
    entry = find(settings, name)
    _discard(entry.directory)
    return entry


def renew_imported(
    settings: Settings, data: bytes, *, now: datetime
) -> tuple[Entry, VerifiedRenewal, datetime | None, bool]:
    """Verify a renewal from HQ and store it beside the bundle it names.

    Returns the entry, the renewal, the new end of use and whether it was stored (False: this
    very renewal was stored already).
    """
    trusted = pinned_keys(settings)
    renewal = verify_renewal(data, trusted)
    bundle_id = renewal.renewal.bundle_id
    entry = next((e for e in scan(settings) if e.bundle_id == bundle_id), None)
    if entry is None:
        raise BundlePolicyError(
            f"the renewal is for bundle {bundle_id}, which is not imported here "
            "(`airgate bundle list`)"
        )
    head = read_manifest(entry.bundle, trusted)
    renewal.check(head.manifest, head.digest, now=now)
    stored = stored_renewal(entry, trusted)
    if stored is not None and stored.data == data:
        return entry, renewal, usable_until(head.manifest, renewal), False
    if stored is not None and renewal.issued < stored.issued:
        raise BundlePolicyError(
            f"the renewal (issued {renewal.renewal.issued}) is older than the one already "
            f"stored (issued {stored.renewal.issued})"
        )
    until = usable_until(head.manifest, renewal)
    if until is not None and now >= until:
        raise BundlePolicyError(
            f"the renewal (issued {renewal.renewal.issued}) ends at "
            f"{timestamp(until)}, which has passed: ask HQ for a new one"
        )
    partial = entry.directory / f".renewal-{secrets.token_hex(4)}"
    _write(partial, [data])
    os.replace(partial, entry.renewal)
    return entry, renewal, until, True


def server_holds(settings: Settings) -> bool:
    """Whether a running `airgate serve` holds this data dir (its lock file)."""
    lock = Path(settings.data_dir) / "airgate.lock"
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False
