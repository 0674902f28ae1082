"""The edge scenario's peers: llama-cpp-python's own server and llama.cpp's C++ ``llama-server``.

Both run the llama.cpp that airgate's engine runs: the version of llama-cpp-python installed
beside this Python (pinned in pyproject.toml) and, for ``llama-server``, the llama.cpp source
vendored in that version's sdist. Each is prepared once into the bench cache and reused:

- ``llama_cpp_server_python(cache_dir)``: a virtualenv ``peers/llama-cpp-server`` holding the
  portable wheel that ``scripts/llama-wheel.sh`` builds for airgate (cached after ``make dev``)
  with its ``[server]`` extra; a stamp file naming the version marks it ready.
- ``llama_server_binary(cache_dir)``: ``llama-server`` built with cmake from the vendored source
  with the wheel's portable instruction-set flags (read from the script, so they never drift),
  statically linked, into ``peers/llama-server-KEY/`` (KEY hashes version, flags and machine).

Both get the request body airgate gets; what each makes of it:

- ``llama_cpp.server`` (0.3.36) has no ``stream_options`` in its request model (pydantic drops
  it) and ``Llama``'s streaming path never reports usage. ``UsageTransport`` (an httpx transport
  for the load generator) appends the missing usage chunk before ``[DONE]``, counting one token
  per streamed chunk: llama-cpp-python yields one chunk per token, except that tokens ending
  inside a UTF-8 character are held back and sent with the next one (then the count is short
  and the length check fails loudly, it never passes wrongly). ``logit_bias`` with string ids
  is honoured. The server must run with ``--interrupt_requests False``: by default a queued
  request ends the stream in progress after its current token.
- ``llama-server`` honours the body as is: ``logit_bias`` as an object of string ids, and
  ``stream_options.include_usage`` (its final chunk carries usage and timings anyway).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import httpx
import msgspec

from bench._client import BenchError
from bench._report import REPO_ROOT, say
from bench._serve import tail

__all__ = [
    "LLAMA_CPP_SERVER",
    "LLAMA_SERVER",
    "LlamaServerBuild",
    "UsageTransport",
    "llama_cpp_server_command",
    "llama_cpp_server_python",
    "llama_cpp_server_versions",
    "llama_server_binary",
    "llama_server_build",
    "llama_server_command",
]

LLAMA_CPP_SERVER = "llama_cpp.server"
LLAMA_SERVER = "llama-server"

WHEEL_SCRIPT = REPO_ROOT / "scripts" / "llama-wheel.sh"
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
SERVER_EXTRA_DISTRIBUTIONS = ("fastapi", "uvicorn", "sse-starlette", "pydantic")


def _llama_cpp_python_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise BenchError("llama-cpp-python is not installed: its peers cannot be set up") from None


def _log_path(cache_dir: Path) -> Path:
    logs = cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / "edge-peers-setup.log"


def _run(
    command: Sequence[str | Path],
    log_path: Path,
    what: str,
    *,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
) -> str:
    """Run ``command`` with its output appended to the log (stdout returned instead when
    ``capture``); BenchError when it fails."""
    argv = [str(part) for part in command]
    with log_path.open("ab") as log:
        log.write(f"\n=== {' '.join(argv)}\n".encode())
        log.flush()
        done = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else log,
            stderr=log,
            check=False,
        )
    if done.returncode != 0:
        raise BenchError(f"{what} failed (exit {done.returncode}):\n{tail(log_path, 30)}")
    return done.stdout.decode(errors="replace") if capture else ""


# --- llama_cpp.server ---------------------------------------------------------------------


def llama_cpp_server_python(cache_dir: Path) -> Path:
    """The Python of the ``llama_cpp.server`` virtualenv, created on first use."""
    version = _llama_cpp_python_version()
    venv = cache_dir / "peers" / "llama-cpp-server"
    python = venv / "bin" / "python"
    stamp = venv / ".ready"
    wanted = f"llama-cpp-python[server]=={version}\n"
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    log = _log_path(cache_dir)
    say(f"edge: creating the {LLAMA_CPP_SERVER} virtualenv (llama-cpp-python {version}, once)")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", venv], log, "creating the virtualenv")
    # The wheel airgate installs (built once per version and flags, then cached): same llama.cpp.
    env = {**os.environ, "PYTHON": str(python), "LLAMA_CPP_PYTHON_VERSION": version}
    wheel = _run(["bash", WHEEL_SCRIPT], log, WHEEL_SCRIPT.name, env=env, capture=True).strip()
    if not wheel.endswith(".whl"):
        raise BenchError(f"{WHEEL_SCRIPT.name} printed no wheel path: {wheel!r}")
    pip: list[str | Path] = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run([*pip, f"{wheel}[server]"], log, "installing llama-cpp-python[server]")
    stamp.write_text(wanted)
    return python


def llama_cpp_server_versions(python: Path) -> dict[str, str]:
    """Versions of llama-cpp-python and its server stack in the peer's virtualenv."""
    names = ("llama-cpp-python", *SERVER_EXTRA_DISTRIBUTIONS)
    script = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [str(python), "-c", script, *names], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {name: "?" for name in names}
    versions: dict[str, str] = json.loads(done.stdout)
    return versions


