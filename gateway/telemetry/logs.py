"""Logging set-up: one JSON object per line on stderr, or short text lines for a person at a
terminal (`text_logs.py`; `[server] log_format`: "auto" picks text when stderr is a TTY).

Records carry our own structured `fields`; message arguments are rendered as given, so callers
must pass metadata only (the canary tests scan this output).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import msgspec

from .text_logs import TextFormatter

__all__ = ["configure_logging"]

_encode = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        return _encode(entry).decode()


def configure_logging(level: str = "info", log_format: str = "json") -> None:
    """Log to stderr at `level`, as JSON or text ("auto": text when stderr is a terminal)."""
    handler = logging.StreamHandler(sys.stderr)
    terminal = sys.stderr.isatty()
    if log_format == "text" or (log_format == "auto" and terminal):
        color = terminal and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        handler.setFormatter(TextFormatter(color=color))
    else:
        handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # llama.cpp's load chatter is debug-level in our logger; uvicorn's access log repeats ours.
    logging.getLogger("airgate.llamacpp").setLevel(max(logging.INFO, root.level))
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
