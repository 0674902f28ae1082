"""The text log format: the records the server really emits (the request log middleware's line,
a warning, a record with fields, uvicorn's start line), formatted as text, show what their JSON
line holds and nothing more.  Zero retention depends on the second half: the canary scans read
whichever format the server prints."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.engines.registry import ModelRegistry
from gateway.http.request_log import RequestLogMiddleware, RouteTemplates, request_info
from gateway.pipeline.facts import Progress
from gateway.telemetry.logs import JsonFormatter, configure_logging
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.text_logs import TextFormatter

CANARY = "CANARY-3c9d-textlog"
STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Keep]:
    handler = Keep()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


def one_request(progress: Progress | None, status: int = 200, key_id: str | None = None) -> None:
    """One exchange through the real request log middleware (the app behind it fills in what
    the pipeline and auth would)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        info = request_info(scope)
        info.progress = progress
        info.key_id = key_id
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": CANARY.encode()})

    async def receive() -> Any:
        return {"type": "http.request", "body": CANARY.encode(), "more_body": False}

    async def send(message: Any) -> None:
        pass

    middleware = RequestLogMiddleware(
        app, Metrics(ModelRegistry([])), RouteTemplates(["/v1/chat/completions"])
    )
    scope: Any = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": CANARY.encode(),
        "headers": [(b"authorization", CANARY.encode()), (b"x-request-id", b"client-1")],
    }
    asyncio.run(middleware(scope, receive, send))


def both(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    return TextFormatter().format(record), json.loads(JsonFormatter().format(record))


def test_a_request_line_is_short_and_holds_the_request_fields(kept: Keep) -> None:
    progress = Progress("gemma-3-270m", stream=True)
    progress.prompt_tokens, progress.completion_tokens = 12, 45
    progress.finish_reason, progress.ttft_s = "length", 0.0312
    one_request(progress, key_id="local:ann")
    (record,) = [r for r in kept.records if r.name == "airgate.request"]
    text, entry = both(record)
    assert STAMP.match(text)
    rest = STAMP.sub("", text)
    latency = entry["latency_ms"]
    shown = f"{latency:.0f} ms" if latency < 1000 else f"{latency / 1000:.2f} s"
    assert rest == (
        f"POST /v1/chat/completions 200 gemma-3-270m {shown} 12+45 tokens local:ann (length) "
        f"req {entry['request_id']}"
    )
    assert "\n" not in text and CANARY not in text


def test_an_error_code_is_shown_and_a_request_without_progress_is_one_line(kept: Keep) -> None:
    one_request(None, status=401)
    (record,) = [r for r in kept.records if r.name == "airgate.request"]
    text, entry = both(record)
    assert STAMP.sub("", text).startswith("POST /v1/chat/completions 401 ")
    assert text.endswith(f"req {entry['request_id']}")
    assert "tokens" not in text and "None" not in text


def test_warnings_and_errors_are_marked_and_fields_rendered(kept: Keep) -> None:
    log = logging.getLogger("airgate.test")
    log.warning("audit queue full: event dropped (%d so far)", 3)
    log.error("policy reload refused, keeping version %s", "v7")
    log.info("drained", extra={"fields": {"finished": 2, "cut": 0, "took_s": 1.5, "gone": None}})
    log.debug("debug detail")
    warning, error, info, debug = (TextFormatter().format(r) for r in kept.records)
    assert STAMP.sub("", warning) == "WARNING audit queue full: event dropped (3 so far)"
    assert STAMP.sub("", error) == "ERROR policy reload refused, keeping version v7"
    assert STAMP.sub("", info) == "drained finished=2 cut=0 took_s=1.5"
    assert STAMP.sub("", debug) == "debug debug detail"
    colored = TextFormatter(color=True).format(kept.records[0])
    assert "\x1b[33mWARNING audit queue full" in colored


def test_nothing_beyond_the_json_line(kept: Keep) -> None:
    """What a record carries besides its message and fields (an exception and its trace, a
    stack, uvicorn's `color_message`, any other attribute) is in neither format."""
    log = logging.getLogger("uvicorn.error")
    try:
        raise ValueError(CANARY)
    except ValueError:
        log.error("engine failed", exc_info=True, stack_info=True, extra={"secret": CANARY})
    log.info(
        "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)",
        "http",
        "127.0.0.1",
        8000,
        extra={"color_message": f"{CANARY} running"},
    )
    for record in kept.records:
        text, entry = both(record)
        assert CANARY not in text and CANARY not in json.dumps(entry)
        assert STAMP.sub("", text).removeprefix("ERROR ") == entry["msg"]


def test_every_value_shown_is_in_the_json_line(kept: Keep) -> None:
    progress = Progress("m-1", stream=False)
    progress.prompt_tokens, progress.completion_tokens = 7, 0
    progress.deployment, progress.route_reason, progress.attempts = "m-1@a", "least_loaded", 1
    progress.error_code = "engine_failed"
    one_request(progress, status=503, key_id="k_123")
    (record,) = [r for r in kept.records if r.name == "airgate.request"]
    text, entry = both(record)
    values = {str(v) for v in entry.values()}
    literal = {"tokens", "req", "ms", "s"}
    for token in STAMP.sub("", text).replace("+", " ").replace("=", " ").split():
        assert token in values or token in literal or token == "error" or _is_latency(token)


def _is_latency(token: str) -> bool:
    return re.fullmatch(r"\d+(\.\d\d)?", token) is not None


def test_control_characters_are_escaped(kept: Keep) -> None:
    logging.getLogger("airgate.test").info("bad %s", "name\n12:00:00 ERROR forged\x1b[2J")
    text = TextFormatter().format(kept.records[0])
    assert "\n" not in text and "\x1b" not in text
    assert text.endswith("bad name\\x0a12:00:00 ERROR forged\\x1b[2J")


def test_configure_logging_picks_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for fmt, tty, expected in [
            ("auto", False, JsonFormatter),
            ("auto", True, TextFormatter),
            ("json", True, JsonFormatter),
            ("text", False, TextFormatter),
        ]:
            monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty)
            configure_logging("info", fmt)
            (handler,) = root.handlers
            assert type(handler.formatter) is expected, (fmt, tty)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
