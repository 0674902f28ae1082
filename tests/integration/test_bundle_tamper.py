"""Sealed bundles on disk against an attacker: every edit is refused, and nothing is left behind.

Each test seals a small GGUF-like (or safetensors) payload with a real local KMS key file and
4 KiB segments, edits the bundle the way an attacker could, and opens it.  The attacker may also
hold the trusted signing key, in which case the AEAD and the KMS context are what refuse.  Every
refusal must leave no memfd open and no decrypted directory in the tmpfs root.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import os
import random
import stat
import tarfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundles import (
    BundleFormatError,
    BundleIntegrityError,
    BundlePolicyError,
    BundleSignatureError,
    KeyUnwrapError,
    LocalKeyProvider,
    Manifest,
    ModelInfo,
    OpenedModel,
    TrustedKeys,
    WrappedKey,
    init_key_file,
    open_bundle,
    seal_bundle,
    sources_from_path,
)
from bundles._crypto.stream import HEADER_SIZE, TAG_SIZE, plaintext_size, segment_bounds
from bundles.manifest import decode_manifest, encode_manifest, key_context
from bundles.signing import sign_manifest

SEG = 4096
# four segments: a first one (shortened by the header), two full ones and a short final one
PAYLOAD_SIZE = (SEG - HEADER_SIZE - TAG_SIZE) + 2 * (SEG - TAG_SIZE) + 1000
SEALED_AT = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
OPEN_AT = SEALED_AT + timedelta(days=1)
GGUF = "model.gguf"
SHARD = "model-00001-of-00002.safetensors"
TWIN = "model-00002-of-00002.safetensors"  # the same bytes as SHARD, encrypted separately
SAFETENSORS = {
    "config.json": b'{"architectures": ["Test"]}',
    SHARD: None,
    TWIN: None,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}
E = TypeVar("E", bound=Exception)
WeightFormat = Literal["gguf", "safetensors"]
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


def gguf_bytes(seed: int, size: int = PAYLOAD_SIZE) -> bytes:
    return b"GGUF" + random.Random(seed).randbytes(size - 4)


def payload(bundle: Path, path: str) -> Path:
    return bundle / "data" / f"{path}.enc"


def memfds() -> set[int]:
    """This process's fds that are airgate memfds (or mappings' duplicates of them).

    Compared as sets, not counts: a memfd leaked by an earlier failing test may be closed by
    the garbage collector at any time.
    """
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:airgate"):
                fds.add(int(name))
        except OSError:  # the fd of the listing itself, already closed
            pass
    return fds


class RecordingProvider:
    """The local provider, recording which operations were asked of it."""

    name: ClassVar[str] = "local"

    def __init__(self, inner: LocalKeyProvider) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def generate_data_key(
        self, key_ref: str, context: Mapping[str, str]
    ) -> tuple[bytearray, WrappedKey]:
        self.calls.append("generate_data_key")
        return self.inner.generate_data_key(key_ref, context)

    def wrap(self, key_ref: str, dek: bytes | bytearray, context: Mapping[str, str]) -> WrappedKey:
        self.calls.append("wrap")
        return self.inner.wrap(key_ref, dek, context)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytearray:
        self.calls.append("unwrap")
        return self.inner.unwrap(wrapped, context)

    def rewrap(
        self, wrapped: WrappedKey, context: Mapping[str, str], key_ref: str | None = None
    ) -> WrappedKey:
        self.calls.append("rewrap")
        return self.inner.rewrap(wrapped, context, key_ref)

    def close(self) -> None:
        self.calls.append("close")


@dataclass
class Env:
    root: Path
    provider: LocalKeyProvider
    signing_key: Ed25519PrivateKey
    trusted: TrustedKeys
    tmpfs: Path

    @property
    def providers(self) -> dict[str, Any]:
        return {"local": self.provider}

    def seal(
        self,
        name: str,
        files: Mapping[str, bytes | None] | None = None,
        *,
        weight_format: WeightFormat = "gguf",
        **options: Any,
    ) -> Path:
        """Seal `files` (default: one GGUF) into the bundle `name` under the test's directory."""
        if files is None:
            files = {GGUF: gguf_bytes(1)} if weight_format == "gguf" else SAFETENSORS
        src = self.root / f"src-{name}"
        shard = gguf_bytes(2)
        for rel, data in files.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(shard if data is None else data)
        out = self.root / name
        seal_bundle(
            sources_from_path(src / next(iter(files)) if weight_format == "gguf" else src),
            out,
            model=ModelInfo(
                name="tamper-test",
                version="1",
                architecture="test",
                weight_format=weight_format,
                quantisation="Q4_K_M",
                chat_template="gemma",
                engine_hints={"context_length": 512, "flash_attn": True},
            ),
            recipients=["local:default"],
            providers=self.providers,
            signing_key=self.signing_key,
            now=SEALED_AT,
            segment_size=SEG,
            **options,
        )
        return out

    def open(self, bundle: Path, **options: Any) -> OpenedModel:
        options.setdefault("now", OPEN_AT)
        options.setdefault("tmpfs_root", self.tmpfs)
        providers = options.pop("providers", self.providers)
        return open_bundle(bundle, self.trusted, providers, **options)

    def rewrite(
        self, bundle: Path, manifest: Manifest, *, signing_key: Ed25519PrivateKey | None = None
    ) -> None:
        """Write `manifest` canonically and sign it (with the trusted key unless told)."""
        data = encode_manifest(manifest)
        (bundle / "manifest.json").write_bytes(data)
        (bundle / "manifest.sig").write_bytes(sign_manifest(data, signing_key or self.signing_key))

    @contextmanager
    def refused(self, error: type[E]) -> Iterator[pytest.ExceptionInfo[E]]:
        """Expect `error`, and that the refusal left no memfd and no tmpfs directory."""
        before = memfds()
        with pytest.raises(error) as info:
            yield info
        assert memfds() <= before, "a refused bundle left a memfd open"
        assert not list(self.tmpfs.glob("airgate-model-*")), "a refused bundle left plaintext"


