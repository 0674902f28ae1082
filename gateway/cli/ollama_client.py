"""A small client of a running airgate's Ollama API, for `airgate run`, `ls` and `ps`.

It talks HTTP to the server (so every request is authenticated, policed and audited there),
never to an engine.  Foreign errors are translated in one place, `_translated`:

    ClientError          one line to show the user
      NotRunning         nothing listens at the address: start `airgate serve`
      ServerError        the server answered `{"error": "..."}` (any status, or mid-stream)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx

__all__ = ["Client", "ClientError", "NotRunning", "ServerError"]

# connecting is local and quick; a reply may wait for a free slot or a long prefill
_TIMEOUT = httpx.Timeout(600.0, connect=5.0)


class ClientError(Exception):
    """One line for the user (never the prompt: the server's messages never repeat it)."""


class NotRunning(ClientError):
    pass


class ServerError(ClientError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _message(body: bytes, status: int) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):  # an OpenAI envelope, should a proxy path answer one
        error = error.get("message")
    return str(error) if error else f"the server answered HTTP {status}"


class Client:
    """The server at `host`, with `api_key` as the bearer token (empty: none sent)."""

    def __init__(self, host: str, api_key: str) -> None:
        self.host = host.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.host, headers=headers, timeout=_TIMEOUT)

    def close(self) -> None:
        self._http.close()

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except httpx.ConnectError:
            raise NotRunning(
                f"no airgate server at {self.host}: start one with `airgate serve` "
                "(or name another with --host)"
            ) from None
        except httpx.HTTPError as exc:
            raise ClientError(f"the server at {self.host} failed: {type(exc).__name__}") from None

    def _check(self, response: httpx.Response) -> None:
        if response.status_code != 200:
            message = _message(response.read(), response.status_code)
            if response.status_code == 401:
                message += " (set AIRGATE_API_KEY to an API key)"
            raise ServerError(message, response.status_code)

    def get(self, path: str) -> dict[str, Any]:
        with self._translated():
            response = self._http.get(path)
            self._check(response)
            body: dict[str, Any] = response.json()
            return body

    @contextlib.contextmanager
    def chat(
        self, model: str, messages: list[dict[str, str]], options: dict[str, Any]
    ) -> Iterator[Iterator[dict[str, Any]]]:
        """POST /api/chat streamed: the reply's lines, as they come.  Leaving the block closes
        the stream (the server then aborts the generation)."""
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": True}
        if options:
            body["options"] = options
        with self._translated(), self._http.stream("POST", "/api/chat", json=body) as response:
            self._check(response)
            yield self._lines(response)

    def _lines(self, response: httpx.Response) -> Iterator[dict[str, Any]]:
        with self._translated():
            for text in response.iter_lines():
                if not text.strip():
                    continue
                line: dict[str, Any] = json.loads(text)
                if "error" in line:  # a failure after the stream began
                    raise ServerError(str(line["error"]))
                yield line
