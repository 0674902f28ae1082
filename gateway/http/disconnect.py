"""Noticing that a client went away while its (non-streamed) answer is being made."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request

__all__ = ["disconnected"]


def disconnected(request: Request[Any, Any, Any]) -> Callable[[], Awaitable[None]]:
    """A coroutine function that returns once the client has disconnected (its body was read
    already, so the next message can only be `http.disconnect`)."""

    async def wait() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return wait
