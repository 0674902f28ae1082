"""The server pepper: 32 secret bytes keyed into every API key's stored HMAC (and, derived, the
prefix-cache salts and the audit chain ids).  Replacing it invalidates every key.

One node keeps it in a 0600 file in the data dir, created once and never overwritten.  Replicas
must share one pepper, so there it is given from outside (`gateway.access.secrets` decides
which source): a mounted secret file, or a variable holding its text.  Both take the same
forms: the 32 raw bytes (so a node's own file can be moved into a Secret as it is), or their
hex (64 digits, `openssl rand -hex 32`) or base64 (`openssl rand -base64 32`) text.  An error
names the file or the variable, never the value.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import stat
from pathlib import Path

from .errors import AuthConfigError

__all__ = [
    "PEPPER_BYTES",
    "default_pepper_path",
    "load_or_create_pepper",
    "pepper_from_text",
    "read_pepper_file",
]

PEPPER_BYTES = 32
_TEXT_FORMS = "64 hex digits or base64 of 32 random bytes (`openssl rand -hex 32`)"


def default_pepper_path(data_dir: str | Path) -> Path:
    """Where the pepper lives unless configured: next to the other keys in the data dir."""
    return Path(data_dir) / "keys" / "api-key-pepper"


def _from_text(data: bytes) -> bytes | None:
    """The pepper written as hex or base64 (either alphabet, padding optional), or None.  The
    two differ in length (64 and 43-44 characters), so neither is mistaken for the other."""
    text = data.strip()
    try:
        if len(text) == 2 * PEPPER_BYTES:
            value = bytes.fromhex(text.decode("ascii"))
        else:
            text = text.replace(b"-", b"+").replace(b"_", b"/") + b"=" * (-len(text) % 4)
            value = base64.b64decode(text, validate=True)
    except ValueError:  # not ASCII, not hex, not base64 (binascii.Error is a ValueError)
        return None
    return value if len(value) == PEPPER_BYTES else None


def pepper_from_text(text: str, variable: str) -> bytes:
    """The pepper in the value of environment variable `variable`: hex or base64 only (32
    characters taken raw would be a password, not 32 random bytes)."""
    value = _from_text(text.encode("utf-8", "replace"))
    if value is None:
        raise AuthConfigError(f"${variable} must hold the pepper as {_TEXT_FORMS}")
    return value


def read_pepper_file(path: Path, *, mounted: bool = False) -> bytes:
    """The pepper in `path`.  FileNotFoundError when there is none (the caller decides whether
    to create it).  The data dir's own file must be 0600; a `mounted` secret file may also be
    readable by its group (Kubernetes gives a Secret volume's files to the pod's `fsGroup`,
    0440), never by others."""
    refused = 0o007 if mounted else 0o077
    if stat.S_IMODE(path.stat().st_mode) & refused:
        fix = "chmod 400 it (a Secret volume: defaultMode 0400)" if mounted else "chmod 600 it"
        raise AuthConfigError(f"pepper file {path} is readable by others; {fix}")
    data = path.read_bytes()
    value = data if len(data) == PEPPER_BYTES else _from_text(data)
    if value is None:
        raise AuthConfigError(
            f"pepper file {path} does not hold {PEPPER_BYTES} bytes (raw, or as {_TEXT_FORMS})"
        )
    return value


def load_or_create_pepper(path: str | Path) -> bytes:
    """The pepper in `path`, creating the file (mode 0600, directory 0700) if it is missing.
    Only for the data dir's own file: a configured one that is missing is an error.

    An existing file is never replaced, even by a concurrent first start: the new file is
    written aside and linked into place, which fails if another process got there first.
    """
    path = Path(path)
    try:
        return read_pepper_file(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(PEPPER_BYTES))
            f.flush()
            os.fsync(f.fileno())
        # another process may have created it meanwhile: then theirs is the pepper
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return read_pepper_file(path)
