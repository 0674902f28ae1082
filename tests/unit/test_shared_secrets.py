"""Where the API key pepper comes from: `$AIRGATE_PEPPER`, a mounted `[auth] pepper_file`, or
(a single node) the data dir's own file.  A given pepper is never written to the data dir; a
configured one that is missing or malformed stops the start; no error repeats the value."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from gateway.access.auth import default_pepper_path
from gateway.access.secrets import load_pepper, secret_path
from gateway.config import ConfigError, Settings, load_settings

PEPPER = bytes(range(100, 132))


def settings(data_dir: Path, pepper_file: str = "") -> Settings:
    raw = {"data_dir": str(data_dir), "auth.pepper_file": pepper_file or None}
    return load_settings(None, environ={}, overrides=raw)


def write_secret(path: Path, data: bytes, mode: int = 0o400) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def refused(s: Settings, environ: dict[str, str], *, create: bool = True) -> str:
    with pytest.raises(ConfigError) as caught:
        load_pepper(s, environ, create=create)
    error = caught.value  # no chained exception that could carry the text along
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    return str(caught.value)


# ---- the environment variable -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        PEPPER.hex(),
        PEPPER.hex().upper(),
        base64.b64encode(PEPPER).decode(),
        base64.urlsafe_b64encode(PEPPER).decode().rstrip("="),  # url-safe, no padding
        f"  {PEPPER.hex()}\n",  # a Secret made from a file ending in a newline
    ],
    ids=["hex", "HEX", "base64", "base64url-unpadded", "surrounding-space"],
)
def test_the_variable_gives_the_pepper_and_nothing_is_written(tmp_path: Path, text: str) -> None:
    assert load_pepper(settings(tmp_path / "data"), {"AIRGATE_PEPPER": text}) == PEPPER
    assert not (tmp_path / "data").exists()  # not even the keys directory


@pytest.mark.parametrize(
    "text",
    [
        "",
        PEPPER.hex()[:-2],  # 31 bytes
        PEPPER.hex() + "ab",  # 33 bytes
        "zz" + PEPPER.hex()[2:],  # 64 characters, not hex
        base64.b64encode(PEPPER[:16]).decode(),  # 16 bytes
        base64.b64encode(PEPPER + b"x").decode(),  # 33 bytes
        "correct horse battery staple 32!",  # 32 characters: a password, not 32 random bytes
        "é" * 44,
    ],
    ids=["empty", "hex-31", "hex-33", "not-hex", "base64-16", "base64-33", "raw-32", "non-ascii"],
)
def test_a_malformed_variable_is_refused_by_name_never_by_value(tmp_path: Path, text: str) -> None:
    message = refused(settings(tmp_path / "data"), {"AIRGATE_PEPPER": text})
    assert "$AIRGATE_PEPPER" in message and "hex" in message and "base64" in message
    for part in (text, text.strip()[:8], text.strip()[-8:]):
        assert not part.strip() or part not in message
    assert not (tmp_path / "data").exists()


def test_the_variable_and_a_pepper_file_together_are_refused(tmp_path: Path) -> None:
    mounted = write_secret(tmp_path / "secret" / "pepper", PEPPER)
    message = refused(settings(tmp_path / "data", str(mounted)), {"AIRGATE_PEPPER": PEPPER.hex()})
    assert "$AIRGATE_PEPPER" in message and "[auth] pepper_file" in message
    assert PEPPER.hex() not in message


def test_the_variable_is_not_an_unknown_configuration_variable(tmp_path: Path) -> None:
    loaded = load_settings(None, environ={"AIRGATE_PEPPER": PEPPER.hex()})
    assert "pepper" not in repr(loaded).lower().replace("pepper_file", "")  # not in settings


# ---- a mounted file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "mode"),
    [
        (PEPPER, 0o400),  # a node's own file, moved into a Secret as it is
        (PEPPER.hex().encode() + b"\n", 0o400),  # `openssl rand -hex 32 > pepper`
        (base64.b64encode(PEPPER) + b"\n", 0o440),  # a Secret volume with an fsGroup
    ],
    ids=["raw-0400", "hex-0400", "base64-0440"],
)
def test_a_mounted_file_gives_the_pepper_and_nothing_is_written(
    tmp_path: Path, content: bytes, mode: int
) -> None:
    mounted = write_secret(tmp_path / "secret" / "pepper", content, mode)
    assert load_pepper(settings(tmp_path / "data", str(mounted)), {}) == PEPPER
    assert not (tmp_path / "data").exists()
    assert mounted.read_bytes() == content


def test_a_configured_pepper_file_that_is_missing_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "secret" / "pepper"
    message = refused(settings(tmp_path / "data", str(missing)), {})
    assert str(missing) in message and "does not exist" in message
    assert not missing.exists() and not missing.parent.exists()  # never minted
    assert not (tmp_path / "data").exists()


def test_a_mounted_file_readable_by_everyone_is_refused(tmp_path: Path) -> None:
    mounted = write_secret(tmp_path / "pepper", PEPPER.hex().encode(), 0o444)
    message = refused(settings(tmp_path / "data", str(mounted)), {})
    assert "readable by others" in message and "defaultMode 0400" in message
    assert PEPPER.hex() not in message


def test_a_mounted_file_of_the_wrong_size_is_refused_without_its_content(tmp_path: Path) -> None:
    content = PEPPER.hex()[:40]
    mounted = write_secret(tmp_path / "pepper", content.encode())
    message = refused(settings(tmp_path / "data", str(mounted)), {})
    assert str(mounted) in message and "32 bytes" in message
    assert content not in message and content[:8] not in message


def test_a_mounted_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "pepper"
    directory.mkdir(mode=0o700)
    message = refused(settings(tmp_path / "data", str(directory)), {})
    assert "cannot be read" in message


def test_a_systemd_credential_is_found_in_the_credentials_directory(tmp_path: Path) -> None:
    write_secret(tmp_path / "credentials" / "pepper", PEPPER)
    s = settings(tmp_path / "data", "${CREDENTIALS_DIRECTORY}/pepper")
    environ = {"CREDENTIALS_DIRECTORY": str(tmp_path / "credentials")}
    assert load_pepper(s, environ) == PEPPER
    assert secret_path("/run/secrets/pepper", environ) == Path("/run/secrets/pepper")
    message = refused(s, {})  # not under systemd, or no LoadCredential=
    assert "$CREDENTIALS_DIRECTORY is not set" in message


# ---- a single node: the data dir's own file ---------------------------------------------------


def test_with_neither_a_single_node_creates_its_own_private_pepper(tmp_path: Path) -> None:
    s = settings(tmp_path / "data")
    pepper = load_pepper(s, {})
    path = default_pepper_path(s.data_dir)
    assert path.read_bytes() == pepper and len(pepper) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_pepper(s, {}) == pepper  # the same one at every start


def test_commands_that_must_not_mint_one_say_where_it_would_come_from(tmp_path: Path) -> None:
    s = settings(tmp_path / "data")
    message = refused(s, {}, create=False)
    assert "$AIRGATE_PEPPER" in message and "[auth] pepper_file" in message
    assert not default_pepper_path(s.data_dir).exists()
    assert load_pepper(s, {"AIRGATE_PEPPER": PEPPER.hex()}, create=False) == PEPPER


def test_the_data_dir_file_stays_strictly_private(tmp_path: Path) -> None:
    s = settings(tmp_path / "data")
    load_pepper(s, {})
    path = default_pepper_path(s.data_dir)
    os.chmod(path, 0o640)  # what a mounted file may be, the data dir's own may not
    assert "chmod 600" in refused(s, {})
