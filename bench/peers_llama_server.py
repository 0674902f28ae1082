"""llama.cpp's C++ ``llama-server``, a peer of the edge scenario, built from the source that
airgate's llama-cpp-python vendors.

``llama_server_binary(cache_dir)`` builds ``llama-server`` once with cmake from the sdist of the
llama-cpp-python installed beside this Python (the same llama.cpp commit airgate's engine runs),
with the portable instruction-set flags of the wheel ``scripts/llama-wheel.sh`` builds (read
from the script, so they never drift), statically linked, into ``peers/llama-server-KEY/`` (KEY
hashes version, flags and machine). It honours the request body airgate gets as is:
``logit_bias`` as an object of string ids, and ``stream_options.include_usage`` (its final chunk
carries usage and timings anyway).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench._client import BenchError
from bench._report import say
from bench.peers_llama import (
    LLAMA_SERVER,
    WHEEL_SCRIPT,
    llama_cpp_python_version,
    run_logged,
    setup_log,
)

__all__ = [
    "LlamaServerBuild",
    "llama_server_binary",
    "llama_server_build",
    "llama_server_command",
    "llama_server_path",
]

# What llama-server needs and nothing else: no tests, examples or unified app binary, no web UI
# assets (the default would download prebuilt ones), no HTTPS; one static binary.
SERVER_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


class LlamaServerBuild(msgspec.Struct, frozen=True, kw_only=True):
    """What a cached ``llama-server`` was built from (``build.json`` beside the binary)."""

    llama_cpp_python: str  # the sdist the source came from
    commit: str  # llama.cpp commit, from that sdist's changelog ("unknown" if absent)
    flags: list[str]  # cmake configure flags
    build_s: float


def _portable_flags() -> list[str]:
    """The instruction-set flags of the wheel airgate runs (``flags=`` in the wheel script)."""
    match = re.search(r'^flags="([^"]*)"', WHEEL_SCRIPT.read_text(), re.MULTILINE)
    if match is None:
        raise BenchError(f'no flags="..." line in {WHEEL_SCRIPT.name}')
    return match.group(1).split()


def _build_flags() -> list[str]:
    return [*_portable_flags(), *SERVER_FLAGS]


def _build_dir(cache_dir: Path, version: str, flags: Sequence[str]) -> Path:
    text = "|".join([version, *flags, platform.machine()])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return cache_dir / "peers" / f"llama-server-{key}"


def _vendored_commit(changelog: str, version: str) -> str:
    """The llama.cpp commit a llama-cpp-python release vendors, from its changelog entry."""
    section = re.search(rf"^## \[{re.escape(version)}\]\n(.*?)(?=^## \[)", changelog, re.M | re.S)
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section.group(1)) if section else None
    return found.group(1) if found else "unknown"


def _extract_source(sdist: Path, dest: Path, version: str) -> str:
    """Extract ``vendor/llama.cpp`` of the sdist into ``dest``; returns the vendored commit."""
    root = f"llama_cpp_python-{version}/"
    vendored = f"{root}vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            if member.name.startswith(vendored) and len(member.name) > len(vendored):
                member.name = member.name[len(vendored) :]
                members.append(member)
        if not members:
            raise BenchError(f"{sdist.name} holds no {vendored}")
        archive.extractall(dest, members=members, filter="data")
        changelog = archive.extractfile(f"{root}CHANGELOG.md")
        text = changelog.read().decode(errors="replace") if changelog else ""
    # The submodule's .git file points into a repository the sdist lacks: without it, cmake's
    # build-info asks no git at all (and we pass the commit ourselves).
    (dest / ".git").unlink(missing_ok=True)
    return _vendored_commit(text, version)


def llama_server_build(cache_dir: Path) -> LlamaServerBuild | None:
    """The record of the cached ``llama-server`` for this version and flags, if built."""
    info = llama_server_path(cache_dir).with_name("build.json")
    return msgspec.json.decode(info.read_bytes(), type=LlamaServerBuild) if info.exists() else None


def llama_server_path(cache_dir: Path) -> Path:
    """Where ``llama-server`` for this llama-cpp-python and these flags is, once built."""
    return _build_dir(cache_dir, llama_cpp_python_version(), _build_flags()) / LLAMA_SERVER


def llama_server_binary(cache_dir: Path) -> Path:
    """``llama-server`` from the llama.cpp vendored in airgate's llama-cpp-python, built once."""
    version = llama_cpp_python_version()
    flags = _build_flags()
    binary = llama_server_path(cache_dir)
    final = binary.parent
    if (final / "build.json").exists() and binary.exists():
        return binary
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BenchError(
            f"cmake is needed to build {LLAMA_SERVER}; install it, or pass --edge-skip "
            f"{LLAMA_SERVER}"
        )
    log = setup_log(cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=final.parent) as tmp:
        work = Path(tmp)
        say(f"edge: downloading the llama-cpp-python {version} sdist (for {LLAMA_SERVER})")
        run_logged(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
             "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}",
             "-d", work / "sdist"],
            log, "downloading the llama-cpp-python sdist",
        )  # fmt: skip
        sdist = next((work / "sdist").glob("*.tar.gz"), None)
        if sdist is None:
            raise BenchError("pip download left no llama-cpp-python sdist")
        source = work / "llama.cpp"
        commit = _extract_source(sdist, source, version)
        jobs = str(os.cpu_count() or 1)
        say(
            f"edge: building {LLAMA_SERVER} (llama.cpp {commit}, vendored in llama-cpp-python "
            f"{version}) with {jobs} jobs: several minutes on 2 cores, once; log: {log}"
        )
        build = work / "build"
        run_logged(
            [cmake, "-S", source, "-B", build, *flags,
             "-DLLAMA_BUILD_NUMBER=0", f"-DLLAMA_BUILD_COMMIT={commit}"],
            log, "configuring llama.cpp",
        )  # fmt: skip
        run_logged(
            [cmake, "--build", build, "--target", LLAMA_SERVER, "-j", jobs],
            log, f"building {LLAMA_SERVER}",
        )  # fmt: skip
        built = build / "bin" / LLAMA_SERVER
        if not built.exists():
            raise BenchError(f"the build left no bin/{LLAMA_SERVER}; see {log}")
        staging = work / "out"
        staging.mkdir()
        shutil.copy2(built, staging / LLAMA_SERVER)
        record = LlamaServerBuild(
            llama_cpp_python=version,
            commit=commit,
            flags=flags,
            build_s=round(time.monotonic() - start, 1),
        )
        (staging / "build.json").write_bytes(msgspec.json.encode(record))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)  # within one filesystem: a half-built binary is never cached
    say(f"edge: {LLAMA_SERVER} built in {record.build_s / 60:.1f} min")
    return binary


def llama_server_command(
    binary: Path | str,
    model: Path | str,
    *,
    threads: int,
    parallel: int,
    n_ctx_seq: int,
    port: int | str,
) -> list[str]:
    """``llama-server`` with ``parallel`` slots of ``n_ctx_seq`` tokens each (an explicit slot
    count keeps the KV cache split per slot, as airgate's engine does), continuous batching."""
    return [
        str(binary),
        "-m", str(model),
        "-t", str(threads), "-tb", str(threads),
        "-c", str(parallel * n_ctx_seq), "--parallel", str(parallel),
        "-cb",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
