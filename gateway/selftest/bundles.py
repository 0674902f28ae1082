"""The bundles check: every bundle `serve` would load verifies, without loading it.

Configured bundles (or the embedded defaults when no model is configured) are checked against
the keys `serve` trusts for them (`[bundles] trusted_keys` and the data directory's own
signing key); imported bundles against the pinned keys only, with their stored renewal and
offline window, as `serve` does at start.  Each is checked by `bundles.verify_bundle`: the
signature, validity and policy, the files and sizes, and the SHA-256 of every encrypted file.
The data key is not unwrapped and nothing is decrypted (that needs the KMS, and puts weights in
memory): the plaintext digests are checked when `serve` loads the bundle.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bundles import BundleError, BundleIntegrityError, TrustedKeys, verify_bundle
from bundles.manifest import timestamp

from ..config import ModelSettings, Settings
from ..engines.imported import pinned_keys, scan, verify_entry
from ..engines.sources import DEFAULT_EMBEDDING_MODEL_ID, DEFAULT_MODEL_ID, trusted_keys
from .result import Finding, failed, passed, skipped

__all__ = ["check_bundles", "configured_bundles"]


def configured_bundles(settings: Settings) -> list[tuple[ModelSettings, Path]]:
    """(model, bundle) for each configured bundle; with no model configured, the default
    bundles the data directory holds (the first start seals them)."""
    if settings.models:
        return [(m, Path(m.bundle)) for m in settings.models if m.bundle]
    found = []
    for model_id in (DEFAULT_MODEL_ID, DEFAULT_EMBEDDING_MODEL_ID):
        path = Path(settings.data_dir) / "bundles" / f"{model_id}.bundle"
        if path.exists():
            found.append((ModelSettings(id=model_id, bundle=str(path)), path))
    return found


def _why(exc: BundleError) -> str:
    if isinstance(exc, BundleIntegrityError):  # its text is generic on purpose; say which check
        return f"{exc} (the {exc.reason} check failed{f' on {exc.file}' if exc.file else ''})"
    return str(exc)


def _configured(settings: Settings, now: datetime) -> tuple[list[str], list[str]]:
    problems, notes = [], []
    try:
        trusted = trusted_keys(settings)
    except BundleError as exc:
        return [f"[bundles] trusted_keys cannot be read: {exc}"], []
    for model, path in configured_bundles(settings):
        engine = None if model.engine == "echo" else model.engine
        try:
            verified = verify_bundle(path, trusted, now=now, engine=engine)
        except (BundleError, OSError) as exc:
            why = _why(exc) if isinstance(exc, BundleError) else type(exc).__name__
            problems.append(f"model {model.deployment!r} bundle {path}: {why}")
            continue
        notes.append(f"{model.deployment} (signed by {verified.signer})")
    return problems, notes


def _imported(settings: Settings, now: datetime) -> tuple[list[str], list[str]]:
    entries = scan(settings)
    if not entries:
        return [], []
    try:
        trusted: TrustedKeys = pinned_keys(settings)
    except BundleError as exc:
        return [f"imported bundles cannot be checked: {exc}"], []
    problems, notes = [], []
    for entry in entries:
        what = f"imported model {entry.model_id or '?'!r} (bundle {entry.bundle_id})"
        try:
            imported = verify_entry(entry, trusted, now)
            verify_bundle(entry.bundle, trusted, now=now, renewal=imported.renewal)
        except (BundleError, OSError) as exc:
            why = _why(exc) if isinstance(exc, BundleError) else type(exc).__name__
            problems.append(f"{what}: {why}")
            continue
        until = f", usable until {timestamp(imported.until)}" if imported.until else ""
        notes.append(f"{entry.model_id} (imported, signed by {imported.verified.signer}{until})")
    return problems, notes


def check_bundles(settings: Settings) -> Finding:
    """Every bundle verifies (see the module); each failure names the model and the check."""
    now = datetime.now(UTC)
    problems, notes = _configured(settings, now)
    more_problems, more_notes = _imported(settings, now)
    problems += more_problems
    notes += more_notes
    if problems:
        return failed("; ".join(problems))
    if not notes:
        if settings.models:
            return skipped("no model is served from a bundle")
        return failed(
            "the default model is not sealed yet: start `airgate serve` once (the first start "
            "seals it into a bundle), then run the selftest again"
        )
    return passed(
        "signatures, validity and encrypted-file digests verified (plaintext digests are "
        "checked at load): " + ", ".join(notes)
    )
