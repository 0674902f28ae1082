"""Where a bundle's bytes live: a directory or one uncompressed tar of it.

    <bundle>/manifest.json        canonical JSON, signed
    <bundle>/manifest.sig         Ed25519 signature of manifest.json
    <bundle>/data/<path>.enc      one encrypted file per model file

Payloads are exposed as read-only memory maps (of the file, or of the member's span inside the
tar), so digesting and decrypting never copy ciphertext through Python.
"""

from __future__ import annotations

import io
import mmap
import os
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from .errors import BundleFormatError, BundleIntegrityError

__all__ = ["MANIFEST", "SIGNATURE", "BundleStore", "payload_name", "write_tar"]

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
_SMALL_LIMIT = 1 << 20  # manifest and signature are a few KiB


def payload_name(path: str) -> str:
    return f"data/{path}.enc"


class BundleStore:
    """Read access to one bundle; `BundleStore.open(path)` picks directory or tar."""

    def __init__(self, root: Path, members: dict[str, tuple[int, int]] | None) -> None:
        self.root = root
        self._tar_members = members  # name -> (offset, size) inside the tar; None: a directory

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> BundleStore:
        root = Path(path)
        if root.is_dir():
            return cls(root, None)
        if not root.is_file():
            raise BundleFormatError(f"{root} is neither a bundle directory nor a bundle tar")
        return cls(root, _index_tar(root))

    @property
    def is_tar(self) -> bool:
        return self._tar_members is not None

    def names(self) -> set[str]:
        """Every regular file in the bundle (relative, '/'-separated)."""
        if self._tar_members is not None:
            return set(self._tar_members)
        return {
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file() or p.is_symlink()
        }

    def size(self, name: str) -> int | None:
        if self._tar_members is not None:
            member = self._tar_members.get(name)
            return None if member is None else member[1]
        path = self._file(name)
        return path.stat().st_size if path.is_file() else None

    def read_small(self, name: str) -> bytes | None:
        """A small member's bytes, or None when absent."""
        size = self.size(name)
        if size is None:
            return None
        if size > _SMALL_LIMIT:
            raise BundleFormatError(f"{name} is too large")
        with self.map(name) as view:
            return bytes(view)

    @contextmanager
    def map(self, name: str) -> Iterator[memoryview]:
        """A read-only memoryview of a member's bytes (released on exit)."""
        if self._tar_members is not None:
            if name not in self._tar_members:
                raise BundleFormatError(f"{name} is missing from the bundle")
            offset, size = self._tar_members[name]
            file = self.root
        else:
            file, offset = self._file(name), 0
            if not file.is_file() or file.is_symlink():
                raise BundleFormatError(f"{name} is missing from the bundle")
            size = file.stat().st_size
        if size == 0:
            yield memoryview(b"")
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with open(file, "rb") as f:
            length = size + offset - start
            mapped = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=start)
        try:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            part = view[offset - start : offset - start + size]
            try:
                yield part
            finally:
                part.release()
                view.release()
        finally:
            mapped.close()

    def _file(self, name: str) -> Path:
        path = self.root / name
        if self.root.resolve() not in path.resolve().parents:
            raise BundleFormatError(f"{name} lies outside the bundle")
        return path


def _index_tar(path: Path) -> dict[str, tuple[int, int]]:
    """Member name -> (data offset, size) of an uncompressed tar holding only regular files."""
    members: dict[str, tuple[int, int]] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for info in tar:
                name = info.name.removeprefix("./")
                if info.isdir():
                    continue
                if not info.isreg():
                    raise BundleFormatError(f"bundle tar member {name} is not a regular file")
                if name.startswith("/") or ".." in name.split("/"):
                    raise BundleFormatError(f"bundle tar member {name} has an unsafe path")
                if name in members:
                    raise BundleIntegrityError("duplicate tar member")
                members[name] = (info.offset_data, info.size)
    except tarfile.ReadError:
        raise BundleFormatError(
            f"{path} is not an uncompressed tar (bundles are never compressed)"
        ) from None
    if os.path.getsize(path) < max((o + s for o, s in members.values()), default=0):
        raise BundleIntegrityError("tar truncated")
    return members


class _Counting(io.RawIOBase):
    """A file read through, reporting bytes to a progress callback (for `tar.addfile`)."""

    def __init__(self, file: BinaryIO, report: Callable[[int], None]) -> None:
        self._file, self._report = file, report

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)  # type: ignore[attr-defined]
        self._report(n)
        return int(n)


def write_tar(
    source_dir: Path, target: Path, progress: Callable[[str, int, int], None] | None = None
) -> None:
    """Pack a bundle directory into one tar (pax, sorted, no owner names)."""
    files = sorted(p for p in source_dir.rglob("*") if p.is_file())
    total = sum(f.stat().st_size for f in files)
    with tarfile.open(target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in files:
            info = tar.gettarinfo(file, arcname=file.relative_to(source_dir).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            with file.open("rb") as f:
                if progress is None:
                    tar.addfile(info, f)
                else:
                    reader = _Counting(f, lambda n: progress("pack tar", n, total))
                    tar.addfile(info, io.BufferedReader(reader))
