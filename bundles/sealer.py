"""Sealing model files into a bundle, and re-keying a bundle without touching its payload."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ._crypto.stream import SegmentEncrypter, ciphertext_size
from ._store import MANIFEST, SIGNATURE, BundleStore, payload_name, write_tar
from .errors import BundleError, BundleFormatError, KeyProviderError
from .kms import KeyProvider, WrappedKey, parse_recipient
from .loader import Progress, unwrap_data_key
from .manifest import (
    BundlePolicy,
    CryptoParams,
    FileEntry,
    Manifest,
    ModelInfo,
    decode_manifest,
    encode_manifest,
    file_associated_data,
    key_context,
    timestamp,
)
from .signing import TrustedKeys, sign_manifest, verify_manifest

__all__ = ["DEFAULT_SEGMENT_SIZE", "SourceFile", "rekey_bundle", "seal_bundle", "sources_from_path"]

DEFAULT_SEGMENT_SIZE = 1 << 20
Engine = Literal["llama.cpp", "vllm"]


@dataclass(frozen=True)
class SourceFile:
    """One plaintext model file to seal: its path inside the model, size and a way to read it."""

    path: str
    size: int
    open: Callable[[], BinaryIO]  # a binary file object with readinto()


def sources_from_path(path: Path) -> list[SourceFile]:
    """A model file, or every regular file under a model directory.

    Hidden files and directories are left out; symlinks are refused (seal what is there).
    """
    if path.is_file():
        files = [(path, path.name)]
    elif path.is_dir():
        files = []
        for file in sorted(path.rglob("*")):
            if any(part.startswith(".") for part in file.relative_to(path).parts):
                continue  # .git, .cache, .gitattributes: never model weights
            if file.is_symlink():
                raise BundleFormatError(f"{file} is a symlink; seal real files only")
            if file.is_file():
                files.append((file, file.relative_to(path).as_posix()))
        if not files:
            raise BundleFormatError(f"{path} holds no files")
    else:
        raise BundleFormatError(f"{path} is neither a file nor a directory")
    return [SourceFile(name, file.stat().st_size, _opener(file)) for file, name in files]


def _opener(file: Path) -> Callable[[], BinaryIO]:
    return lambda: file.open("rb")


def _encrypt_file(
    source: SourceFile,
    target: Path,
    dek: bytearray,
    bundle_id: str,
    segment_size: int,
    progress: Progress | None,
) -> FileEntry:
    encrypter = SegmentEncrypter(dek, file_associated_data(bundle_id, source.path), segment_size)
    plain_digest, cipher_digest = hashlib.sha256(), hashlib.sha256()
    buffer = bytearray(segment_size)
    remaining, index = source.size, 0
    with source.open() as reader, target.open("xb") as writer:
        writer.write(encrypter.header)
        cipher_digest.update(encrypter.header)
        while True:
            want = min(encrypter.plaintext_chunk(index), remaining)
            chunk = memoryview(buffer)[:want]
            got = reader.readinto(chunk) if want else 0  # type: ignore[attr-defined]
            if got != want:
                raise BundleError(f"{source.path} changed size while it was being sealed")
            remaining -= want
            last = remaining == 0
            sealed = encrypter.encrypt_segment(chunk, last=last)
            plain_digest.update(chunk)
            cipher_digest.update(sealed)
            writer.write(sealed)
            if progress is not None:
                progress("encrypt", want, source.size)
            index += 1
            if last:
                break
        if reader.read(1):
            raise BundleError(f"{source.path} grew while it was being sealed")
        writer.flush()
        os.fsync(writer.fileno())
    buffer[:] = bytes(len(buffer))
    return FileEntry(
        path=source.path,
        plaintext_size=source.size,
        ciphertext_size=ciphertext_size(source.size, segment_size),
        plaintext_sha256=plain_digest.hexdigest(),
        ciphertext_sha256=cipher_digest.hexdigest(),
    )


def _wrap_for(
    recipients: Sequence[str], providers: Mapping[str, KeyProvider], context: dict[str, str]
) -> tuple[bytearray, list[WrappedKey]]:
    if not recipients:
        raise BundleError("a bundle needs at least one recipient (<provider>:<key-ref>)")
    parsed = [parse_recipient(r) for r in recipients]
    for provider, _ in parsed:
        if provider not in providers:
            raise KeyProviderError(f"key provider {provider!r} is not configured")
    (first, ref), *rest = parsed
    dek, wrap = providers[first].generate_data_key(ref, context)
    wraps = [wrap]
    try:
        wraps += [providers[p].wrap(r, dek, context) for p, r in rest]
    except BaseException:
        dek[:] = bytes(len(dek))
        raise
    return dek, wraps


def seal_bundle(
    sources: Sequence[SourceFile],
    out: Path,
    *,
    model: ModelInfo,
    recipients: Sequence[str],
    providers: Mapping[str, KeyProvider],
    signing_key: Ed25519PrivateKey,
    now: datetime,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    allowed_engines: Sequence[Engine] | None = None,
    max_offline_days: int | None = None,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
    progress: Progress | None = None,
) -> Manifest:
    """Encrypt `sources` into a new bundle at `out` (a directory, or one tar if it ends .tar).

    Written beside `out` and renamed into place: a crash never leaves half a bundle at `out`.
    """
    if out.exists():
        raise BundleError(f"{out} already exists")
    if model.weight_format == "gguf" and len(sources) != 1:
        raise BundleFormatError("a GGUF model is one file")
    bundle_id = secrets.token_hex(16)
    context = key_context(bundle_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    dek, wraps = _wrap_for(recipients, providers, context)
    try:
        files = []
        for source in sources:
            target = work / payload_name(source.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            files.append(_encrypt_file(source, target, dek, bundle_id, segment_size, progress))
        engines: list[Engine] = list(allowed_engines or _default_engines(model))
        manifest = Manifest(
            bundle_id=bundle_id,
            created=timestamp(now),
            not_before=timestamp(not_before) if not_before else None,
            not_after=timestamp(not_after) if not_after else None,
            model=model,
            crypto=CryptoParams(segment_size=segment_size),
            files=files,
            key_wraps=wraps,
            policy=BundlePolicy(allowed_engines=engines, max_offline_days=max_offline_days),
        )
        decode_manifest(encode_manifest(manifest))  # what a loader will accept, or raise now
        _write_signed(work, manifest, signing_key)
        if out.suffix == ".tar":
            partial = out.with_name(f".{out.name}.{secrets.token_hex(4)}")
            write_tar(work, partial, progress)
            os.replace(partial, out)
        else:
            os.chmod(work, 0o755)
            os.rename(work, out)
        return manifest
    finally:
        dek[:] = bytes(len(dek))
        shutil.rmtree(work, ignore_errors=True)


def _default_engines(model: ModelInfo) -> list[Engine]:
    return ["llama.cpp"] if model.weight_format == "gguf" else ["vllm"]


def _write_signed(directory: Path, manifest: Manifest, signing_key: Ed25519PrivateKey) -> None:
    data = encode_manifest(manifest)
    for name, content in ((MANIFEST, data), (SIGNATURE, sign_manifest(data, signing_key))):
        tmp = directory / f".{name}.{secrets.token_hex(4)}"
        tmp.write_bytes(content)
        os.replace(tmp, directory / name)


def rekey_bundle(
    path: Path,
    *,
    trusted: TrustedKeys,
    providers: Mapping[str, KeyProvider],
    signing_key: Ed25519PrivateKey,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
    rewrap: bool = False,
    progress: Progress | None = None,
) -> Manifest:
    """Change who can unwrap the data key; the payload files are not read or rewritten.

    `add` wraps the DEK for new recipients (the DEK is unwrapped through a configured provider),
    `remove` drops recipients, `rewrap` moves every wrap to its key's current version (the
    provider re-wraps without the DEK leaving it where it can).  The manifest is re-signed.
    """
    store = BundleStore.open(path)
    manifest_bytes = store.read_small(MANIFEST)
    if manifest_bytes is None:
        raise BundleFormatError(f"{path} has no manifest.json: not a bundle")
    verify_manifest(manifest_bytes, store.read_small(SIGNATURE), trusted)
    manifest = decode_manifest(manifest_bytes)
    context = key_context(manifest.bundle_id)
    wraps = list(manifest.key_wraps)
    for recipient in remove:
        provider, ref = parse_recipient(recipient)
        kept = [w for w in wraps if (w.provider, w.key_ref) != (provider, ref)]
        if len(kept) == len(wraps):
            raise BundleError(f"the bundle has no recipient {recipient}")
        wraps = kept
    if rewrap:
        wraps = [_rewrap(w, providers, context) for w in wraps]
    if add:
        dek, _ = unwrap_data_key(manifest, providers)
        try:
            for recipient in add:
                provider, ref = parse_recipient(recipient)
                if any((w.provider, w.key_ref) == (provider, ref) for w in wraps):
                    raise BundleError(f"the bundle already has recipient {recipient}")
                if provider not in providers:
                    raise KeyProviderError(f"key provider {provider!r} is not configured")
                wraps.append(providers[provider].wrap(ref, dek, context))
        finally:
            dek[:] = bytes(len(dek))
    if not wraps:
        raise BundleError("refusing to remove the last recipient: nobody could open the bundle")
    updated = msgspec.structs.replace(manifest, key_wraps=wraps)
    if store.is_tar:
        _rewrite_tar(store, updated, signing_key, progress)
    else:
        _write_signed(path, updated, signing_key)
    return updated


def _rewrap(
    wrap: WrappedKey, providers: Mapping[str, KeyProvider], context: dict[str, str]
) -> WrappedKey:
    provider = providers.get(wrap.provider)
    if provider is None:
        raise KeyProviderError(f"key provider {wrap.provider!r} is not configured")
    return provider.rewrap(wrap, context)


def _rewrite_tar(
    store: BundleStore,
    manifest: Manifest,
    signing_key: Ed25519PrivateKey,
    progress: Progress | None,
) -> None:
    """A tar cannot be edited in place: copy the payload (unchanged) into a new one."""
    target = store.root
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for entry in manifest.files:
            name = payload_name(entry.path)
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            with store.map(name) as view, (work / name).open("xb") as f:
                for start in range(0, len(view), 8 << 20):
                    with view[start : start + (8 << 20)] as block:
                        f.write(block)
                        if progress is not None:
                            progress("copy payload", len(block), entry.ciphertext_size)
        _write_signed(work, manifest, signing_key)
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        write_tar(work, partial, progress)
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
