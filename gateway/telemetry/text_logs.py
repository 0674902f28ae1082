"""Log lines for a person at a terminal (`[server] log_format = "text"`, or "auto" on a TTY).

The same records as the JSON lines, only laid out for reading: the local time, a level mark for
warnings and errors, the message, then the record's `fields` as `key=value`.  A request line
(`airgate.request`) is condensed from its fields:

    12:03:05 POST /v1/chat/completions 200 gemma-3-270m 1.24 s 12+45 tokens local:ann req 3f2a…

(method, route, status, model, latency, prompt+completion tokens, caller's key id, error code,
request id).  Nothing is printed that the JSON line does not hold: no exception text or trace
(the JSON formatter prints none either), no header, no body.  Control characters are escaped,
so a message can neither forge a line nor drive the terminal.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

__all__ = ["TextFormatter"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MARKS = {
    logging.DEBUG: "debug ",
    logging.WARNING: "WARNING ",
    logging.ERROR: "ERROR ",
    logging.CRITICAL: "CRITICAL ",
}
_COLORS = {logging.WARNING: "\x1b[33m", logging.ERROR: "\x1b[31m", logging.CRITICAL: "\x1b[1;31m"}
_DIM, _RESET = "\x1b[2m", "\x1b[0m"
# request fields rendered in the condensed line; any other is appended as key=value
_REQUEST_FIELDS = frozenset(
    {
        "request_id",
        "method",
        "path",
        "status",
        "latency_ms",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "key_id",
        "error",
    }
)
_QUIET = frozenset({"stream", "ttft_ms", "deployment", "route", "attempts", "finish_reason"})


def _escape(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return _escape(str(value))


def _latency(ms: Any) -> str | None:
    if not isinstance(ms, int | float):
        return None
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def request_line(fields: dict[str, Any]) -> str:
    """The condensed line of one request's fields (see the module docstring)."""
    parts = [str(fields.get("method", "")), str(fields.get("path", "")), str(fields.get("status"))]
    if fields.get("model") is not None:
        parts.append(str(fields["model"]))
    if (latency := _latency(fields.get("latency_ms"))) is not None:
        parts.append(latency)
    prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
    if prompt is not None or completion is not None:
        parts.append(f"{prompt or 0}+{completion or 0} tokens")
    if fields.get("key_id") is not None:
        parts.append(str(fields["key_id"]))
    if fields.get("error") is not None:
        parts.append(f"error={fields['error']}")
    if fields.get("finish_reason") not in (None, "stop"):
        parts.append(f"({fields['finish_reason']})")
    parts.append(f"req {fields.get('request_id')}")
    extra = [
        f"{k}={_value(v)}"
        for k, v in fields.items()
        if k not in _REQUEST_FIELDS and k not in _QUIET and v is not None
    ]
    return _escape(" ".join(parts + extra))


class TextFormatter(logging.Formatter):
    """One short line per record; `color` marks warnings and errors with ANSI colours."""

    def __init__(self, *, color: bool = False) -> None:
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = getattr(record, "fields", None) or {}
        if record.name == "airgate.request" and "path" in fields:
            body = request_line(fields)
        else:
            pairs = (f"{k}={_value(v)}" for k, v in fields.items() if v is not None)
            body = " ".join([_escape(record.getMessage()), *pairs])
        mark = _MARKS.get(record.levelno, "")
        if not self.color:
            return f"{stamp} {mark}{body}"
        color = _COLORS.get(record.levelno)
        line = f"{mark}{body}" if color is None else f"{color}{mark}{body}{_RESET}"
        return f"{_DIM}{stamp}{_RESET} {line}"
