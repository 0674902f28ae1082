"""Opening a bundle: every check, in the one order that never trusts unchecked bytes.

    signature (pinned keys, before any KMS call) -> expiry and policy -> ciphertext sizes and
    digests -> unwrap the data key -> decrypt each file, final segment first, into memory that
    is not persistent disk -> plaintext digests -> hand over.

`verify_bundle` runs the keyless part (and, with `decrypt=True`, everything but the hand-over,
into a throwaway private buffer).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ._crypto.stream import SegmentDecrypter, plaintext_size, wipe
from ._plain import PlainTarget, WritableMap
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
    timestamp,
)
from .renewal import Renewal, VerifiedRenewal, offline_window
from .signing import TrustedKeys, signature_key_id, verify_manifest

__all__ = [
    "OpenedModel",
    "Progress",
    "StepHook",
    "VerifiedBundle",
    "check_bundle",
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
    _target: PlainTarget | None = field(default=None, repr=False)

    @property
    def fd(self) -> int | None:
        memfd = self._target.memfd if self._target is not None else None
        return None if memfd is None else memfd.fd

    def release(self) -> None:
        """Drop our handle: a loaded engine keeps its own mapping; the tmpfs copy is removed."""
        if self._target is not None:
            if self._target.memfd is not None:
                self._target.memfd.close()
            if self._target.tmpdir is not None:
                self._target.tmpdir.remove()
            self._target = None

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


def _check_policy(
    manifest: Manifest, now: datetime, engine: str | None, renewal: Renewal | None = None
) -> None:
    """Validity, the offline window (restarted by a verified `renewal`) and the engine."""
    if manifest.not_before and now < parse_timestamp(manifest.not_before):
        raise BundlePolicyError(f"the bundle is not valid before {manifest.not_before}")
    if manifest.not_after and now > parse_timestamp(manifest.not_after):
        raise BundlePolicyError(f"the bundle expired at {manifest.not_after}")
    window = offline_window(manifest, renewal)
    if window is not None and now > window[2]:
        start, days, end = window
        since = "renewed" if renewal is not None else "sealed"
        raise BundlePolicyError(
            f"the bundle may be used offline for {days} days after it was {since} "
            f"({timestamp(start)}); that window lapsed at {timestamp(end)}: a renewal signed "
            "at HQ is needed (`airgate bundle renew FILE`)"
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
        with view[start : start + _HASH_BLOCK] as block:  # released at once: see BundleStore.map
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


def check_bundle(
    path: str | Path,
    trusted: TrustedKeys,
    *,
    now: datetime,
    engine: str | None = None,
    on_step: StepHook | None = None,
    renewal: VerifiedRenewal | None = None,
) -> VerifiedBundle:
    """The cheap checks: signature, validity and policy, files and sizes (no payload read).

    A server runs these at start-up, so a bundle that cannot be served stops it at once.
    `renewal` (verified against pinned keys) restarts the offline window; it must name this
    bundle (id and manifest digest) and not be issued in the future.
    """
    bundle = read_manifest(path, trusted)
    _step(on_step, bundle, "signature verified", signer=bundle.signer)
    if renewal is not None:
        renewal.check(bundle.manifest, bundle.digest, now=now)
    _check_policy(bundle.manifest, now, engine, renewal.renewal if renewal else None)
    _step(on_step, bundle, "policy checked")
    _check_files(bundle.store, bundle.manifest)
    return bundle


def _verify_ciphertext(
    bundle: VerifiedBundle, progress: Progress | None, on_step: StepHook | None
) -> None:
    for entry in bundle.manifest.files:
        with bundle.store.map(payload_name(entry.path)) as view:
            if _digest(view, progress, "verify ciphertext") != entry.ciphertext_sha256:
                raise BundleIntegrityError("ciphertext digest", file=entry.path)
    _step(on_step, bundle, "ciphertext digests verified")


def verify_bundle(
    path: str | Path,
    trusted: TrustedKeys,
    *,
    now: datetime,
    engine: str | None = None,
    progress: Progress | None = None,
    on_step: StepHook | None = None,
    renewal: VerifiedRenewal | None = None,
) -> VerifiedBundle:
    """Signature, policy, sizes and ciphertext digests: everything that needs no key."""
    bundle = check_bundle(path, trusted, now=now, engine=engine, on_step=on_step, renewal=renewal)
    _verify_ciphertext(bundle, progress, on_step)
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


class _Hasher:
    """SHA-256 of plaintext segments on a second thread, behind the decryption.

    hashlib releases the GIL on large buffers, so digesting overlaps decrypting the next
    segment; segments arrive in file order (see `SegmentDecrypter.decrypt_into`).
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="airgate-digest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (segment := self._queue.get()) is not None:
            self._digest.update(segment)

    def add(self, segment: memoryview) -> None:
        self._queue.put(segment)

    def hexdigest(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self._digest.hexdigest()


def _decrypt_file(
    view: memoryview,
    out: WritableMap,
    entry: FileEntry,
    manifest: Manifest,
    dek: bytearray,
    progress: Progress | None,
) -> None:
    hasher = _Hasher()

    def absorb(segment: memoryview) -> None:
        hasher.add(segment)
        if progress is not None:
            progress("decrypt", len(segment), entry.plaintext_size)

    decrypter = SegmentDecrypter(
        dek, file_associated_data(manifest.bundle_id, entry.path), manifest.crypto.segment_size
    )
    try:
        decrypter.decrypt_into(view, out.view, absorb, out.wait_ready)
    finally:
        digest = hasher.hexdigest()  # always joins the thread, also on failure
    if digest != entry.plaintext_sha256:
        wipe(out.view)
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
    renewal: VerifiedRenewal | None = None,
) -> OpenedModel:
    """Verify and decrypt a bundle into memory; the result is ready to hand to `engine`.

    `tmpfs_root` (tests) replaces the tmpfs search for multi-file models; `renewal` as for
    `check_bundle`.
    """
    bundle = check_bundle(path, trusted, now=now, engine=engine, on_step=on_step, renewal=renewal)
    manifest = bundle.manifest
    if manifest.model.weight_format == "gguf" and len(manifest.files) != 1:
        raise BundleFormatError("a GGUF bundle holds exactly one file")
    target = PlainTarget(
        f"airgate:{manifest.model.name}",
        [(f.path, f.plaintext_size) for f in manifest.files],
        single_file=manifest.model.weight_format == "gguf",
        tmpfs_root=tmpfs_root,
    )
    # Allocating the plaintext memory costs as much as a digest: a worker thread does it while
    # the ciphertext is checked; nothing is decrypted into it before the data key is unwrapped.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="airgate-alloc") as pool:
        populating = pool.submit(target.populate)
        try:
            _verify_ciphertext(bundle, progress, on_step)
            dek, wrap = unwrap_data_key(manifest, providers, allowed_providers)
            try:
                via = f"{wrap.provider}:{wrap.key_ref}"
                _step(on_step, bundle, "data key unwrapped", provider=via)
                for entry in manifest.files:
                    with bundle.store.map(payload_name(entry.path)) as view:
                        _decrypt_file(view, target.maps[entry.path], entry, manifest, dek, progress)
                populating.result()
                target.complete()
            finally:
                dek[:] = bytes(len(dek))
        except BaseException:
            target.cancel()
            with contextlib.suppress(Exception):
                populating.result()
            target.abandon()
            raise
    opened = OpenedModel(manifest, bundle.digest, bundle.signer, target.path, _target=target)
    into = "memfd" if opened.fd is not None else "tmpfs"
    _step(on_step, bundle, "decrypted and verified", into=into)
    return opened


def decrypt_check(
    bundle: VerifiedBundle,
    providers: Mapping[str, KeyProvider],
    *,
    progress: Progress | None = None,
) -> None:
    """Full check for `bundle verify --decrypt`: decrypt into a scratch memfd, then wipe it."""
    dek, _ = unwrap_data_key(bundle.manifest, providers)
    try:
        for entry in bundle.manifest.files:
            scratch = PlainTarget(
                "airgate:verify", [(entry.path, entry.plaintext_size)], single_file=True
            )
            try:
                with bundle.store.map(payload_name(entry.path)) as cipher:
                    out = scratch.maps[entry.path]
                    _decrypt_file(cipher, out, entry, bundle.manifest, dek, progress)
            finally:
                scratch.abandon()
    finally:
        dek[:] = bytes(len(dek))