@pytest.fixture
def env(tmp_path: Path) -> Env:
    key_file = tmp_path / "kms" / "local-keys.json"
    assert init_key_file(key_file)
    signing_key = Ed25519PrivateKey.generate()
    tmpfs = tmp_path / "shm"
    tmpfs.mkdir(mode=0o700)
    return Env(
        tmp_path,
        LocalKeyProvider(key_file),
        signing_key,
        TrustedKeys([signing_key.public_key()]),
        tmpfs,
    )


def read_manifest_file(bundle: Path) -> Manifest:
    return decode_manifest((bundle / "manifest.json").read_bytes())


# --- happy paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bundle", "bundle.tar"])
def test_gguf_opens_into_a_sealed_memfd(env: Env, name: str) -> None:
    bundle = env.seal(name)
    assert bundle.is_dir() == (name == "bundle")
    before = memfds()

    opened = env.open(bundle, engine="llama.cpp")

    fd = opened.fd
    assert fd is not None
    assert memfds() - before == {fd}
    with open(opened.path, "rb") as f:
        assert f.read() == gguf_bytes(1)
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
    with pytest.raises(PermissionError):
        os.write(fd, b"x")
    opened.release()
    assert opened.fd is None
    assert memfds() <= before


def test_safetensors_open_into_a_private_tmpfs_directory(env: Env) -> None:
    bundle = env.seal("bundle", weight_format="safetensors")

    opened = env.open(bundle, engine="vllm")

    root = Path(opened.path)
    assert root.parent == env.tmpfs
    assert root.name.startswith("airgate-model-")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "tokenizer").stat().st_mode) == 0o700
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == sorted(SAFETENSORS)
    for rel, data in SAFETENSORS.items():
        assert (root / rel).read_bytes() == (gguf_bytes(2) if data is None else data)
        assert stat.S_IMODE((root / rel).stat().st_mode) == 0o600
    opened.release()
    assert not root.exists()
    assert not list(env.tmpfs.iterdir())


# --- ciphertext tampering -------------------------------------------------------------------

Tamper = Callable[[bytes, bytes], bytes]  # (ciphertext, a twin file's ciphertext) -> tampered


def _segments(ct: bytes) -> list[bytes]:
    return [ct[off : off + n] for off, n, _ in segment_bounds(len(ct), SEG)]


