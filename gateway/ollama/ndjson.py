"""NDJSON as Ollama streams it (one JSON object a line, the last one `done: true`), and the
final line's summary: counts from the pipeline's usage, durations in integer nanoseconds.

The durations are measured, not estimated:

    total_duration        the request's wall time, from its arrival to its last line
    load_duration         0: models are loaded when the server starts and stay resident
    prompt_eval_duration  the pipeline's time to first token (the engine's prefill, and any
                          wait for a free sequence slot)
    eval_duration         from the first token to the last
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec

from backends.types import Usage

from ..errors import GatewayError, ollama_error_body
from ..pipeline import Inference
from . import types as t

__all__ = ["NDJSON", "Timing", "created_at", "line", "line_error"]

NDJSON = "application/x-ndjson"
_encode = msgspec.json.Encoder().encode


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(reply: msgspec.Struct) -> bytes:
    return _encode(reply) + b"\n"


def line_error(error: GatewayError) -> bytes:
    """The line that ends a stream that failed after it began (status 200 already sent)."""
    return ollama_error_body(error) + b"\n"


_NS = 1_000_000_000


class Timing:
    """One request's clock: `arrived` is the request log's arrival time (perf_counter); made
    just before the pipeline starts the request."""

    __slots__ = ("_arrived", "_submitted")

    def __init__(self, arrived: float) -> None:
        self._arrived = arrived
        self._submitted = time.perf_counter()

    def final(self, reply: t.Line, run: Inference, usage: Usage, reason: str) -> t.Line:
        """`reply` as the final line: done, its reason, counts and durations."""
        now = time.perf_counter()
        ttft = run.progress.ttft_s
        first = now if ttft is None else self._submitted + ttft
        reply.done = True
        reply.done_reason = reason
        reply.total_duration = int((now - self._arrived) * _NS)
        reply.load_duration = 0
        reply.prompt_eval_count = usage.prompt_tokens
        reply.prompt_eval_duration = int((ttft or 0.0) * _NS)
        reply.eval_count = usage.completion_tokens
        reply.eval_duration = max(0, int((now - first) * _NS))
        return reply

    def elapsed_ns(self) -> int:
        return int((time.perf_counter() - self._arrived) * _NS)
