"""The segmented streaming AEAD: every tampering fails closed, and sizes and reads are exact.

Pure and in memory: a 4-segment file (segment size 4096) is cut, extended, reordered, spliced
and bit-flipped; each variant must raise `BundleIntegrityError` and leave the caller's output
buffer all zeros.  Hypothesis checks round trips, the size arithmetic and random reads.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bundles._crypto.stream import (
    HEADER_SIZE,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    TAG_SIZE,
    SegmentDecrypter,
    SegmentEncrypter,
    ciphertext_size,
    plaintext_size,
    segment_bounds,
)
from bundles.errors import BundleIntegrityError

SEG = MIN_SEGMENT_SIZE
FIRST = SEG - HEADER_SIZE - TAG_SIZE  # plaintext bytes in segment 0
FULL = SEG - TAG_SIZE  # plaintext bytes in every later full segment
PLAIN_SIZE = FIRST + 2 * FULL + 1000  # segments: first, two full middle ones, a short final one
CT_SIZE = ciphertext_size(PLAIN_SIZE, SEG)
BOUNDS = segment_bounds(CT_SIZE, SEG)
LAST = len(BOUNDS) - 1

DEK = bytes(range(32))
OTHER_DEK = bytes(range(1, 33))
AD = b"airgate-bundle/1|0123456789abcdef0123456789abcdef|model.gguf"
OTHER_AD = b"airgate-bundle/1|0123456789abcdef0123456789abcdef|other.gguf"
SALT = bytes([0x5A]) * 32
OTHER_SALT = bytes([0xA5]) * 32
PREFIX = bytes(range(7))
GENERIC_MESSAGE = "bundle integrity check failed"

SEGMENT_SIZES = [MIN_SEGMENT_SIZE, MIN_SEGMENT_SIZE + 1, 5000, 8192, 1 << 16]
PROPERTY = settings(max_examples=80, deadline=None)


def _random(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def encrypt(
    plain: bytes,
    *,
    dek: bytes = DEK,
    ad: bytes = AD,
    segment_size: int = SEG,
    salt: bytes | None = None,
    nonce_prefix: bytes | None = None,
) -> bytes:
    """The whole ciphertext file of `plain`, fed to the encrypter segment by segment."""
    enc = SegmentEncrypter(dek, ad, segment_size, salt=salt, nonce_prefix=nonce_prefix)
    parts, pos, index = [enc.header], 0, 0
    while True:
        take = min(enc.plaintext_chunk(index), len(plain) - pos)
        last = pos + take == len(plain)
        parts.append(enc.encrypt_segment(plain[pos : pos + take], last=last))
        pos, index = pos + take, index + 1
        if last:
            return b"".join(parts)


def decrypt(
    ct: bytes, *, dek: bytes = DEK, ad: bytes = AD, segment_size: int = SEG
) -> tuple[bytes, list[bytes]]:
    """Plaintext and the segments `on_plaintext` saw, in order."""
    out = bytearray(plaintext_size(len(ct), segment_size))
    seen: list[bytes] = []
    SegmentDecrypter(dek, ad, segment_size).decrypt_into(
        memoryview(ct), memoryview(out), lambda seg: seen.append(bytes(seg))
    )
    return bytes(out), seen


def segments(ct: bytes) -> list[bytes]:
    return [ct[off : off + n] for off, n, _ in segment_bounds(len(ct), SEG)]


def join(ct: bytes, parts: list[bytes]) -> bytes:
    return ct[:HEADER_SIZE] + b"".join(parts)


def flip(data: bytes, pos: int, bit: int = 0x01) -> bytes:
    return data[:pos] + bytes([data[pos] ^ bit]) + data[pos + 1 :]


@dataclass(frozen=True)
class Material:
    plain: bytes
    ct: bytes  # pinned salt and nonce prefix
    other_ad: bytes  # same DEK, salt and prefix, other file (other associated data, plaintext)
    other_salt: bytes  # same DEK, associated data and prefix, other salt
    foreign: bytes  # the same plaintext encrypted again (random salt and prefix)


@functools.cache
def material() -> Material:
    plain = _random(1, PLAIN_SIZE)
    return Material(
        plain=plain,
        ct=encrypt(plain, salt=SALT, nonce_prefix=PREFIX),
        other_ad=encrypt(_random(2, PLAIN_SIZE), ad=OTHER_AD, salt=SALT, nonce_prefix=PREFIX),
        other_salt=encrypt(_random(3, PLAIN_SIZE), salt=OTHER_SALT, nonce_prefix=PREFIX),
        foreign=encrypt(plain),
    )


Tamper = Callable[[Material], bytes]


def _swap(ct: bytes, i: int, j: int) -> bytes:
    parts = segments(ct)
    parts[i], parts[j] = parts[j], parts[i]
    return join(ct, parts)


def _replace(ct: bytes, index: int, segment: bytes) -> bytes:
    parts = segments(ct)
    parts[index] = segment
    return join(ct, parts)


def _cut(length: int) -> Tamper:
    return lambda m: m.ct[:length]


def _append(n: int) -> Tamper:
    return lambda m: m.ct + _random(100 + n, n)


def _flip_at(pos: int, bit: int = 0x01) -> Tamper:
    return lambda m: flip(m.ct, pos, bit)


def _splice_from(source: Callable[[Material], bytes], index: int) -> Tamper:
    return lambda m: _replace(m.ct, index, segments(source(m))[index])


def _tamper_cases() -> list[Any]:
    cases: list[Any] = []

    def add(case_id: str, make: Tamper, *, dek: bytes = DEK, ad: bytes = AD) -> None:
        cases.append(pytest.param(make, dek, ad, id=case_id))

    # truncation
    for n in range(HEADER_SIZE + 1):
        add(f"truncate-header-{n}", _cut(n))
    cuts: dict[int, str] = {}
    for i, (off, n, _) in enumerate(BOUNDS):
        cuts.setdefault(off + 1, f"seg{i}-start-plus1")
        cuts.setdefault(off + n // 2, f"seg{i}-middle")
        for delta, name in ((-1, "minus1"), (0, "at"), (1, "plus1")):
            cuts.setdefault(off + n + delta, f"seg{i}-end-{name}")
    for length, name in sorted(cuts.items()):
        if HEADER_SIZE < length < CT_SIZE:
            add(f"truncate-{name}", _cut(length))
    # extension
    for n in (1, 15, 16, 17):
        add(f"append-{n}", _append(n))
    add("append-random-segment", lambda m: m.ct + _random(99, SEG))
    # reordering, duplication, dropping
    add("duplicate-final-segment", lambda m: m.ct + segments(m.ct)[LAST])
    add("drop-middle-segment", lambda m: join(m.ct, [segments(m.ct)[0], *segments(m.ct)[2:]]))
    add("swap-segments-1-2", lambda m: _swap(m.ct, 1, 2))
    add("segment-2-replaces-1", lambda m: _replace(m.ct, 1, segments(m.ct)[2]))
    add(
        "segment-1-inserted-twice", lambda m: join(m.ct, [*segments(m.ct)[:2], *segments(m.ct)[1:]])
    )
    # bit flips
    for pos in range(HEADER_SIZE):
        add(f"flip-header-{pos}", _flip_at(pos))
    for i, (off, n, _) in enumerate(BOUNDS):
        body = n - TAG_SIZE
        for name, pos in (("first", off), ("middle", off + body // 2), ("last", off + body - 1)):
            add(f"flip-seg{i}-body-{name}", _flip_at(pos, 0x80))
        for k in range(TAG_SIZE):
            add(f"flip-seg{i}-tag-{k}", _flip_at(off + body + k))
    # splicing from other files under the same DEK
    for i in range(len(BOUNDS)):
        add(f"splice-other-ad-seg{i}", _splice_from(lambda m: m.other_ad, i))
        add(f"splice-other-salt-seg{i}", _splice_from(lambda m: m.other_salt, i))
    add("foreign-header", lambda m: m.foreign[:HEADER_SIZE] + m.ct[HEADER_SIZE:])
    # the right bytes under the wrong key or the wrong associated data
    add("wrong-dek", lambda m: m.ct, dek=OTHER_DEK)
    add("wrong-associated-data", lambda m: m.ct, ad=OTHER_AD)
    return cases


TAMPERED = _tamper_cases()


def expected_reason(ct: bytes) -> str:
    try:
        plaintext_size(len(ct), SEG)
    except BundleIntegrityError:
        return "length"
    return "header" if ct[0] != HEADER_SIZE else "segment"


def test_the_untampered_file_decrypts() -> None:
    m = material()
    assert len(m.ct) == CT_SIZE
    assert len(BOUNDS) == 4
    plain, seen = decrypt(m.ct)
    assert plain == m.plain
    assert b"".join(seen) == m.plain
    assert [len(s) for s in seen] == [FIRST, FULL, FULL, 1000]
    assert decrypt(m.foreign)[0] == m.plain


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in TAMPERED]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("make", "dek", "ad"), TAMPERED)
def test_decrypt_into_refuses_and_zeroes_output(make: Tamper, dek: bytes, ad: bytes) -> None:
    m = material()
    tampered = make(m)
    assert tampered != m.ct or (dek, ad) != (DEK, AD)
    try:
        size = plaintext_size(len(tampered), SEG)
    except BundleIntegrityError:
        size = PLAIN_SIZE
    out = bytearray(size)
    calls: list[int] = []

    with pytest.raises(BundleIntegrityError) as info:
        SegmentDecrypter(dek, ad, SEG).decrypt_into(
            memoryview(tampered), memoryview(out), lambda seg: calls.append(len(seg))
        )

    assert info.value.reason == expected_reason(tampered)
    assert str(info.value) == GENERIC_MESSAGE
    assert not any(out)


FINAL_CORRUPT = [
    pytest.param(lambda m: flip(m.ct, BOUNDS[LAST][0]), id="final-body-flip"),
    pytest.param(lambda m: flip(m.ct, CT_SIZE - 1), id="final-tag-flip"),
    pytest.param(lambda m: m.ct[: BOUNDS[LAST][0]], id="final-segment-dropped"),
    pytest.param(lambda m: m.ct + _random(7, 17), id="final-segment-extended"),
    pytest.param(lambda m: _replace(m.ct, LAST, segments(m.other_ad)[LAST]), id="final-spliced"),
    pytest.param(lambda m: _replace(m.ct, LAST, segments(m.ct)[1]), id="middle-as-final"),
]


@pytest.mark.parametrize("make", FINAL_CORRUPT)
def test_a_corrupt_final_segment_releases_no_plaintext(make: Tamper) -> None:
    tampered = make(material())
    out = bytearray(plaintext_size(len(tampered), SEG))
    calls: list[bytes] = []

    with pytest.raises(BundleIntegrityError) as info:
        SegmentDecrypter(DEK, AD, SEG).decrypt_into(
            memoryview(tampered), memoryview(out), lambda seg: calls.append(bytes(seg))
        )

    assert info.value.reason == "segment"
    assert calls == []
    assert not any(out)


READ_REFUSED = [
    pytest.param(lambda m: m.ct[:-1], id="truncate-1"),
    pytest.param(lambda m: m.ct[: BOUNDS[LAST][0]], id="truncate-final-segment"),
    pytest.param(lambda m: m.ct[:HEADER_SIZE], id="truncate-to-header"),
    pytest.param(lambda m: m.ct + _random(8, 16), id="append-16"),
    pytest.param(lambda m: flip(m.ct, CT_SIZE - 1), id="final-tag-flip"),
    pytest.param(lambda m: flip(m.ct, 0), id="header-length-flip"),
    pytest.param(lambda m: flip(m.ct, 5), id="salt-flip"),
    pytest.param(lambda m: flip(m.ct, HEADER_SIZE - 1), id="nonce-prefix-flip"),
    pytest.param(lambda m: m.foreign[:HEADER_SIZE] + m.ct[HEADER_SIZE:], id="foreign-header"),
]


@pytest.mark.parametrize("make", READ_REFUSED)
@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 10), (BOUNDS[1][2] + 5, 100), (0, None)],
    ids=["head", "segment-1", "all"],
)
def test_read_refuses_tampering(make: Tamper, offset: int, length: int | None) -> None:
    tampered = make(material())
    if length is None:  # everything the (tampered) length claims
        try:
            length = plaintext_size(len(tampered), SEG)
        except BundleIntegrityError:
            length = PLAIN_SIZE
    with pytest.raises(BundleIntegrityError):
        SegmentDecrypter(DEK, AD, SEG).read(memoryview(tampered), offset, length)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda m: flip(m.ct, BOUNDS[1][0] + 3), id="middle-body-flip"),
        pytest.param(lambda m: flip(m.ct, BOUNDS[2][0] - 1), id="middle-tag-flip"),
        pytest.param(lambda m: _swap(m.ct, 1, 2), id="swap-segments-1-2"),
        pytest.param(lambda m: _replace(m.ct, 1, segments(m.other_ad)[1]), id="spliced-1"),
    ],
)
def test_read_refuses_exactly_when_it_touches_a_bad_middle_segment(make: Tamper) -> None:
    m = material()
    tampered = memoryview(make(m))
    decrypter = SegmentDecrypter(DEK, AD, SEG)
    seg1_start, seg2_start = BOUNDS[1][2], BOUNDS[2][2]
    # random access decrypts only the segments it touches (and always the final one)
    assert decrypter.read(tampered, 0, seg1_start) == m.plain[:seg1_start]
    last_start = BOUNDS[LAST][2]
    assert decrypter.read(tampered, last_start, 10) == m.plain[last_start : last_start + 10]
    for offset, length in (
        (seg1_start - 1, 2),
        (seg1_start, 1),
        (seg2_start - 1, 1),
        (0, PLAIN_SIZE),
    ):
        with pytest.raises(BundleIntegrityError):
            decrypter.read(tampered, offset, length)


def test_read_refuses_the_wrong_key_and_associated_data() -> None:
    ct = memoryview(material().ct)
    for dek, ad in ((OTHER_DEK, AD), (DEK, OTHER_AD)):
        with pytest.raises(BundleIntegrityError):
            SegmentDecrypter(dek, ad, SEG).read(ct, 0, 1)


def test_read_outside_the_plaintext_is_a_caller_error() -> None:
    decrypter = SegmentDecrypter(DEK, AD, SEG)
    ct = memoryview(material().ct)
    for offset, length in ((-1, 1), (0, -1), (PLAIN_SIZE, 1), (1, PLAIN_SIZE)):
        with pytest.raises(ValueError):
            decrypter.read(ct, offset, length)


def test_decrypt_into_needs_an_exact_output_buffer() -> None:
    decrypter = SegmentDecrypter(DEK, AD, SEG)
    for size in (PLAIN_SIZE - 1, PLAIN_SIZE + 1):
        with pytest.raises(ValueError):
            decrypter.decrypt_into(memoryview(material().ct), memoryview(bytearray(size)))


# --- properties -----------------------------------------------------------------------------


@st.composite
def segment_and_size(draw: st.DrawFn, max_segments: int = 4) -> tuple[int, int]:
    """A segment size and a plaintext size, biased to the edges of segments."""
    seg = draw(st.sampled_from(SEGMENT_SIZES))
    first, full = seg - HEADER_SIZE - TAG_SIZE, seg - TAG_SIZE
    k = draw(st.integers(1, max_segments - 1))
    edges = [
        0,
        1,
        seg - 1,
        seg,
        seg + 1,
        k * seg - 1,
        k * seg,
        k * seg + 1,
        first - 1,
        first,
        first + 1,
        first + k * full - 1,
        first + k * full,
        first + k * full + 1,
    ]
    size = draw(st.one_of(st.sampled_from(edges), st.integers(0, max_segments * seg)))
    return seg, size


@PROPERTY
@given(case=segment_and_size(), seed=st.integers(0, 2**32))
def test_round_trip(case: tuple[int, int], seed: int) -> None:
    seg, size = case
    plain = _random(seed, size)
    ct = encrypt(plain, segment_size=seg)

    assert len(ct) == ciphertext_size(size, seg)
    assert plaintext_size(len(ct), seg) == size
    got, seen = decrypt(ct, segment_size=seg)
    assert got == plain
    assert b"".join(seen) == plain
    assert len(seen) == len(segment_bounds(len(ct), seg))


@st.composite
def segment_and_any_size(draw: st.DrawFn) -> tuple[int, int]:
    seg = draw(
        st.one_of(st.sampled_from(SEGMENT_SIZES), st.integers(MIN_SEGMENT_SIZE, MAX_SEGMENT_SIZE))
    )
    first, full = seg - HEADER_SIZE - TAG_SIZE, seg - TAG_SIZE
    k = draw(st.integers(1, 1 << 20))
    size = draw(
        st.one_of(
            st.integers(0, 8 * seg),
            st.integers(0, 1 << 40),
            st.sampled_from([first, first + k * full]).flatmap(
                lambda edge: st.integers(max(0, edge - 2), edge + 2)
            ),
        )
    )
    return seg, size


@PROPERTY
@given(case=segment_and_any_size())
def test_sizes_are_inverse_and_only_produced_lengths_are_accepted(case: tuple[int, int]) -> None:
    seg, size = case
    cipher = ciphertext_size(size, seg)
    assert plaintext_size(cipher, seg) == size
    # ciphertext_size is strictly increasing, so every length strictly between two
    # consecutive produced lengths (a new segment starts: a gap of TAG_SIZE) is one no
    # encrypter makes
    following = ciphertext_size(size + 1, seg)
    assert following - cipher in (1, 1 + TAG_SIZE)
    for gap in range(cipher + 1, following):
        with pytest.raises(BundleIntegrityError) as info:
            plaintext_size(gap, seg)
        assert info.value.reason == "length"


@pytest.mark.parametrize("seg", [MIN_SEGMENT_SIZE, MIN_SEGMENT_SIZE + 1, 5000])
def test_plaintext_size_accepts_exactly_the_produced_lengths(seg: int) -> None:
    produced = {ciphertext_size(p, seg): p for p in range(4 * seg)}
    for cipher in range(max(produced) + 1):
        try:
            plain: int | None = plaintext_size(cipher, seg)
        except BundleIntegrityError:
            plain = None
        assert plain == produced.get(cipher), cipher


@PROPERTY
@given(case=segment_and_size(), seed=st.integers(0, 2**32), data=st.data())
def test_random_read_equals_the_plaintext_slice(
    case: tuple[int, int], seed: int, data: st.DataObject
) -> None:
    seg, size = case
    plain = _random(seed, size)
    ct = memoryview(encrypt(plain, segment_size=seg))
    offset = data.draw(st.integers(0, size), label="offset")
    length = data.draw(st.integers(0, size - offset), label="length")

    got = SegmentDecrypter(DEK, AD, seg).read(ct, offset, length)

    assert got == plain[offset : offset + length]
