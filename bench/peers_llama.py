"""The edge scenario's peers on airgate's llama.cpp: llama-cpp-python's own server here, and
what both peers share (their names, the llama-cpp-python version, the set-up log).

Both run the llama.cpp that airgate's engine runs: the version of llama-cpp-python installed
beside this Python (pinned in pyproject.toml) and, for ``llama-server``
(``bench.peers_llama_server``), the llama.cpp source vendored in that version's sdist. Each is
prepared once into the bench cache and reused.

``llama_cpp_server_python(cache_dir)`` makes a virtualenv ``peers/llama-cpp-server`` holding the
portable wheel that ``scripts/llama-wheel.sh`` builds for airgate (cached after ``make dev``)
with its ``[server]`` extra; a stamp file naming the version marks it ready.

``llama_cpp.server`` (0.3.36) has no ``stream_options`` in its request model (pydantic drops it)
and ``Llama``'s streaming path never reports usage. ``UsageTransport`` (an httpx transport for
the load generator) appends the missing usage chunk before ``[DONE]``, counting one token per
streamed chunk: llama-cpp-python yields one chunk per token, except that tokens ending inside a
UTF-8 character are held back and sent with the next one (then the count is short and the length
check fails loudly, it never passes wrongly). ``logit_bias`` with string ids is honoured. The
server must run with ``--interrupt_requests False``: by default a queued request ends the stream
in progress after its current token.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
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
    "WHEEL_SCRIPT",
    "UsageTransport",
    "llama_cpp_python_version",
    "llama_cpp_server_command",
    "llama_cpp_server_python",
    "llama_cpp_server_python_path",
    "llama_cpp_server_versions",
    "run_logged",
    "setup_log",
]

LLAMA_CPP_SERVER = "llama_cpp.server"
LLAMA_SERVER = "llama-server"

WHEEL_SCRIPT = REPO_ROOT / "scripts" / "llama-wheel.sh"
SERVER_EXTRA_DISTRIBUTIONS = ("fastapi", "uvicorn", "sse-starlette", "pydantic")


def llama_cpp_python_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise BenchError("llama-cpp-python is not installed: its peers cannot be set up") from None


def setup_log(cache_dir: Path) -> Path:
    """The peers' set-up log (installs and builds), in the cache's logs directory."""
    logs = cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / "edge-peers-setup.log"


def run_logged(
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


def llama_cpp_server_python_path(cache_dir: Path) -> Path:
    """Where the Python of the ``llama_cpp.server`` virtualenv is, once prepared."""
    return cache_dir / "peers" / "llama-cpp-server" / "bin" / "python"


def llama_cpp_server_python(cache_dir: Path) -> Path:
    """The Python of the ``llama_cpp.server`` virtualenv, created on first use."""
    version = llama_cpp_python_version()
    python = llama_cpp_server_python_path(cache_dir)
    venv = python.parents[1]
    stamp = venv / ".ready"
    wanted = f"llama-cpp-python[server]=={version}\n"
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    log = setup_log(cache_dir)
    say(f"edge: creating the {LLAMA_CPP_SERVER} virtualenv (llama-cpp-python {version}, once)")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "venv", venv], log, "creating the virtualenv")
    # The wheel airgate installs (built once per version and flags, then cached): same llama.cpp.
    env = {**os.environ, "PYTHON": str(python), "LLAMA_CPP_PYTHON_VERSION": version}
    wheel = run_logged(
        ["bash", WHEEL_SCRIPT], log, WHEEL_SCRIPT.name, env=env, capture=True
    ).strip()
    if not wheel.endswith(".whl"):
        raise BenchError(f"{WHEEL_SCRIPT.name} printed no wheel path: {wheel!r}")
    pip: list[str | Path] = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run_logged([*pip, f"{wheel}[server]"], log, "installing llama-cpp-python[server]")
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