def _join(ct: bytes, parts: list[bytes]) -> bytes:
    return ct[:HEADER_SIZE] + b"".join(parts)


def _flip(ct: bytes, pos: int) -> bytes:
    return ct[:pos] + bytes([ct[pos] ^ 0x04]) + ct[pos + 1 :]


def _swap(ct: bytes) -> bytes:
    s = _segments(ct)
    return _join(ct, [s[0], s[2], s[1], *s[3:]])


def _splice(ct: bytes, other: bytes) -> bytes:
    s = _segments(ct)
    s[1] = _segments(other)[1]
    return _join(ct, s)


TAMPERS: list[Any] = [
    pytest.param(lambda ct, _: ct[:-1], id="truncate-1"),
    pytest.param(lambda ct, _: ct[: len(ct) - len(_segments(ct)[-1])], id="truncate-final"),
    pytest.param(lambda ct, _: ct[: HEADER_SIZE + SEG], id="truncate-mid-segment"),
    pytest.param(lambda ct, _: ct[:HEADER_SIZE], id="truncate-to-header"),
    pytest.param(lambda ct, _: b"", id="truncate-to-empty"),
    pytest.param(lambda ct, _: ct + b"\0", id="append-1"),
    pytest.param(lambda ct, _: ct + bytes(17), id="append-17"),
    pytest.param(lambda ct, _: ct + random.Random(3).randbytes(SEG), id="append-segment"),
    pytest.param(lambda ct, _: ct + _segments(ct)[-1], id="duplicate-final"),
    pytest.param(
        lambda ct, _: _join(ct, [s for i, s in enumerate(_segments(ct)) if i != 1]),
        id="drop-middle",
    ),
    pytest.param(lambda ct, _: _swap(ct), id="swap-segments"),
    pytest.param(lambda ct, _: _flip(ct, 0), id="flip-header-length"),
    pytest.param(lambda ct, _: _flip(ct, 9), id="flip-salt"),
    pytest.param(lambda ct, _: _flip(ct, HEADER_SIZE - 1), id="flip-nonce-prefix"),
    pytest.param(lambda ct, _: _flip(ct, HEADER_SIZE + 100), id="flip-first-body"),
    pytest.param(lambda ct, _: _flip(ct, HEADER_SIZE + SEG), id="flip-middle-body"),
    pytest.param(lambda ct, _: _flip(ct, len(ct) - TAG_SIZE - 1), id="flip-final-body"),
    pytest.param(lambda ct, _: _flip(ct, len(ct) - 1), id="flip-final-tag"),
]
TWIN_TAMPERS: list[Any] = [
    pytest.param(_splice, id="splice-from-twin-file"),
    pytest.param(lambda ct, other: other[:HEADER_SIZE] + ct[HEADER_SIZE:], id="foreign-header"),
]
CASES = [
    *(pytest.param("gguf", *p.values, id=f"gguf-{p.id}") for p in TAMPERS),
    *(
        pytest.param("safetensors", *p.values, id=f"safetensors-{p.id}")
        for p in [*TAMPERS, *TWIN_TAMPERS]
    ),
]


def tamper_payload(env: Env, weight_format: WeightFormat, make: Tamper) -> tuple[Path, str, bytes]:
    """A sealed bundle whose target payload has been replaced by `make`'s bytes."""
    bundle = env.seal("bundle", weight_format=weight_format)
    path = GGUF if weight_format == "gguf" else SHARD
    original = payload(bundle, path).read_bytes()
    twin = payload(bundle, TWIN).read_bytes() if weight_format == "safetensors" else original
    tampered = make(original, twin)
    assert tampered != original
    payload(bundle, path).write_bytes(tampered)
    return bundle, path, tampered


@pytest.mark.parametrize(("weight_format", "make"), CASES)
def test_tampered_ciphertext_is_refused_by_its_digest(
    env: Env, weight_format: WeightFormat, make: Tamper
) -> None:
    bundle, path, tampered = tamper_payload(env, weight_format, make)
    entry = next(f for f in read_manifest_file(bundle).files if f.path == path)

    with env.refused(BundleIntegrityError) as info:
        env.open(bundle)

    size_changed = len(tampered) != entry.ciphertext_size
    assert info.value.reason == ("ciphertext size" if size_changed else "ciphertext digest")


