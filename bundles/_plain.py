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

import ctypes
import fcntl
import mmap
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ._crypto.stream import wipe as zero
from .errors import BundleError

__all__ = ["MemfdFile", "PlainTarget", "PrivateTmpfsDir", "WritableMap"]

_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


_CHUNK = 16 << 20


class WritableMap:
    """A shared writable mapping of `size` bytes of `fd` (nothing mapped for size 0).

    `populate()` (on a worker thread) allocates and maps the pages ahead of the writer, 16 MiB
    per system call, the last chunk first (the final segment is decrypted first); the writer
    calls `wait_ready(start, end)` before writing a range.  Faulting 60,000 pages in one by one
    while decrypting runs at a third of the speed.
    """

    def __init__(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED) if size else None
        self.view = memoryview(self._map) if self._map is not None else memoryview(bytearray())
        self._tail = max(0, size - _CHUNK)  # [tail, size) is populated first
        self._ready_to = 0  # then [0, ready_to)
        self._tail_ready = size == 0
        self._cond = threading.Condition()
        self._cancelled = False
        self._started = False

    def populate(self) -> None:
        """Allocate every page now.  Through ctypes, which releases the GIL (Python's
        mmap(MAP_POPULATE) holds it), so this overlaps the loader's ciphertext digest.  On
        kernels without MADV_POPULATE_WRITE (before 5.14) pages simply fault in on write."""
        with self._cond:
            self._started = True
        try:
            if self._map is None:
                return
            anchor = ctypes.c_char.from_buffer(self._map)
            try:
                base = ctypes.addressof(anchor)
                size = len(self._map)
                _libc.madvise(base + self._tail, size - self._tail, _MADV_POPULATE_WRITE)
                with self._cond:
                    self._tail_ready = True
                    self._cond.notify_all()
                for start in range(0, self._tail, _CHUNK):
                    if self._cancelled:
                        return
                    length = min(_CHUNK, self._tail - start)
                    _libc.madvise(base + start, length, _MADV_POPULATE_WRITE)
                    with self._cond:
                        self._ready_to = start + length
                        self._cond.notify_all()
            finally:
                del anchor
        finally:
            with self._cond:
                self._tail_ready, self._ready_to = True, len(self.view)
                self._cond.notify_all()

    def cancel(self) -> None:
        """Stop `populate()` after its current chunk (the load failed)."""
        self._cancelled = True

    def wait_ready(self, start: int, end: int) -> None:
        """Block until [start, end) is populated; at once if no `populate()` has begun (the
        pages then fault in on write: populating is only ever a speed-up)."""
        with self._cond:
            if not self._started:
                return
            self._cond.wait_for(
                lambda: end <= self._ready_to or (start >= self._tail and self._tail_ready)
            )

    def close(self, *, wipe: bool) -> None:
        if wipe and self._map is not None:
            zero(self.view)
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
        try:
            self.map.close(wipe=True)
        finally:
            os.close(self.fd)

    def close(self) -> None:
        try:
            self.map.close(wipe=False)
        finally:
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
        try:
            for writable in self._maps:
                writable.close(wipe=True)
        finally:
            self._maps.clear()
            self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class PlainTarget:
    """The plaintext home of one bundle, allocated before decryption starts.

    A single-file model gets a memfd; a multi-file model a private tmpfs directory.  Allocating
    the pages is as slow as a digest, so the loader runs `populate()` on a worker thread while
    it checks digests, and decrypts right behind it.
    """

    def __init__(
        self,
        name: str,
        files: list[tuple[str, int]],
        *,
        single_file: bool,
        tmpfs_root: Path | None = None,
    ) -> None:
        self.memfd: MemfdFile | None = None
        self.tmpdir: PrivateTmpfsDir | None = None
        self.maps: dict[str, WritableMap] = {}
        try:
            if single_file:
                ((relative, size),) = files
                self.memfd = MemfdFile(name, size)
                self.maps[relative] = self.memfd.map
            else:
                self.tmpdir = PrivateTmpfsDir(tmpfs_root)
                for relative, size in files:
                    self.maps[relative] = self.tmpdir.create(relative, size)
        except BaseException:
            self.abandon()
            raise

    def populate(self) -> None:
        """Allocate every page (run on a worker thread; writers wait per range)."""
        for writable in self.maps.values():
            writable.populate()

    def cancel(self) -> None:
        for writable in self.maps.values():
            writable.cancel()

    @property
    def path(self) -> str:
        if self.memfd is not None:
            return self.memfd.path
        assert self.tmpdir is not None
        return str(self.tmpdir.path)

    def complete(self) -> None:
        """Writing is over: seal the memfd / unmap the tmpfs files."""
        self.maps.clear()
        if self.memfd is not None:
            self.memfd.seal()
        if self.tmpdir is not None:
            self.tmpdir.finish()

    def abandon(self) -> None:
        """Zero what was written and let go of everything."""
        self.maps.clear()
        memfd, tmpdir, self.memfd, self.tmpdir = self.memfd, self.tmpdir, None, None
        try:
            if memfd is not None:
                memfd.abandon()
        finally:
            if tmpdir is not None:
                tmpdir.abandon()
