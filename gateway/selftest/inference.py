"""The inference check: load the configuration's models in this process, as `airgate run` does
when no server answers, and send one short request through the real server (authentication
as the local user, policy, limits, routing, the engine, the audit log).

The model: the first configured model that generates (else the first configured one, which
embeds); with no model configured, the embedded default.  A chat must answer at least one
token of non-empty text; an embedding model must return a vector.

Zero retention: the prompt below is sent and the answer read, but neither is printed, logged
or kept: the detail holds token counts and timings only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bundles import BundleError, read_manifest

from ..config import Settings
from ..engines.sources import DEFAULT_MODEL_ID
from .result import Finding, failed, passed

__all__ = ["PROMPT", "Serve", "ServeFailed", "check_inference", "inference_settings", "pick_model"]

# what the check asks; tests look for it everywhere the gateway writes (it must be nowhere)
PROMPT = "Say hello, in one short sentence, to the operator who installed this gateway."
MAX_TOKENS = 16
_TIMEOUT = httpx.Timeout(300.0, connect=5.0)


class ServeFailed(Exception):
    """The configuration could not be served in this process (one line for the operator)."""


# settings -> a context manager serving them, yielding the base URL once the models are
# loaded (the CLI passes `serving.in_process`, translating its failure into ServeFailed)
Serve = Callable[[Settings], AbstractContextManager[str]]


def inference_settings(settings: Settings) -> Settings:
    """`settings` served on a loopback port the OS picks, the local user trusted (as `airgate
    run` serves them), warnings only in the log.  Client certificates are not asked for: the
    check's client is this process."""
    replace = msgspec.structs.replace
    return replace(
        settings,
        server=replace(settings.server, host="127.0.0.1", port=0, log_level="warning"),
        auth=replace(settings.auth, local_trust=True, mtls=None),
    )


def _task(model_bundle: str | None, task: str | None) -> str:
    if task is not None:
        return task
    if model_bundle:
        # only to choose the endpoint: the load verifies the bundle
        with contextlib.suppress(BundleError, OSError):
            hints = read_manifest(Path(model_bundle), None).manifest.model.engine_hints
            return "embed" if hints.get("task") == "embed" else "generate"
    return "generate"


def pick_model(settings: Settings) -> tuple[str, str]:
    """(model id, "generate" | "embed") the check sends its request to (see the module)."""
    if not settings.models:
        return DEFAULT_MODEL_ID, "generate"
    tasks = [(m.id, _task(m.bundle, m.task)) for m in settings.models]
    return next((t for t in tasks if t[1] == "generate"), tasks[0])


class _NoAnswer(Exception):
    """The server answered, but not with a usable answer (the message says how)."""


def _error(response: httpx.Response) -> str:
    """The server's own error message (it never repeats a prompt)."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return f"HTTP {response.status_code}" + (f": {message}" if message else "")


def _ask(client: httpx.Client, model: str, task: str) -> str:
    """One request; a detail line of counts and timings, or raises _NoAnswer."""
    start = time.perf_counter()
    if task == "embed":
        response = client.post("/v1/embeddings", json={"model": model, "input": PROMPT})
    else:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        response = client.post("/v1/chat/completions", json=body)
    elapsed_ms = (time.perf_counter() - start) * 1000
    if response.status_code != 200:
        raise _NoAnswer(f"{model} did not answer: {_error(response)}")
    answer: dict[str, Any] = response.json()
    usage = answer.get("usage") or {}
    if task == "embed":
        vector = answer["data"][0]["embedding"] if answer.get("data") else []
        if not vector:
            raise _NoAnswer(f"{model} returned no embedding")
        return (
            f"{model}: a {len(vector)}-dimension embedding of a "
            f"{usage.get('prompt_tokens', 0)}-token input in {elapsed_ms:.0f} ms"
        )
    content = (answer["choices"][0]["message"].get("content") or "") if answer["choices"] else ""
    completion = int(usage.get("completion_tokens") or 0)
    if not content.strip() or completion < 1:
        raise _NoAnswer(f"{model} answered with no text ({completion} tokens)")
    return (
        f"{model}: {completion} tokens generated from a {usage.get('prompt_tokens', 0)}-token "
        f"prompt in {elapsed_ms:.0f} ms"
    )


def check_inference(settings: Settings, serve: Serve) -> Finding:
    """Serve the configuration in this process and send it one request (see the module)."""
    model, task = pick_model(settings)
    start = time.perf_counter()
    try:
        with serve(inference_settings(settings)) as url:
            loaded_s = time.perf_counter() - start
            with httpx.Client(base_url=url, timeout=_TIMEOUT) as client:
                detail = _ask(client, model, task)
    except ServeFailed as exc:
        return failed(f"the models could not be served: {exc}")
    except _NoAnswer as exc:
        return failed(str(exc))
    except httpx.HTTPError as exc:
        return failed(f"the request to {model} failed ({type(exc).__name__})")
    return passed(f"{detail} (models loaded in {loaded_s:.1f} s)")
