"""Opening a bundle: every check, in the one order that never trusts unchecked bytes.

    signature (pinned keys, before any KMS call) -> expiry and policy -> ciphertext sizes and
    digests -> unwrap the data key -> decrypt each file, final segment first, into memory that
    is not persistent disk -> plaintext digests -> hand over.

`verify_bundle` runs the keyless part (and, with `decrypt=True`, everything but the hand-over,
into a throwaway private buffer).
"""

from __future__ import annotations

import hashlib
import logging
import mmap
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from ._crypto.stream import SegmentDecrypter, plaintext_size
from ._plain import MemfdFile, PrivateTmpfsDir
from ._store import MANIFEST, SIGNATURE, BundleStore, payload_name
from .errors import (
    BundleFormatError,
    BundleIntegrityError,
    BundlePolicyError,
    KeyProviderError,
    KeyUnwrapError,
)
from .kms import KeyProvider, WrappedKey
from .manifest import (
    FileEntry,
    Manifest,
    decode_manifest,
    file_associated_data,
    key_context,
    parse_timestamp,
)
from .signing import TrustedKeys, signature_key_id, verify_manifest

__all__ = [
    "OpenedModel",
    "Progress",
    "StepHook",
    "VerifiedBundle",
    "decrypt_check",
    "open_bundle",
    "read_manifest",
    "unwrap_data_key",
    "verify_bundle",
]

Progress = Callable[[str, int, int], None]  # (step, bytes just done, step total)
StepHook = Callable[[str, Mapping[str, str]], None]  # (step, metadata) for audit

_log = logging.getLogger("airgate.bundles")
_HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class VerifiedBundle:
    """A bundle whose signature, policy and ciphertext digests passed."""

    store: BundleStore
    manifest: Manifest
    digest: str  # SHA-256 of manifest.json: names exactly this bundle
    signer: str  # key id of the trusted key that signed it


@dataclass
class OpenedModel:
    """Decrypted, verified weights in memory.  `release()` as soon as the engine has loaded."""

    manifest: Manifest
    digest: str
    signer: str
    path: str  # /proc/self/fd/N (one GGUF) or a private tmpfs directory (safetensors)
    _memfd: MemfdFile | None = field(default=None, repr=False)
    _tmpdir: PrivateTmpfsDir | None = field(default=None, repr=False)

    @property
    def fd(self) -> int | None:
        return None if self._memfd is None else self._memfd.fd

    def release(self) -> None:
        """Drop our handle: a loaded engine keeps its own mapping; the tmpfs copy is removed."""
        if self._memfd is not None:
            self._memfd.close()
            self._memfd = None
        if self._tmpdir is not None:
            self._tmpdir.remove()
            self._tmpdir = None

    def __enter__(self) -> OpenedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _step(hook: StepHook | None, bundle: VerifiedBundle, step: str, **extra: str) -> None:
    fields = {"bundle_id": bundle.manifest.bundle_id, "bundle_digest": bundle.digest, **extra}
    details = "".join(f" {k}={v}" for k, v in extra.items())
    _log.info(
        "bundle %s (manifest sha256 %s): %s%s",
        bundle.manifest.bundle_id,
        bundle.digest,
        step,
        details,
    )
    if hook is not None:
        hook(step, fields)


def _check_policy(manifest: Manifest, now: datetime, engine: str | None) -> None:
    if manifest.not_before and now < parse_timestamp(manifest.not_before):
        raise BundlePolicyError(f"the bundle is not valid before {manifest.not_before}")
    if manifest.not_after and now > parse_timestamp(manifest.not_after):
        raise BundlePolicyError(f"the bundle expired at {manifest.not_after}")
    days = manifest.policy.max_offline_days
    if days is not None and now > parse_timestamp(manifest.created) + timedelta(days=days):
        raise BundlePolicyError(
            f"the bundle may be used for {days} days after it was sealed; that time is over"
        )
    if engine is not None and engine not in manifest.policy.allowed_engines:
        raise BundlePolicyError(
            f"the bundle may not be loaded by engine {engine!r} "
            f"(allowed: {', '.join(manifest.policy.allowed_engines)})"
        )


