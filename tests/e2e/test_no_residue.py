"""Serving a bundle leaves no plaintext weights on any file system, and serves them from memory.

The server runs on a fresh data dir (the sealed default bundle and its keys), with its own
TMPDIR and working directory.  While it runs, the weights must be mapped from a memfd that the
loader has already closed; after it stops, three 4 KiB windows of the GGUF must occur in no
file of the data dir, TMPDIR, working directory, /dev/shm or the system temp dir.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI
from server_process import (
    MODEL,
    NO_END,
    SERVER_ENV,
    Server,
    clean_env,
    free_port,
    seed_data_dir,
    serve_command,
    stop_and_check,
)

pytestmark = pytest.mark.e2e

WINDOW = 4096
SCAN_CHUNK = 16 << 20
SHM = Path("/dev/shm")
# A file the server wrote has a change time after its start; a coarse file-system clock may
# stamp it slightly before our `time.time()`.
CLOCK_SLACK_S = 2.0


@dataclass
class Run:
    server: Server
    tmpdir: Path
    cwd: Path
    started: float  # time.time() just before the server was spawned
    shm_before: set[str]
    open_memfds: list[str]  # /proc/<pid>/fd links to airgate memfds, once ready
    memfd_maps: list[str]  # /proc/<pid>/maps lines of airgate memfds, once ready


def airgate_memfds(pid: int) -> list[str]:
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        if target.startswith("/memfd:airgate"):
            links.append(target)
    return links


def airgate_maps(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line.rstrip() for line in f if "memfd:airgate" in line]


def shm_model_dirs() -> set[str]:
    return {p.name for p in SHM.glob("airgate-model-*")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Run]:
    """One served chat request on a fresh data dir, then a graceful stop."""
    root = tmp_path_factory.mktemp("no-residue")
    data_dir = seed_data_dir(root / "data", model_dir)
    tmpdir, cwd = root / "tmpdir", root / "cwd"
    tmpdir.mkdir()
    cwd.mkdir()
    shm_before = shm_model_dirs()
    started = time.time()
    port = free_port()
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            serve_command(port, data_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=clean_env({**SERVER_ENV, "TMPDIR": str(tmpdir)}),
            cwd=cwd,
        )
    server = Server(process, port, data_dir, log_path)
    try:
        server.wait_ready()
        open_memfds = airgate_memfds(process.pid)
        memfd_maps = airgate_maps(process.pid)
        with OpenAI(
            base_url=f"{server.base_url}/v1", api_key=server.key(), max_retries=0
        ) as client:
            result = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Describe the sea."}],
                max_tokens=8,
                temperature=0,
                logit_bias=NO_END,
            )
        assert result.usage is not None
        assert result.usage.completion_tokens == 8
    finally:
        stop_and_check(server)
    yield Run(server, tmpdir, cwd, started, shm_before, open_memfds, memfd_maps)


def test_weights_are_mapped_from_a_memfd_the_loader_has_closed(run: Run) -> None:
    assert run.open_memfds == [], "the loader still holds the decrypted model's memfd"
    assert run.memfd_maps, "the model is not mapped from an airgate memfd"
    assert any(f"memfd:airgate:{MODEL}" in line for line in run.memfd_maps), run.memfd_maps
    # read-only, shared: the engine's mapping of the sealed memfd
    assert all(line.split()[1].startswith("r-") for line in run.memfd_maps), run.memfd_maps


def windows(gguf_path: Path) -> list[bytes]:
    """Three distinct, non-trivial 4 KiB windows: the header, the middle and near the end."""
    size = gguf_path.stat().st_size
    found = []
    with gguf_path.open("rb") as f:
        for offset in (0, size // 2, size - 2 * WINDOW):
            f.seek(offset)
            found.append(f.read(WINDOW))
    assert found[0].startswith(b"GGUF")
    assert len(set(found)) == 3
    assert all(len(w) == WINDOW and len(set(w)) > 64 for w in found)
    return found


def contains_any(path: Path, needles: list[bytes]) -> bytes | None:
    """The first needle that occurs in the file (chunks overlap by one window), else None."""
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    with path.open("rb") as f:
        while chunk := f.read(SCAN_CHUNK):
            data = tail + chunk
            for needle in needles:
                if needle in data:
                    return needle
            tail = data[-overlap:]
    return None


def regular_files(root: Path, skip_dirs: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Regular files under `root` (no symlinks followed, unreadable directories skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip_dirs]
        for name in filenames:
            path = here / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    yield path
            except OSError:
                continue


def scanned_files(run: Run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every file the server could have written to.

    The data dir, its TMPDIR, its cwd and /dev/shm are scanned whole.  The system temp dir is
    shared with other sessions and tools on this machine: there only files created or changed
    since the server started count, and other pytest sessions' temp dirs are left out (they hold
    their own plaintext test artifacts; the server is never told about them).
    """
    yield from regular_files(run.server.data_dir)
    yield from regular_files(run.tmpdir)
    yield from regular_files(run.cwd)
    yield from regular_files(SHM)
    ours = tmp_path_factory.getbasetemp()
    sessions = ours.parent
    others = tuple(p for p in sessions.iterdir() if p.is_dir() and not p.is_symlink() and p != ours)
    since = run.started - CLOCK_SLACK_S
    for path in regular_files(Path(tempfile.gettempdir()), skip_dirs=others):
        try:
            st = path.lstat()
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) >= since:
            yield path


def test_no_plaintext_weights_left_anywhere(
    run: Run, gguf_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    needles = windows(gguf_path)
    # the control: the scan finds a window deep inside a file (across chunk boundaries)
    assert contains_any(gguf_path, needles[2:]) == needles[2]
    artifact = gguf_path.stat()
    seen: set[tuple[int, int]] = set()
    leaks: list[str] = []
    scanned: set[Path] = set()
    for path in scanned_files(run, tmp_path_factory):
        try:
            st = path.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            if (st.st_dev, st.st_ino) == (artifact.st_dev, artifact.st_ino):
                continue  # the plaintext test artifact the session assembled
            with path.open("rb") as f:
                magic = f.read(4)
            hit = contains_any(path, needles)
        except OSError:
            continue  # unreadable, or gone meanwhile
        scanned.add(path)
        if magic == b"GGUF":
            leaks.append(f"{path}: starts with the GGUF magic")
        if hit is not None:
            leaks.append(f"{path}: holds model bytes (window {needles.index(hit)})")
    assert leaks == []
    # the scan did read the server's own files: the sealed bundle's payload and its log
    payloads = set(run.server.data_dir.glob("bundles/*.bundle/data/*.enc"))
    assert payloads and payloads <= scanned
    assert run.server.log_path in scanned


def test_no_decrypted_model_directory_left_in_dev_shm(run: Run) -> None:
    # (compared with before the start: another session's loader may be running right now)
    assert shm_model_dirs() - run.shm_before == set()


def test_server_log_shows_the_weights_went_into_memory(run: Run) -> None:
    messages = [r["msg"] for r in run.server.log_records()]
    assert any("decrypted and verified into=memfd" in m for m in messages), messages
    assert list(run.tmpdir.iterdir()) == []
    assert list(run.cwd.iterdir()) == []
