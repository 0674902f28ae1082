"""The data directory check: who owns it, who may write it, and who may read its secrets.

Secrets are the files an attacker who reads them could use: everything in `keys/` (the API key
pepper, the bundle signing key, the local KMS key file that unwraps every bundle's data key,
the audit signing key) but public keys (`*.pub`), and every file at the top of the data
directory (the database with the API key HMACs and the audit log, an `initial-admin-key` a
first start left behind); plus the key files and the pepper file configured elsewhere.

A file is exposed to a class of users (group, others) when its mode lets them read or write it
*and* every directory from the data directory down lets them in: a 0644 database in a 0700
data directory is private.  Secret files outside the data directory are judged by their own
mode.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

from ..access.audit_signer import default_audit_key_file
from ..access.auth import default_pepper_path
from ..access.secrets import secret_path
from ..config import ConfigError, Settings
from ..engines.key_providers import local_key_file
from ..engines.sources import signing_key_file
from .result import Finding, failed, passed

__all__ = ["check_data_dir", "secret_files"]

_CLASSES = (("group", 3), ("others", 0))  # (who, shift of their rwx bits)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _sqlite_files(settings: Settings) -> list[Path]:
    """The SQLite database and its WAL files, when the database is a file (the default)."""
    url = settings.audit.database_url
    if url and not url.startswith("sqlite"):
        return []
    db = Path(url.split(":///", 1)[1]) if url else Path(settings.data_dir) / "airgate.db"
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def secret_files(settings: Settings) -> list[Path]:
    """Every secret file this configuration uses that exists (see the module)."""
    root = Path(settings.data_dir).resolve()
    found: list[Path] = []
    if root.is_dir():
        found += [p for p in sorted(root.iterdir()) if p.is_file()]
    keys = root / "keys"
    if keys.is_dir():
        found += [p for p in sorted(keys.rglob("*")) if p.is_file() and p.suffix != ".pub"]
    candidates = [
        *_sqlite_files(settings),
        local_key_file(settings),
        signing_key_file(settings),
        default_pepper_path(root),
    ]
    if settings.audit.signer.provider == "local":
        candidates.append(Path(settings.audit.signer.key_ref or default_audit_key_file(settings)))
    if settings.auth.pepper_file:
        # an unset $CREDENTIALS_DIRECTORY: the keys check says so
        with contextlib.suppress(ConfigError):
            candidates.append(secret_path(settings.auth.pepper_file))
    for path in (p.resolve() for p in candidates):
        if path.is_file() and path not in found:
            found.append(path)
    return found


def _exposed_to(path: Path, root: Path) -> list[str]:
    """Who besides the owner can read or write `path`: "group" and/or "others"."""
    mode = stat.S_IMODE(path.stat().st_mode)
    inside = root in path.parents
    directories = [root, *reversed(path.relative_to(root).parents[:-1])] if inside else []
    dir_modes = [stat.S_IMODE((root / d).stat().st_mode) for d in directories]
    exposed = []
    for who, shift in _CLASSES:
        touches = mode & (0o6 << shift)
        enters = all(m & (0o1 << shift) for m in dir_modes)
        if touches and enters:
            exposed.append(who)
    return exposed


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if root in path.parents else str(path)


def check_data_dir(settings: Settings) -> Finding:
    """The data directory exists, belongs to this user, is writable by no one else, and no
    one else can read or write its secrets."""
    root = Path(settings.data_dir).resolve()
    try:
        st = root.stat()
    except FileNotFoundError:
        return failed(
            f"{root} does not exist: start `airgate serve` once (it creates the data "
            "directory, mode 0700), then run the selftest again"
        )
    if not stat.S_ISDIR(st.st_mode):
        return failed(f"{root} is not a directory: point --data-dir at a directory")
    me = os.geteuid()
    problems: list[str] = []
    if st.st_uid != me:
        problems.append(
            f"{root} belongs to {_user(st.st_uid)}, not to {_user(me)} who runs airgate: "
            f"chown {_user(me)} {root}"
        )
    for directory in (root, root / "keys", root / "bundles", root / "bundles" / "imported"):
        if directory.is_dir():
            mode = stat.S_IMODE(directory.stat().st_mode)
            if mode & 0o022:
                problems.append(
                    f"{_shown(directory, root) if directory != root else root} is writable by "
                    f"{'group' if mode & 0o020 else 'others'} (mode {mode:04o}): chmod 700 it"
                )
    secrets = secret_files(settings)
    for path in secrets:
        if path.stat().st_uid != me:
            problems.append(
                f"{_shown(path, root)} belongs to {_user(path.stat().st_uid)}: chown it to "
                f"{_user(me)}"
            )
        exposed = _exposed_to(path, root)
        if exposed:
            problems.append(
                f"{_shown(path, root)} can be read or written by {' and '.join(exposed)}: "
                f"chmod 600 it (or chmod 700 {root})"
            )
    if problems:
        return failed("; ".join(problems))
    return passed(
        f"{root} (mode {stat.S_IMODE(st.st_mode):04o}, owner {_user(me)}); "
        f"{len(secrets)} secret files private"
    )
