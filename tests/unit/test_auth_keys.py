"""gateway/access/auth: API key text (shape, checksum, scanner pattern), secret HMAC, pepper file,
and the Principal value."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import zlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.access.auth import (
    SCANNER_PATTERN,
    AuthConfigError,
    AuthenticationFailed,
    MalformedKey,
    Principal,
    default_pepper_path,
    generate_api_key,
    load_or_create_pepper,
    parse_api_key,
)
from gateway.access.auth.apikeys import ALPHABET, api_key_checksum, is_key_id, secret_digest

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _key(key_id: str, secret: str) -> str:
    body = f"ag_{key_id}_{secret}"
    return f"{body}_{api_key_checksum(body)}"


VALID = _key("AbCdEfGh1234", "x" * 32)


# ---- shape and round trip -------------------------------------------------------------------


def test_generated_key_round_trips() -> None:
    text = generate_api_key()
    key_id, secret = parse_api_key(text)
    assert len(text) == 55
    assert text == f"ag_{key_id}_{secret}_{text[-6:]}"
    assert len(key_id) == 12 and len(secret) == 32
    assert set(key_id + secret) <= set(BASE62)
    assert is_key_id(key_id)


def test_generated_keys_differ() -> None:
    keys = {generate_api_key() for _ in range(200)}
    assert len(keys) == 200
    assert len({parse_api_key(k)[0] for k in keys}) == 200


def test_alphabet_is_url_safe_base62_without_underscore() -> None:
    assert ALPHABET == BASE62


def test_checksum_known_answer() -> None:
    """Pinned so that scanners written from the documentation agree with the gateway."""
    body = "ag_" + "0" * 12 + "_" + "0" * 32
    assert zlib.crc32(body.encode()) == 996072290
    assert api_key_checksum(body) == "15PPu6"
    assert api_key_checksum("ag_AbCdEfGh1234_" + "x" * 32) == "08Nm7m"


def _independent_checksum(body: str) -> str:
    value = zlib.crc32(body.encode("ascii"))
    out = ""
    for _ in range(6):
        value, digit = divmod(value, 62)
        out = BASE62[digit] + out
    return out


@given(st.text(BASE62, min_size=12, max_size=12), st.text(BASE62, min_size=32, max_size=32))
def test_checksum_matches_the_documented_rule(key_id: str, secret: str) -> None:
    text = _key(key_id, secret)
    assert text[-6:] == _independent_checksum(text[:-7])
    assert parse_api_key(text) == (key_id, secret)


def test_scanner_pattern_finds_keys_in_text() -> None:
    keys = [generate_api_key() for _ in range(3)]
    blob = f"export OPENAI_API_KEY={keys[0]}\nAuthorization: Bearer {keys[1]}\n'{keys[2]}',"
    assert re.findall(SCANNER_PATTERN, blob) == keys
    assert re.findall(SCANNER_PATTERN, "ag_short_key_abc") == []
    assert re.findall(SCANNER_PATTERN, "x" + keys[0]) == []  # part of a longer word


# ---- malformations --------------------------------------------------------------------------

MALFORMED = {
    "empty": "",
    "plain word": "password",
    "openai style": "sk-" + "a" * 52,
    "wrong prefix": "ak" + VALID[2:],
    "upper prefix": "AG" + VALID[2:],
    "no prefix": VALID[3:],
    "missing checksum": VALID[:-7],
    "checksum only cut": VALID[:-1],
    "extra char": VALID + "0",
    "leading space": " " + VALID[:-1],
    "trailing newline": VALID[:-1] + "\n",
    "id too short": "ag_" + "A" * 11 + "_" + "x" * 33 + "_" + VALID[-6:],
    "id too long": "ag_" + "A" * 13 + "_" + "x" * 31 + "_" + VALID[-6:],
    "dash in secret": VALID[:20] + "-" + VALID[21:],
    "underscore moved": "ag_AbCdEfGh123_4" + VALID[16:],
    "non-ascii digit": "ag_AbCdEfGh123\u0664" + VALID[15:],
    "non-ascii letter": "ag_AbCdEfGh123\u00e9" + VALID[15:],
    "wrong checksum": VALID[:-6] + ("000000" if VALID[-6:] != "000000" else "000001"),
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_keys_are_rejected(text: str) -> None:
    with pytest.raises(MalformedKey) as info:
        parse_api_key(text)
    assert info.value.reason == "malformed_key"
    assert isinstance(info.value, AuthenticationFailed)
    assert str(info.value) == "authentication failed"  # never the key itself


def test_lengths_of_the_malformation_table_are_as_intended() -> None:
    assert len(VALID) == 55
    same_length = ("id too short", "id too long", "dash in secret", "underscore moved")
    for name in (*same_length, "non-ascii digit", "non-ascii letter"):
        assert len(MALFORMED[name]) == 55, name


@given(
    key_id=st.text(BASE62, min_size=12, max_size=12),
    secret=st.text(BASE62, min_size=32, max_size=32),
    position=st.integers(min_value=0, max_value=54),
    replacement=st.characters(codec="utf-8"),
)
def test_checksum_catches_every_single_character_change(
    key_id: str, secret: str, position: int, replacement: str
) -> None:
    text = _key(key_id, secret)
    if text[position] == replacement:
        replacement = "1" if replacement == "0" else "0"
    changed = text[:position] + replacement + text[position + 1 :]
    with pytest.raises(MalformedKey):
        parse_api_key(changed)


@given(
    key_id=st.text(BASE62, min_size=12, max_size=12),
    secret=st.text(BASE62, min_size=32, max_size=32),
    position=st.integers(min_value=0, max_value=53),
)
def test_checksum_catches_adjacent_swaps(key_id: str, secret: str, position: int) -> None:
    text = _key(key_id, secret)
    if text[position] == text[position + 1]:
        return
    swapped = text[:position] + text[position + 1] + text[position] + text[position + 2 :]
    with pytest.raises(MalformedKey):
        parse_api_key(swapped)


# ---- secret HMAC ----------------------------------------------------------------------------


def test_secret_digest_is_hmac_sha256_of_the_secret_with_the_pepper() -> None:
    pepper = bytes(range(32))
    expected = hmac.new(pepper, b"s" * 32, hashlib.sha256).hexdigest()
    assert secret_digest(pepper, "s" * 32) == expected
    assert secret_digest(bytes(32), "s" * 32) != expected


# ---- pepper file ----------------------------------------------------------------------------


def test_pepper_file_is_created_private_and_random(tmp_path: Path) -> None:
    path = tmp_path / "data" / "api-key-pepper"
    pepper = load_or_create_pepper(path)
    assert len(pepper) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes() == pepper
    assert load_or_create_pepper(tmp_path / "other") != pepper
    assert [p.name for p in path.parent.iterdir()] == ["api-key-pepper"]  # no temp file left


def test_default_pepper_path_is_in_the_data_dir_keys(tmp_path: Path) -> None:
    path = default_pepper_path(tmp_path)
    assert path.parent == tmp_path / "keys"
    assert len(load_or_create_pepper(path)) == 32


def test_pepper_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "pepper"
    first = load_or_create_pepper(path)
    before = path.stat()
    assert load_or_create_pepper(path) == first
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_existing_pepper_file_is_used_as_is(tmp_path: Path) -> None:
    path = tmp_path / "pepper"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"p" * 32)
    os.close(fd)
    assert load_or_create_pepper(path) == b"p" * 32


def test_pepper_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pepper"
    load_or_create_pepper(path)
    path.chmod(0o644)
    with pytest.raises(AuthConfigError, match="chmod 600"):
        load_or_create_pepper(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # left alone, not replaced


def test_pepper_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pepper"
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(AuthConfigError, match="32 bytes"):
        load_or_create_pepper(path)
    assert path.read_bytes() == b"short"


# ---- Principal ------------------------------------------------------------------------------


def test_principal_is_frozen_and_encodes() -> None:
    principal = Principal(
        key_id="AbCdEfGh1234", method="api_key", team="search", roles=frozenset({"app"})
    )
    with pytest.raises(AttributeError):
        principal.team = "other"  # type: ignore[misc]
    decoded = msgspec.json.decode(msgspec.json.encode(principal), type=Principal)
    assert decoded == principal
    assert hash(decoded) == hash(principal)