def _aead_reason(ct: bytes) -> str:
    try:
        plaintext_size(len(ct), SEG)
    except BundleIntegrityError:
        return "length"
    return "header" if ct[0] != HEADER_SIZE else "segment"


@pytest.mark.parametrize(("weight_format", "make"), CASES)
def test_tampered_ciphertext_is_refused_by_the_aead_even_when_re_signed(
    env: Env, weight_format: WeightFormat, make: Tamper
) -> None:
    bundle, path, tampered = tamper_payload(env, weight_format, make)
    # the attacker holds the signing key: sizes and ciphertext digest match the tampered bytes
    manifest = read_manifest_file(bundle)
    entries = []
    for entry in manifest.files:
        if entry.path == path:
            try:
                plain = plaintext_size(len(tampered), SEG)
            except BundleIntegrityError:
                plain = entry.plaintext_size
            entry = msgspec.structs.replace(
                entry,
                ciphertext_size=len(tampered),
                ciphertext_sha256=hashlib.sha256(tampered).hexdigest(),
                plaintext_size=plain,
            )
        entries.append(entry)
    env.rewrite(bundle, msgspec.structs.replace(manifest, files=entries))

    with env.refused(BundleIntegrityError) as info:
        env.open(bundle)

    assert info.value.reason == _aead_reason(tampered)


# --- manifest and signature -----------------------------------------------------------------


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path


