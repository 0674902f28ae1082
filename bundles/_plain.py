"""Homes for decrypted weights that are never persistent disk.

- One file (GGUF): an anonymous `memfd`, sealed read-only once written and checked, handed to
  the engine as `/proc/self/fd/N`.
- A directory (safetensors for vLLM): a private 0700 directory on a tmpfs (the user's runtime
  dir, else /dev/shm), removed as soon as the engine has loaded.

Both are written through a writable shared mapping; `abandon()` zeroes what was written before
letting go, so a failed load leaves no plaintext behind in memory the kernel hands out later.
Pages of either can still be swapped: run with swap off or encrypted (see README).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import tempfile
from pathlib import Path

from .errors import BundleError

__all__ = ["MemfdFile", "PrivateTmpfsDir", "WritableMap"]

_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


class WritableMap:
    """A shared writable mapping of `size` bytes of `fd` (nothing mapped for size 0)."""

    def __init__(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED) if size else None
        self.view = memoryview(self._map) if self._map is not None else memoryview(bytearray())

    def close(self, *, wipe: bool) -> None:
        if wipe and self._map is not None:
            step = 1 << 20
            zeros = bytes(step)
            for start in range(0, len(self.view), step):
                end = min(start + step, len(self.view))
                self.view[start:end] = zeros[: end - start]
        self.view.release()
        if self._map is not None:
            self._map.close()
            self._map = None


class MemfdFile:
    """A sealed in-memory file for one decrypted model file."""

    def __init__(self, name: str, size: int) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            self.map = WritableMap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def seal(self) -> None:
        """No more writes, growth or shrinking by anyone holding the fd (unmaps first)."""
        self.map.close(wipe=False)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)

    def abandon(self) -> None:
        self.map.close(wipe=True)
        os.close(self.fd)

    def close(self) -> None:
        self.map.close(wipe=False)
        os.close(self.fd)


def _tmpfs_mounts() -> set[str]:
    mounts: set[str] = set()
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "tmpfs":
                    mounts.add(parts[1].replace("\\040", " "))
    except OSError:
        pass
    return mounts


def _tmpfs_root() -> Path:
    mounts = _tmpfs_mounts()
    for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if candidate and os.path.isdir(candidate):
            resolved = os.path.realpath(candidate)
            if resolved in mounts:
                return Path(resolved)
    raise BundleError(
        "no tmpfs found for decrypted weights (tried $XDG_RUNTIME_DIR and /dev/shm); "
        "refusing to write plaintext to persistent disk"
    )


class PrivateTmpfsDir:
    """A 0700 directory on a tmpfs whose files are created 0600 and mapped for writing."""

    def __init__(self, root: Path | None = None) -> None:
        base = root if root is not None else _tmpfs_root()
        self.path = Path(tempfile.mkdtemp(prefix="airgate-model-", dir=base))
        os.chmod(self.path, 0o700)
        self._maps: list[WritableMap] = []

    def create(self, relative: str, size: int) -> WritableMap:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            writable = WritableMap(fd, size)
        finally:
            os.close(fd)
        self._maps.append(writable)
        return writable

    def finish(self) -> None:
        for writable in self._maps:
            writable.close(wipe=False)
        self._maps.clear()

    def abandon(self) -> None:
        for writable in self._maps:
            writable.close(wipe=True)
        self._maps.clear()
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