def _check_files(store: BundleStore, manifest: Manifest) -> None:
    expected = {MANIFEST, SIGNATURE, *(payload_name(f.path) for f in manifest.files)}
    extra = store.names() - expected
    if extra:
        raise BundleIntegrityError("unexpected file", file=sorted(extra)[0])
    for entry in manifest.files:
        size = store.size(payload_name(entry.path))
        if size is None:
            raise BundleFormatError(f"payload of {entry.path} is missing from the bundle")
        if size != entry.ciphertext_size:
            raise BundleIntegrityError("ciphertext size", file=entry.path)
        if plaintext_size(size, manifest.crypto.segment_size) != entry.plaintext_size:
            raise BundleIntegrityError("plaintext size", file=entry.path)


def _digest(view: memoryview, progress: Progress | None, step: str) -> str:
    digest = hashlib.sha256()
    for start in range(0, len(view), _HASH_BLOCK):
        block = view[start : start + _HASH_BLOCK]
        digest.update(block)
        if progress is not None:
            progress(step, len(block), len(view))
    return digest.hexdigest()


def read_manifest(path: str | Path, trusted: TrustedKeys | None) -> VerifiedBundle:
    """The manifest, with its signature checked when `trusted` is given (no payload is read).

    Without `trusted` (for `bundle inspect`) the signer is reported but not vouched for.
    """
    store = BundleStore.open(path)
    manifest_bytes = store.read_small(MANIFEST)
    if manifest_bytes is None:
        raise BundleFormatError(f"{path} has no manifest.json: not a bundle")
    sig_bytes = store.read_small(SIGNATURE)
    if trusted is not None:
        signer = verify_manifest(manifest_bytes, sig_bytes, trusted)
    else:
        signer = signature_key_id(sig_bytes)
    manifest = decode_manifest(manifest_bytes)
    return VerifiedBundle(store, manifest, hashlib.sha256(manifest_bytes).hexdigest(), signer)


def verify_bundle(
    path: str | Path,
    trusted: TrustedKeys,
    *,
    now: datetime,
    engine: str | None = None,
    progress: Progress | None = None,
    on_step: StepHook | None = None,
) -> VerifiedBundle:
    """Signature, policy, sizes and ciphertext digests: everything that needs no key."""
    bundle = read_manifest(path, trusted)
    store, manifest = bundle.store, bundle.manifest
    _step(on_step, bundle, "signature verified", signer=bundle.signer)
    _check_policy(manifest, now, engine)
    _step(on_step, bundle, "policy checked")
    _check_files(store, manifest)
    for entry in manifest.files:
        with store.map(payload_name(entry.path)) as view:
            if _digest(view, progress, "verify ciphertext") != entry.ciphertext_sha256:
                raise BundleIntegrityError("ciphertext digest", file=entry.path)
    _step(on_step, bundle, "ciphertext digests verified")
    return bundle


def unwrap_data_key(
    manifest: Manifest,
    providers: Mapping[str, KeyProvider],
    allowed_providers: Collection[str] | None = None,
) -> tuple[bytearray, WrappedKey]:
    """The DEK from the first key wrap a configured, allowed provider can open."""
    context = key_context(manifest.bundle_id)
    allowed = set(providers)
    if allowed_providers is not None:
        allowed &= set(allowed_providers)
    usable = [w for w in manifest.key_wraps if w.provider in allowed]
    if not usable:
        raise BundlePolicyError(
            "no key wrap of this bundle is for a key provider configured here "
            f"(the bundle has: {', '.join(sorted({w.provider for w in manifest.key_wraps}))})"
        )
    for wrap in usable:
        if wrap.context != context:
            _log.warning("bundle %s: a key wrap carries another context", manifest.bundle_id)
            continue
        try:
            return providers[wrap.provider].unwrap(wrap, context), wrap
        except KeyProviderError:
            continue  # the provider logged why; try the next recipient
    raise KeyUnwrapError()


