"""The LiteLLM proxy as a peer of the "http" scenario: installed, configured and started offline.

LiteLLM is installed once into its own virtualenv under ``<cache_dir>/peers/litellm`` (never into
airgate's: it pins dozens of packages of its own), with the Python that runs the benchmark; a
stamp file naming the requirement makes later runs skip the install.  ``litellm[proxy]`` is
pinned: from 1.109 the extra needs a package that is not on PyPI.

The proxy forwards model ``echo`` to an OpenAI-compatible upstream (the scenario's bare Litestar
route) as ``openai/echo``, with a dummy upstream key; clients send ``LITELLM_MASTER_KEY`` as a
bearer token.  Quiet and offline: the bundled model cost map (``LITELLM_LOCAL_MODEL_COST_MAP``),
no ``.env`` loading (``LITELLM_MODE=PRODUCTION``), log level ERROR (which also hides uvicorn's
access log), no feedback banner, no database (so no spend logs and no prisma).  Its usage
telemetry is off by default in this version (the ``--telemetry`` flag is a no-op).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench._client import BenchError

__all__ = [
    "READY_PATH",
    "REQUIREMENT",
    "command",
    "ensure_litellm",
    "environment",
    "installed_version",
    "master_key",
    "shown_environment",
    "venv_path",
    "write_config",
]

VERSION = "1.108.7"
REQUIREMENT = f"litellm[proxy]=={VERSION}"
READY_PATH = "/health/liveliness"  # answers without a key once the app is up
_STAMP = ".airgate-bench-installed"
_INSTALL_TIMEOUT_S = 1800


def venv_path(cache_dir: Path) -> Path:
    """Where LiteLLM's virtualenv is, once installed."""
    return cache_dir / "peers" / "litellm"


def ensure_litellm(cache_dir: Path, log_path: Path) -> tuple[Path, float | None]:
    """The LiteLLM virtualenv, installed if needed; and the install time in seconds (None when
    it was already installed).  pip's output goes to ``log_path``."""
    venv = venv_path(cache_dir)
    stamp = venv / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == REQUIREMENT:
        return venv, None
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
         "-q", REQUIREMENT],
    ]  # fmt: skip
    with log_path.open("ab") as log:
        for step in steps:
            try:
                done = subprocess.run(
                    step, stdout=log, stderr=subprocess.STDOUT, timeout=_INSTALL_TIMEOUT_S
                )
            except subprocess.TimeoutExpired as exc:
                raise BenchError(f"installing {REQUIREMENT} timed out; see {log_path}") from exc
            if done.returncode != 0:
                raise BenchError(
                    f"installing {REQUIREMENT} failed (exit {done.returncode}); see {log_path}"
                )
    stamp.write_text(REQUIREMENT + "\n")
    return venv, time.monotonic() - start


def installed_version(venv: Path) -> str:
    """The litellm version installed in ``venv`` (read from its metadata, in its own Python)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def write_config(path: Path, upstream_url: str) -> None:
    """``config.yaml`` routing model ``echo`` to ``upstream_url`` (written as JSON, which is
    YAML too)."""
    config = {
        "model_list": [
            {
                "model_name": "echo",
                "litellm_params": {
                    "model": "openai/echo",
                    "api_base": f"{upstream_url}/v1",
                    "api_key": "sk-bench-upstream-unused",
                },
            }
        ],
        "litellm_settings": {"drop_params": False},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


def master_key() -> str:
    return f"sk-{secrets.token_hex(16)}"


def command(venv: Path, config: Path, port: int) -> list[str]:
    """The proxy's command line: one uvicorn worker (uvloop) in this process, no reload."""
    return [
        str(venv / "bin" / "litellm"), "--config", str(config),
        "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1",
    ]  # fmt: skip


# Variables that would change what the proxy does (a database, a dotenv, debug logging).
_DROPPED = ("DATABASE_URL", "DIRECT_URL", "REDIS_HOST", "REDIS_URL", "PYTHONPATH", "LITELLM_LOG")


def environment(key: str) -> dict[str, str]:
    """The proxy's environment: ours minus what would change its set-up, plus the offline,
    quiet settings and the master key."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env.update(
        LITELLM_MASTER_KEY=key,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_MODE="PRODUCTION",
        LITELLM_LOG="ERROR",
        LITELLM_DONT_SHOW_FEEDBACK_BOX="true",
    )
    return env


def shown_environment() -> str:
    """The environment settings of ``environment``, as the report shows them (key hidden)."""
    return (
        "LITELLM_MASTER_KEY=sk-<random> LITELLM_LOCAL_MODEL_COST_MAP=True "
        "LITELLM_MODE=PRODUCTION LITELLM_LOG=ERROR LITELLM_DONT_SHOW_FEEDBACK_BOX=true"
    )
