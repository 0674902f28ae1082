"""Segmented AES-256-GCM streaming AEAD (Tink's AES-GCM-HKDF streaming layout).

    file      = header || segment_0 || ... || segment_{n-1}
    header    = header_len (1 byte = 40) || salt (32) || nonce_prefix (7)
    file key  = HKDF-SHA256(ikm=DEK, salt=salt, info=associated_data, length=32)
    segment_i = AES-256-GCM(file key, nonce_i, plaintext_i)        (ciphertext || 16-byte tag)
    nonce_i   = nonce_prefix || uint32_be(i) || (0x01 if last else 0x00)

Every ciphertext segment is `segment_size` bytes except the first (shortened by the header) and
the last (shorter, never empty of tag).  The counter and last flag in the nonce make truncation,
extension, reordering and duplication fail; the per-file salt and the associated data (bundle id
and file path) make splicing a segment or header from another file fail.

Readers follow age's STREAM rules: the length must be one an encrypter can produce, the final
segment is authenticated first, and a segment whose tag fails is wiped from the output before
the error is raised (`AESGCM.decrypt_into` leaves plaintext behind when it raises).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import BundleIntegrityError

__all__ = [
    "HEADER_SIZE",
    "MAX_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "TAG_SIZE",
    "SegmentDecrypter",
    "SegmentEncrypter",
    "ciphertext_size",
    "plaintext_size",
    "segment_bounds",
    "wipe",
]

KEY_SIZE = 32
SALT_SIZE = 32
NONCE_PREFIX_SIZE = 7
HEADER_SIZE = 1 + SALT_SIZE + NONCE_PREFIX_SIZE
TAG_SIZE = 16
MIN_SEGMENT_SIZE = 4096
MAX_SEGMENT_SIZE = 4 << 20
_MAX_SEGMENTS = 1 << 32


def _check_segment_size(segment_size: int) -> None:
    if not MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE:
        raise ValueError(f"segment size must be in [{MIN_SEGMENT_SIZE}, {MAX_SEGMENT_SIZE}]")


def _segment_count(plain: int, segment_size: int) -> int:
    first = segment_size - HEADER_SIZE - TAG_SIZE
    if plain <= first:
        return 1
    rest = segment_size - TAG_SIZE
    return 1 + -(-(plain - first) // rest)


def ciphertext_size(plain: int, segment_size: int) -> int:
    """Size of the encrypted file for `plain` plaintext bytes."""
    _check_segment_size(segment_size)
    return HEADER_SIZE + plain + TAG_SIZE * _segment_count(plain, segment_size)


def plaintext_size(cipher: int, segment_size: int) -> int:
    """Plaintext size of a `cipher`-byte file; BundleIntegrityError if no encrypter makes it."""
    _check_segment_size(segment_size)
    body = cipher - HEADER_SIZE
    if body < TAG_SIZE:
        raise BundleIntegrityError("length")
    first = segment_size - HEADER_SIZE
    if body <= first:
        count = 1
    else:
        count = 1 + -(-(body - first) // segment_size)
        last = body - first - (count - 2) * segment_size
        if last <= TAG_SIZE:  # an empty final segment only exists when the file is empty
            raise BundleIntegrityError("length")
    if count > _MAX_SEGMENTS:
        raise BundleIntegrityError("length")
    plain = body - TAG_SIZE * count
    if ciphertext_size(plain, segment_size) != cipher:
        raise BundleIntegrityError("length")
    return plain


def segment_bounds(cipher: int, segment_size: int) -> list[tuple[int, int, int]]:
    """(ciphertext offset, ciphertext length, plaintext offset) of every segment, in order."""
    plaintext_size(cipher, segment_size)  # validates the length
    bounds = []
    offset, plain_offset = HEADER_SIZE, 0
    length = segment_size - HEADER_SIZE
    while offset < cipher:
        n = min(length, cipher - offset)
        bounds.append((offset, n, plain_offset))
        offset += n
        plain_offset += n - TAG_SIZE
        length = segment_size
    return bounds


def _file_key(dek: bytes | bytearray, salt: bytes, associated_data: bytes) -> AESGCM:
    if len(dek) != KEY_SIZE:
        raise ValueError("the data key must be 32 bytes")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=salt, info=associated_data)
    return AESGCM(hkdf.derive(bytes(dek)))


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + index.to_bytes(4, "big") + (b"\x01" if last else b"\x00")


class SegmentEncrypter:
    """Encrypts one file segment by segment; the caller feeds plaintext in segment-sized pieces.

    `plaintext_chunk(i)` says how many plaintext bytes segment `i` takes (all but the last must
    be full).  Salt and nonce prefix are random unless given (tests pin them).
    """

    def __init__(
        self,
        dek: bytes | bytearray,
        associated_data: bytes,
        segment_size: int,
        *,
        salt: bytes | None = None,
        nonce_prefix: bytes | None = None,
    ) -> None:
        _check_segment_size(segment_size)
        salt = secrets.token_bytes(SALT_SIZE) if salt is None else salt
        prefix = secrets.token_bytes(NONCE_PREFIX_SIZE) if nonce_prefix is None else nonce_prefix
        if len(salt) != SALT_SIZE or len(prefix) != NONCE_PREFIX_SIZE:
            raise ValueError("bad salt or nonce prefix size")
        self.segment_size = segment_size
        self.header = bytes([HEADER_SIZE]) + salt + prefix
        self._prefix = prefix
        self._aead = _file_key(dek, salt, associated_data)
        self._next = 0
        self._done = False

    def plaintext_chunk(self, index: int) -> int:
        extra = HEADER_SIZE if index == 0 else 0
        return self.segment_size - TAG_SIZE - extra

    def encrypt_segment(self, plaintext: bytes | memoryview, *, last: bool) -> bytes:
        """Ciphertext of the next segment (call in order; `last=True` exactly once)."""
        if self._done:
            raise ValueError("the stream is already finished")
        full = self.plaintext_chunk(self._next)
        if len(plaintext) > full or (not last and len(plaintext) != full):
            raise ValueError("a segment that is not the last must be exactly full")
        if self._next >= _MAX_SEGMENTS:
            raise ValueError("too many segments")
        out = self._aead.encrypt(_nonce(self._prefix, self._next, last), plaintext, None)
        self._next += 1
        self._done = last
        return out


class SegmentDecrypter:
    """Decrypts a whole file held in memory (e.g. an mmap) into a caller-owned buffer.

    The output buffer is private to the caller until `decrypt_into` returns; on any failure every
    byte of it that may hold plaintext is zeroed before the error is raised.
    """

    def __init__(self, dek: bytes | bytearray, associated_data: bytes, segment_size: int) -> None:
        _check_segment_size(segment_size)
        self.segment_size = segment_size
        self._dek = dek
        self._associated_data = associated_data

    def decrypt_into(
        self,
        ciphertext: memoryview,
        out: memoryview,
        on_plaintext: Callable[[memoryview], None] | None = None,
        before_write: Callable[[int, int], None] | None = None,
    ) -> None:
        """Check the length, authenticate the final segment first, then decrypt the rest.

        `on_plaintext` sees each authenticated segment's plaintext in file order (to digest it
        while it is still in cache); `before_write(start, end)` is called before a segment's
        plaintext range is written (to wait for its memory).  On any failure `out` is zeroed
        before the error leaves.
        """
        cipher = len(ciphertext)
        plain = plaintext_size(cipher, self.segment_size)
        if len(out) != plain:
            raise ValueError("output buffer must be exactly the plaintext size")
        header = bytes(ciphertext[:HEADER_SIZE])
        if header[0] != HEADER_SIZE:
            raise BundleIntegrityError("header")
        salt, prefix = header[1 : 1 + SALT_SIZE], header[1 + SALT_SIZE :]
        aead = _file_key(self._dek, salt, self._associated_data)
        bounds = segment_bounds(cipher, self.segment_size)
        last = len(bounds) - 1
        try:
            for index in (last, *range(last)):
                offset, length, plain_offset = bounds[index]
                end = plain_offset + length - TAG_SIZE
                if before_write is not None:
                    before_write(plain_offset, end)
                # a `with` releases the slice at once, also when the tag fails: a live export
                # of `out` would stop its owner from unmapping it
                with out[plain_offset:end] as target:
                    try:
                        aead.decrypt_into(
                            _nonce(prefix, index, index == last),
                            ciphertext[offset : offset + length],
                            None,
                            target,
                        )
                    except InvalidTag:
                        raise BundleIntegrityError("segment") from None
                if on_plaintext is not None and index != last:
                    on_plaintext(out[plain_offset:end])  # the consumer owns this slice
            if on_plaintext is not None:
                offset, length, plain_offset = bounds[last]
                on_plaintext(out[plain_offset : plain_offset + length - TAG_SIZE])
        except BaseException:
            wipe(out)
            raise

    def read(self, ciphertext: memoryview, offset: int, length: int) -> bytes:
        """`length` plaintext bytes from `offset`, decrypting only the segments they touch.

        The final segment is authenticated first, so a truncated file fails even when the read
        does not reach its end.
        """
        plain = plaintext_size(len(ciphertext), self.segment_size)
        if offset < 0 or length < 0 or offset + length > plain:
            raise ValueError("read outside the plaintext")
        header = bytes(ciphertext[:HEADER_SIZE])
        if header[0] != HEADER_SIZE:
            raise BundleIntegrityError("header")
        salt, prefix = header[1 : 1 + SALT_SIZE], header[1 + SALT_SIZE :]
        aead = _file_key(self._dek, salt, self._associated_data)
        bounds = segment_bounds(len(ciphertext), self.segment_size)
        last = len(bounds) - 1

        def segment(index: int) -> bytes:
            start, size, _ = bounds[index]
            nonce = _nonce(prefix, index, index == last)
            try:
                return aead.decrypt(nonce, ciphertext[start : start + size], None)
            except InvalidTag:
                raise BundleIntegrityError("segment") from None

        segment(last)
        out = bytearray()
        for index, (_, size, plain_offset) in enumerate(bounds):
            end = plain_offset + size - TAG_SIZE
            if end <= offset or plain_offset >= offset + length:
                continue
            data = segment(index)
            out += data[max(0, offset - plain_offset) : offset + length - plain_offset]
        return bytes(out)


def wipe(buffer: memoryview) -> None:
    """Zero `buffer` in place, a MiB at a time."""
    step = 1 << 20
    zeros = bytes(min(step, len(buffer)))
    for start in range(0, len(buffer), step):
        end = min(start + step, len(buffer))
        buffer[start:end] = zeros[: end - start]