def _decrypt_file(
    view: memoryview,
    out: memoryview,
    entry: FileEntry,
    manifest: Manifest,
    dek: bytearray,
    progress: Progress | None,
) -> None:
    digest = hashlib.sha256()

    def absorb(segment: memoryview) -> None:
        digest.update(segment)
        if progress is not None:
            progress("decrypt", len(segment), entry.plaintext_size)

    decrypter = SegmentDecrypter(
        dek, file_associated_data(manifest.bundle_id, entry.path), manifest.crypto.segment_size
    )
    decrypter.decrypt_into(view, out, absorb)
    if digest.hexdigest() != entry.plaintext_sha256:
        raise BundleIntegrityError("plaintext digest", file=entry.path)


def open_bundle(
    path: str | Path,
    trusted: TrustedKeys,
    providers: Mapping[str, KeyProvider],
    *,
    now: datetime,
    engine: str | None = None,
    allowed_providers: Collection[str] | None = None,
    progress: Progress | None = None,
    on_step: StepHook | None = None,
    tmpfs_root: Path | None = None,
) -> OpenedModel:
    """Verify and decrypt a bundle into memory; the result is ready to hand to `engine`."""
    bundle = verify_bundle(
        path, trusted, now=now, engine=engine, progress=progress, on_step=on_step
    )
    manifest = bundle.manifest
    dek, wrap = unwrap_data_key(manifest, providers, allowed_providers)
    try:
        _step(on_step, bundle, "data key unwrapped", provider=f"{wrap.provider}:{wrap.key_ref}")
        opened = _decrypt_all(bundle, dek, progress, tmpfs_root)
    finally:
        dek[:] = bytes(len(dek))
    _step(
        on_step,
        bundle,
        "decrypted and verified",
        into="memfd" if opened.fd is not None else "tmpfs",
    )
    return opened


def _decrypt_all(
    bundle: VerifiedBundle, dek: bytearray, progress: Progress | None, tmpfs_root: Path | None
) -> OpenedModel:
    manifest, store = bundle.manifest, bundle.store
    if manifest.model.weight_format == "gguf":
        if len(manifest.files) != 1:
            raise BundleFormatError("a GGUF bundle holds exactly one file")
        entry = manifest.files[0]
        memfd = MemfdFile(f"airgate:{manifest.model.name}", entry.plaintext_size)
        try:
            with store.map(payload_name(entry.path)) as view:
                _decrypt_file(view, memfd.map.view, entry, manifest, dek, progress)
            memfd.seal()
        except BaseException:
            memfd.abandon()
            raise
        return OpenedModel(manifest, bundle.digest, bundle.signer, memfd.path, _memfd=memfd)
    tmpdir = PrivateTmpfsDir(tmpfs_root)
    try:
        for entry in manifest.files:
            out = tmpdir.create(entry.path, entry.plaintext_size)
            with store.map(payload_name(entry.path)) as view:
                _decrypt_file(view, out.view, entry, manifest, dek, progress)
        tmpdir.finish()
    except BaseException:
        tmpdir.abandon()
        raise
    return OpenedModel(manifest, bundle.digest, bundle.signer, str(tmpdir.path), _tmpdir=tmpdir)


def decrypt_check(
    bundle: VerifiedBundle,
    providers: Mapping[str, KeyProvider],
    *,
    progress: Progress | None = None,
) -> None:
    """Full check for `bundle verify --decrypt`: decrypt into private anonymous memory.

    The pages are unmapped right after each file; the kernel zeroes them before reuse.
    """
    dek, _ = unwrap_data_key(bundle.manifest, providers)
    try:
        for entry in bundle.manifest.files:
            buffer = mmap.mmap(-1, max(entry.plaintext_size, 1))
            view = memoryview(buffer)[: entry.plaintext_size]
            try:
                with bundle.store.map(payload_name(entry.path)) as cipher:
                    _decrypt_file(cipher, view, entry, bundle.manifest, dek, progress)
            finally:
                view.release()
                buffer.close()
    finally:
        dek[:] = bytes(len(dek))