def _nudge(value: Any) -> Any:
    """The smallest change of a JSON leaf."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + chr(ord(value[-1]) ^ 1) if value else "x"
    assert value is None
    return 0


def test_every_manifest_field_is_covered_by_the_signature(env: Env) -> None:
    bundle = env.seal(
        "bundle",
        not_before=SEALED_AT - timedelta(days=1),
        not_after=SEALED_AT + timedelta(days=30),
        max_offline_days=30,
    )
    original = (bundle / "manifest.json").read_bytes()
    document = msgspec.json.decode(original)
    assert msgspec.json.encode(document, order="sorted") == original
    accepted = []
    leaves = list(_leaves(document))
    for leaf in leaves:
        edited = copy.deepcopy(document)
        parent = edited
        for key in leaf[:-1]:
            parent = parent[key]
        parent[leaf[-1]] = _nudge(parent[leaf[-1]])
        (bundle / "manifest.json").write_bytes(msgspec.json.encode(edited, order="sorted"))
        try:
            with env.refused(BundleSignatureError):
                env.open(bundle)
        except BaseException as exc:  # collect every field, then report them all
            accepted.append(f"{'.'.join(map(str, leaf))}: {type(exc).__name__}: {exc}")
    assert len(leaves) >= 30
    assert accepted == []
    (bundle / "manifest.json").write_bytes(original)
    env.open(bundle).release()


def _respaced(data: bytes) -> bytes:
    return data.replace(b",", b", ", 1)


NON_CANONICAL = [
    pytest.param(_respaced, id="space-after-comma"),
    pytest.param(lambda data: data + b"\n", id="trailing-newline"),
    pytest.param(lambda data: b" " + data, id="leading-space"),
    pytest.param(lambda data: msgspec.json.format(data, indent=2), id="pretty-printed"),
    pytest.param(
        lambda data: msgspec.json.encode(dict(reversed(msgspec.json.decode(data).items()))),
        id="keys-unsorted",
    ),
]


@pytest.mark.parametrize("respell", NON_CANONICAL)
def test_a_non_canonical_manifest_is_refused(env: Env, respell: Callable[[bytes], bytes]) -> None:
    bundle = env.seal("bundle")
    data = respell((bundle / "manifest.json").read_bytes())
    (bundle / "manifest.json").write_bytes(data)

    with env.refused(BundleSignatureError):
        env.open(bundle)

    # even signed by the trusted key, only the canonical spelling is read
    (bundle / "manifest.sig").write_bytes(sign_manifest(data, env.signing_key))
    with env.refused(BundleFormatError):
        env.open(bundle)


def test_a_signature_from_an_untrusted_key_is_refused(env: Env) -> None:
    bundle = env.seal("bundle")
    env.rewrite(bundle, read_manifest_file(bundle), signing_key=Ed25519PrivateKey.generate())

    with env.refused(BundleSignatureError):
        env.open(bundle)


def test_a_bundle_signed_by_a_key_not_pinned_here_is_refused(env: Env) -> None:
    bundle = env.seal("bundle")
    with env.refused(BundleSignatureError):
        open_bundle(
            bundle,
            TrustedKeys([Ed25519PrivateKey.generate().public_key()]),
            env.providers,
            now=OPEN_AT,
            tmpfs_root=env.tmpfs,
        )


def test_a_missing_signature_is_refused(env: Env) -> None:
    bundle = env.seal("bundle")
    (bundle / "manifest.sig").unlink()

    with env.refused(BundleSignatureError):
        env.open(bundle)


def _sig(valid: bytes, **changes: str) -> bytes:
    document = msgspec.json.decode(valid)
    document.update(changes)
    return msgspec.json.encode(document, order="sorted")


MALFORMED_SIGNATURES = [
    pytest.param(lambda sig: b"", id="empty"),
    pytest.param(lambda sig: b"not json", id="not-json"),
    pytest.param(lambda sig: b"[]", id="json-list"),
    pytest.param(lambda sig: b"{}", id="no-fields"),
    pytest.param(lambda sig: sig[:-2], id="cut-short"),
    pytest.param(lambda sig: _sig(sig, algorithm="rsa"), id="other-algorithm"),
    pytest.param(lambda sig: _sig(sig, extra="x"), id="unknown-field"),
    pytest.param(lambda sig: _sig(sig, signature="!!!!"), id="not-base64"),
    pytest.param(lambda sig: _sig(sig, signature="AAAA"), id="wrong-length"),
    pytest.param(lambda sig: _sig(sig, signature="\u00e9" * 4), id="non-ascii"),
    pytest.param(lambda sig: _sig(sig, signature="A" * 86 + "=="), id="zero-signature"),
    pytest.param(lambda sig: _sig(sig, key_id="0" * 16), id="unknown-key-id"),
]


@pytest.mark.parametrize("mangle", MALFORMED_SIGNATURES)
def test_a_malformed_signature_is_refused(env: Env, mangle: Callable[[bytes], bytes]) -> None:
    bundle = env.seal("bundle")
    sig = bundle / "manifest.sig"
    sig.write_bytes(mangle(sig.read_bytes()))

    with env.refused(BundleSignatureError):
        env.open(bundle)


# --- policy ---------------------------------------------------------------------------------

POLICY_CASES = [
    pytest.param(
        {"not_after": SEALED_AT + timedelta(days=10)},
        {"now": SEALED_AT + timedelta(days=11)},
        {},
        id="expired",
    ),
    pytest.param(
        {"not_before": SEALED_AT + timedelta(days=5)},
        {"now": SEALED_AT + timedelta(days=4)},
        {"now": SEALED_AT + timedelta(days=5)},
        id="not-yet-valid",
    ),
    pytest.param(
        {"max_offline_days": 30},
        {"now": SEALED_AT + timedelta(days=30, seconds=1)},
        {"now": SEALED_AT + timedelta(days=30)},
        id="offline-too-long",
    ),
    pytest.param({}, {"engine": "vllm"}, {"engine": "llama.cpp"}, id="engine-not-allowed"),
    pytest.param(
        {"allowed_engines": ["vllm"]},
        {"engine": "llama.cpp"},
        {"engine": "vllm"},
        id="engine-not-in-allow-list",
    ),
]


@pytest.mark.parametrize(("seal_options", "refused_at", "accepted_at"), POLICY_CASES)
def test_policy_is_enforced(
    env: Env,
    seal_options: dict[str, Any],
    refused_at: dict[str, Any],
    accepted_at: dict[str, Any],
) -> None:
    bundle = env.seal("bundle", **seal_options)

    with env.refused(BundlePolicyError):
        env.open(bundle, **refused_at)

    env.open(bundle, **accepted_at).release()


# --- key wraps ------------------------------------------------------------------------------


def test_another_bundles_key_wrap_is_refused(env: Env) -> None:
    a, b = env.seal("a"), env.seal("b")
    manifest_a, manifest_b = read_manifest_file(a), read_manifest_file(b)
    env.rewrite(a, msgspec.structs.replace(manifest_a, key_wraps=manifest_b.key_wraps))

    with env.refused(KeyUnwrapError):
        env.open(a)


def test_another_bundles_key_wrap_relabelled_with_this_context_is_refused(env: Env) -> None:
    a, b = env.seal("a"), env.seal("b")
    manifest_a, manifest_b = read_manifest_file(a), read_manifest_file(b)
    wraps = [
        msgspec.structs.replace(w, context=key_context(manifest_a.bundle_id))
        for w in manifest_b.key_wraps
    ]
    env.rewrite(a, msgspec.structs.replace(manifest_a, key_wraps=wraps))
    recorder = RecordingProvider(env.provider)

    with env.refused(KeyUnwrapError):
        env.open(a, providers={"local": recorder})

    assert recorder.calls == ["unwrap"]


def test_a_wrap_of_another_data_key_is_refused_by_decryption(env: Env) -> None:
    bundle = env.seal("bundle")
    manifest = read_manifest_file(bundle)
    wrap = env.provider.wrap("default", os.urandom(32), key_context(manifest.bundle_id))
    env.rewrite(bundle, msgspec.structs.replace(manifest, key_wraps=[wrap]))

    with env.refused(BundleIntegrityError) as info:
        env.open(bundle)

    assert info.value.reason == "segment"


# --- bundle contents ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra", ["notes.txt", ".hidden", "data/extra.enc", f"data/{GGUF}", "data/sub/x.enc"]
)
def test_an_unexpected_file_is_refused(env: Env, extra: str) -> None:
    bundle = env.seal("bundle")
    (bundle / extra).parent.mkdir(parents=True, exist_ok=True)
    (bundle / extra).write_bytes(b"GGUF extra")

    with env.refused(BundleIntegrityError) as info:
        env.open(bundle)

    assert info.value.reason == "unexpected file"


def test_an_unexpected_tar_member_is_refused(env: Env) -> None:
    bundle = env.seal("bundle.tar")
    extra = env.root / "notes.txt"
    extra.write_bytes(b"hello")
    with tarfile.open(bundle, "a") as tar:
        tar.add(extra, arcname="notes.txt")

    with env.refused(BundleIntegrityError) as info:
        env.open(bundle)

    assert info.value.reason == "unexpected file"


# --- order of checks ------------------------------------------------------------------------


def _bad_signature(env: Env, bundle: Path) -> None:
    data = bytearray((bundle / "manifest.json").read_bytes())
    data[data.index(b'"version":"1"') + 11] = ord("2")
    (bundle / "manifest.json").write_bytes(bytes(data))


def _payload_flip(env: Env, bundle: Path) -> None:
    target = payload(bundle, GGUF)
    target.write_bytes(_flip(target.read_bytes(), HEADER_SIZE + 1))


ORDER_CASES = [
    pytest.param({}, _bad_signature, {}, BundleSignatureError, id="bad-signature"),
    pytest.param(
        {"not_after": SEALED_AT + timedelta(hours=1)}, None, {}, BundlePolicyError, id="expired"
    ),
    pytest.param({}, None, {"engine": "vllm"}, BundlePolicyError, id="engine-not-allowed"),
    pytest.param({}, _payload_flip, {}, BundleIntegrityError, id="payload-digest"),
]


@pytest.mark.parametrize(("seal_options", "edit", "open_options", "error"), ORDER_CASES)
def test_no_kms_call_before_signature_policy_and_digests_pass(
    env: Env,
    seal_options: dict[str, Any],
    edit: Callable[[Env, Path], None] | None,
    open_options: dict[str, Any],
    error: type[Exception],
) -> None:
    bundle = env.seal("bundle", **seal_options)
    if edit is not None:
        edit(env, bundle)
    recorder = RecordingProvider(env.provider)

    with env.refused(error):
        env.open(bundle, providers={"local": recorder}, **open_options)

    assert recorder.calls == []


def test_the_recording_provider_sees_the_unwrap_of_a_good_bundle(env: Env) -> None:
    bundle = env.seal("bundle")
    recorder = RecordingProvider(env.provider)

    env.open(bundle, providers={"local": recorder}).release()

    assert recorder.calls == ["unwrap"]
