"""The server pepper: 32 random bytes in a 0600 file in the data dir, keyed into every API key's
stored HMAC.  Created once and never overwritten: replacing it invalidates every key."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from .errors import AuthConfigError

__all__ = ["PEPPER_BYTES", "default_pepper_path", "load_or_create_pepper"]

PEPPER_BYTES = 32


def default_pepper_path(data_dir: str | Path) -> Path:
    """Where the pepper lives unless configured: next to the other keys in the data dir."""
    return Path(data_dir) / "keys" / "api-key-pepper"


def _read(path: Path) -> bytes:
    st = path.stat()
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise AuthConfigError(f"pepper file {path} is readable by others; chmod 600 it")
    data = path.read_bytes()
    if len(data) != PEPPER_BYTES:
        raise AuthConfigError(f"pepper file {path} does not hold {PEPPER_BYTES} bytes")
    return data


def load_or_create_pepper(path: str | Path) -> bytes:
    """The pepper in `path`, creating the file (mode 0600, directory 0700) if it is missing.

    An existing file is never replaced, even by a concurrent first start: the new file is
    written aside and linked into place, which fails if another process got there first.
    """
    path = Path(path)
    try:
        return _read(path)
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
    return _read(path)