def llama_cpp_server_command(
    python: Path | str, model: Path | str, *, threads: int, n_ctx: int, port: int | str
) -> list[str]:
    """``python -m llama_cpp.server`` for one model: one ``Llama``, requests served one at a
    time (queued, not interrupted), ``threads`` threads for generation and prompts alike."""
    return [
        str(python), "-m", "llama_cpp.server",
        "--model", str(model),
        "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--n_ctx", str(n_ctx),
        "--interrupt_requests", "False",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


class _Choice(msgspec.Struct):
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []


_chunk_decoder = msgspec.json.Decoder(_Chunk)


class _UsageStream(httpx.AsyncByteStream):
    """An SSE body passed through line by line, with a usage chunk inserted before ``[DONE]``."""

    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        tokens = 0
        async for data in self._inner:
            *lines, pending = (pending + data).split(b"\n")
            out = []
            for line in lines:
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        usage = {"usage": {"prompt_tokens": 0, "completion_tokens": tokens}}
                        out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
                    elif payload:
                        choices = _chunk_decoder.decode(payload).choices
                        tokens += sum(1 for c in choices if c.finish_reason is None)
                out.append(line + b"\n")
            if out:
                yield b"".join(out)
        if pending:
            yield pending

    async def aclose(self) -> None:
        await self._inner.aclose()


class UsageTransport(httpx.AsyncBaseTransport):
    """For ``llama_cpp.server``: adds the usage chunk it never streams (see the module doc)."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code != 200 or not isinstance(response.stream, httpx.AsyncByteStream):
            return response
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_UsageStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- llama-server -------------------------------------------------------------------------


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
    info = _build_dir(cache_dir, _llama_cpp_python_version(), _build_flags()) / "build.json"
    return msgspec.json.decode(info.read_bytes(), type=LlamaServerBuild) if info.exists() else None


def llama_server_binary(cache_dir: Path) -> Path:
    """``llama-server`` from the llama.cpp vendored in airgate's llama-cpp-python, built once."""
    version = _llama_cpp_python_version()
    flags = _build_flags()
    final = _build_dir(cache_dir, version, flags)
    binary = final / LLAMA_SERVER
    if (final / "build.json").exists() and binary.exists():
        return binary
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BenchError(
            f"cmake is needed to build {LLAMA_SERVER}; install it, or pass --edge-skip "
            f"{LLAMA_SERVER}"
        )
    log = _log_path(cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=final.parent) as tmp:
        work = Path(tmp)
        say(f"edge: downloading the llama-cpp-python {version} sdist (for {LLAMA_SERVER})")
        _run(
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
        _run(
            [cmake, "-S", source, "-B", build, *flags,
             "-DLLAMA_BUILD_NUMBER=0", f"-DLLAMA_BUILD_COMMIT={commit}"],
            log, "configuring llama.cpp",
        )  # fmt: skip
        _run(
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
