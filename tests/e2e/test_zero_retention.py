"""Zero retention, proved by canaries: no prompt or completion text reaches any sink.

One `airgate serve` runs on a fresh data dir with its own TMPDIR and working directory, rate
limits in the real Redis (127.0.0.1:6379), the default SQLite audit log, a small request-body
limit and a small policy (team-less apps: the model, max_tokens <= 64; team "burst": one request
a minute; team "denied": no model).  Every content field of every request carries a canary
(`CANARY<run>N<index>`, `run` being 20 random digits), across the request shapes (chat, streamed
chat, completions with a string and a list prompt, streamed completions, a multi-turn
conversation with content parts, the Responses API, Ollama's /api/chat, /api/generate and
/api/embed) and the ways a request ends (success, validation error, invalid
JSON, oversized body, unknown model named by a canary, unknown route with a canary in the path
and query, failed authentication with a canary in the credential, policy denial, rate limit,
client disconnect mid-stream, engine errors: context length and an out-of-vocabulary bias).
Completions come from both raw HTTP and the `openai` SDK.

After a graceful stop every sink is read back: each row of each SQLite table, each Redis key and
value, the server's combined stdout/stderr log (every logger, and the engine's own output), every
file under the data dir, TMPDIR, cwd (and files /dev/shm gained meanwhile), the audit export in
all three formats (from the API before the stop, and offline after it), the Prometheus
exposition (`GET /metrics`, which a scraper would store) and the OpenTelemetry traces the server
exported (the raw OTLP protobuf bodies a real collector on loopback received).  The scan looks
for `run` alone, so a copy that was lower-cased or re-escaped is still found, and for the text
of every completion the server returned.

A scanner that reads nothing would pass, so two tests prove it reads: a known request id and key
id are found in every sink that must hold them, and canaries planted on purpose (a file in
TMPDIR across a read-chunk boundary, a Redis key, a SQLite row) are all found.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import sqlite3
import stat
import string
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from openai import OpenAI
from otlp_sink import OtlpSink
from server_process import (
    MODEL,
    NO_END,
    SERVER_ENV,
    Server,
    clean_env,
    free_port,
    seed_data_dir,
    serve_command,
    stop_and_check,
)
from server_process import (
    test_keys as keys_of,
)

from gateway.access.auth import KeyStore, parse_api_key
from gateway.access.auth.apikeys import api_key_checksum
from gateway.access.keys import key_store
from gateway.audit import Format, export
from gateway.config import load_settings
from gateway.db import create_db_engine, database_url

pytestmark = pytest.mark.e2e

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
MAX_BODY = 32 * 1024  # [server] max_request_bytes: small, so an oversized body is cheap
CHUNK = 1 << 20  # file scan chunk (consecutive chunks overlap by the longest needle)
SHM = Path("/dev/shm")
CLOCK_SLACK_S = 2.0
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
EMBEDDINGS, EMBEDDER = "/v1/embeddings", "all-minilm-l6-v2"
GEN = 16  # max_tokens of a successful request: enough text to search the sinks for
STORY = "Tell me a story about a lighthouse keeper."  # after the canary: the model tells it
FORMATS: tuple[Format, ...] = ("jsonl", "csv", "ocsf")
POLICY = """
name = "canary"

[[rules]]
name = "burst"
teams = ["burst"]
roles = ["app"]
models = ["gemma-3-270m"]
max_tokens = 64
requests_per_minute = 1

[[rules]]
name = "denied"
teams = ["denied"]
roles = ["app"]
models = ["no-such-model-*"]

[[rules]]
name = "apps"
roles = ["app", "admin"]
models = ["gemma-3-270m", "all-minilm-l6-v2"]
max_tokens = 64
requests_per_minute = 6000
concurrent_streams = 4

[[rules]]
name = "auditors"
roles = ["auditor"]
deny_models = ["*"]
"""
# what each request of the traffic must have been answered with (proves every path was taken)
EXPECTED = {
    "sdk_chat": 200,
    "sdk_chat_stream": 200,
    "sdk_multi_turn": 200,
    "sdk_completions": 200,
    "sdk_completions_list": 200,
    "sdk_completions_stream": 200,
    "raw_chat_query_string": 200,
    "raw_completions_stream": 200,
    "sdk_json_schema": 200,
    "sdk_tools": 200,
    "sdk_tools_stream": 200,
    "raw_tool_history": 200,
    "sdk_chat_choices": 200,
    "sdk_embeddings": 200,
    "raw_embeddings_base64": 200,
    "embeddings_empty_input": 400,
    "embeddings_token_vocabulary": 400,
    "embeddings_context_length": 400,
    "validation_schema_keyword": 400,
    "validation_tool_choice": 400,
    "validation_temperature": 400,
    "validation_unknown_field": 400,
    "validation_logit_bias_key": 400,
    "invalid_json": 400,
    "oversized_body": 413,
    "unknown_model_chat": 404,
    "unknown_model_completions": 404,
    "unknown_model_get": 404,
    "unknown_route": 404,
    "unknown_route_anonymous": 401,
    "auth_malformed_key": 401,
    "auth_unknown_key": 401,
    "auth_wrong_secret": 401,
    "auth_jwt_shaped": 401,
    "auth_basic": 401,
    "policy_model_not_allowed": 403,
    "policy_model_not_allowed_stream": 403,
    "policy_max_tokens_over_cap": 400,
    "policy_auditor": 403,
    "rate_first": 200,
    "rate_limited": 429,
    "rate_limited_stream": 429,
    "disconnect_mid_stream": 200,
    "engine_context_length_chat": 400,
    "engine_context_length_completions": 400,
    "engine_logit_bias_vocabulary": 400,
}


class Canaries:
    """Unique strings of one run, each remembering which field it was put in."""

    def __init__(self) -> None:
        self.run = "".join(secrets.choice(string.digits) for _ in range(20))
        self.fields: list[str] = []
        self._lock = threading.Lock()  # requests are built on several threads

    def __call__(self, where: str) -> str:
        with self._lock:
            self.fields.append(where)
            return f"CANARY{self.run}N{len(self.fields) - 1:03d}"

    def name(self, context: bytes) -> str:
        """Which canary the bytes around a hit hold (digits survive case and escaping)."""
        found = re.search(self.run.encode() + rb"[nN](\d{3})", context)
        if found is None or int(found.group(1)) >= len(self.fields):
            return f"a canary (truncated: {context!r})"
        return f"canary #{int(found.group(1))} ({self.fields[int(found.group(1))]})"


Describe = Callable[[bytes], str]  # the bytes around a hit -> what leaked


class Scanner:
    """Finds needles in blobs and files; each hit says where and what."""

    def __init__(self, needles: Mapping[bytes, Describe]) -> None:
        assert needles and all(needles)
        self.needles = dict(needles)
        self.overlap = max(len(n) for n in needles) + 64

    def scan(self, sink: str, data: bytes) -> list[str]:
        """One line per distinct thing found (every occurrence is looked at)."""
        hits: dict[str, None] = {}
        for needle, describe in self.needles.items():
            at = data.find(needle)
            while at >= 0:
                context = data[max(0, at - 64) : at + len(needle) + 64]
                hits[f"{sink}: {describe(context)}"] = None
                at = data.find(needle, at + 1)
        return list(hits)

    def scan_file(self, sink: str, path: Path) -> list[str]:
        hits: set[str] = set()
        tail = b""
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                data = tail + chunk
                hits.update(self.scan(sink, data))
                tail = data[-self.overlap :]
        return sorted(hits)


@dataclass
class Traffic:
    """What the clients saw, per case (the names in EXPECTED)."""

    statuses: dict[str, int] = field(default_factory=dict)
    request_ids: dict[str, str] = field(default_factory=dict)
    completions: list[str] = field(default_factory=list)  # text the server generated


@dataclass
class Run:
    server: Server
    tmpdir: Path
    cwd: Path
    started: float
    canaries: Canaries
    traffic: Traffic
    key_ids: dict[str, str]  # role or team -> key id
    exports: dict[str, bytes]  # audit exports (API and offline), the metrics: label -> bytes
    redis_entries: list[tuple[str, bytes]]  # the Redis snapshot right after the stop


# ---- the server and its traffic ----------------------------------------------------------------


def redis_client() -> redis.Redis:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise AssertionError(
            f"this test needs the Redis on {REDIS_HOST}:{REDIS_PORT}: {type(exc).__name__}: {exc}"
        ) from None
    return client


async def create_team_keys(data_dir: Path) -> dict[str, str]:
    settings = load_settings(environ={}, overrides={"data_dir": str(data_dir)})
    store: KeyStore
    async with key_store(settings) as store:
        return {
            team: (await store.create("app", team=team, name=f"canary-{team}"))[0]
            for team in ("burst", "denied")
        }


def forged_key(key_id: str, secret: str) -> str:
    """A key that passes the offline checks (shape, checksum) with the secret given."""
    body = f"ag_{key_id}_{secret.ljust(32, 'x')[:32]}"
    return f"{body}_{api_key_checksum(body)}"


def jwt_shaped(c: Canaries) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64({'sub': c('jwt sub')})}.{c('jwt sig')}"


def sse_texts(lines: Iterator[str], field_name: str) -> tuple[str, bool]:
    """The concatenated generated text of an SSE stream, and whether it ended with [DONE]."""
    texts: list[str] = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            return "".join(texts), True
        for choice in json.loads(data).get("choices", ()):
            holder = choice.get("delta", {}) if field_name == "content" else choice
            texts.append(holder.get(field_name) or "")
    return "".join(texts), False


class _Message:
    """A raw chat answer's message, read like the SDK's (content and tool call arguments)."""

    def __init__(self, body: dict[str, Any]) -> None:
        message = body["choices"][0]["message"]
        self.content = message.get("content")
        self.tool_calls = [
            _Call(c["function"]["arguments"]) for c in message.get("tool_calls") or ()
        ]


class _Call:
    def __init__(self, arguments: str) -> None:
        self.function = self
        self.arguments = arguments


class Driver:
    """Sends the traffic: every request shape and way of ending, canaries in every content field.

    The successful requests (the slow ones: they generate) run concurrently; the refusals,
    the disconnect and the rate limits (last, so the Redis key they make outlives the run)
    follow one by one.
    """

    def __init__(
        self, server: Server, c: Canaries, keys: dict[str, str], http: httpx.Client, sdk: OpenAI
    ) -> None:
        self.server = server
        self.c = c
        self.keys = keys
        self.http = http
        self.sdk = sdk
        self.traffic = Traffic()

    def run(self) -> Traffic:
        successes = (
            self.sdk_chat,
            self.sdk_chat_stream,
            self.sdk_multi_turn,
            self.sdk_completions,
            self.sdk_completions_list,
            self.sdk_completions_stream,
            self.raw_chat_query_string,
            self.raw_completions_stream,
            self.sdk_json_schema,
            self.sdk_tools,
            self.sdk_tools_stream,
            self.raw_tool_history,
            self.sdk_chat_choices,
            self.sdk_embeddings,
            self.raw_embeddings_base64,
        )
        with ThreadPoolExecutor(len(successes)) as pool:
            for future in [pool.submit(send) for send in successes]:
                future.result()
        self.validation_errors()
        self.unknown_names()
        self.auth_failures()
        self.policy_denials()
        self.engine_errors()
        self.embedding_errors()
        self.disconnect_mid_stream()
        self.rate_limits()
        return self.traffic

    # ---- bodies and senders

    def chat(self, case: str, max_tokens: int = 4, **kw: Any) -> dict[str, Any]:
        c = self.c
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": f"A storyteller ({c(f'{case}: system')})."},
                {"role": "user", "content": f"{STORY} (ticket {c(f'{case}: user')})"},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": NO_END,
            "stop": [c(f"{case}: stop string")],
            "user": c(f"{case}: user field"),
            **kw,
        }

    def completion(self, case: str, max_tokens: int = 4, **kw: Any) -> dict[str, Any]:
        c = self.c
        return {
            "model": MODEL,
            "prompt": f"Once upon a time ({c(f'{case}: prompt')}), a lighthouse keeper",
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": NO_END,
            "stop": c(f"{case}: stop string"),
            "user": c(f"{case}: user field"),
            **kw,
        }

    def note(self, case: str, status: int, request_id: str = "", text: str | None = None) -> None:
        self.traffic.statuses[case] = status
        self.traffic.request_ids[case] = request_id
        if text is not None:
            self.traffic.completions.append(text)

    def bearer(self, role: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"} if role else {}

    def post(self, case: str, path: str, role: str | None = "app", **kw: Any) -> httpx.Response:
        headers = {**self.bearer(role), **kw.pop("headers", {})}
        resp = self.http.post(path, headers=headers, **kw)
        self.note(case, resp.status_code, resp.headers.get("x-request-id", ""))
        return resp

    def get(self, case: str, path: str, role: str | None = "app") -> None:
        resp = self.http.get(path, headers=self.bearer(role))
        self.note(case, resp.status_code, resp.headers.get("x-request-id", ""))

    def stream(self, case: str, path: str, body: dict[str, Any], role: str = "app") -> None:
        with self.http.stream("POST", path, json=body, headers=self.bearer(role)) as resp:
            text = None
            if resp.status_code == 200:
                text, done = sse_texts(resp.iter_lines(), "content" if "chat" in path else "text")
                assert done, case
            else:
                resp.read()
            self.note(case, resp.status_code, resp.headers.get("x-request-id", ""), text)

    # ---- successes: the SDK (responses read raw for their status) and raw HTTP

    def sdk_chat_choices(self) -> None:
        """n = 3: every choice's text is searched for."""
        body = self.chat("sdk_chat_choices", GEN, n=3, temperature=1, seed=5)
        raw = self.sdk.chat.completions.with_raw_response.create(**body)
        self.note("sdk_chat_choices", raw.status_code, raw.headers.get("x-request-id", ""))
        for choice in raw.parse().choices:
            self.traffic.completions.append(choice.message.content or "")

    def sdk_embeddings(self) -> None:
        c = self.c
        raw = self.sdk.embeddings.with_raw_response.create(
            model=EMBEDDER,
            input=[c("sdk_embeddings: input 0"), f"{STORY} {c('sdk_embeddings: input 1')}"],
            user=c("sdk_embeddings: user field"),
        )
        self.note("sdk_embeddings", raw.status_code, raw.headers.get("x-request-id", ""))
        assert len(raw.parse().data) == 2

    def raw_embeddings_base64(self) -> None:
        body = {
            "model": EMBEDDER,
            "input": self.c("raw_embeddings_base64: input"),
            "encoding_format": "base64",
        }
        self.post("raw_embeddings_base64", EMBEDDINGS, json=body)

    def sdk_chat(self) -> None:
        raw = self.sdk.chat.completions.with_raw_response.create(**self.chat("sdk_chat", GEN))
        self.note("sdk_chat", raw.status_code, text=raw.parse().choices[0].message.content or "")

    def sdk_chat_stream(self) -> None:
        chunks = self.sdk.chat.completions.create(
            **self.chat("sdk_chat_stream", GEN),
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.note("sdk_chat_stream", 200, text=text)

    def sdk_multi_turn(self) -> None:
        c = self.c
        conversation = [
            {"role": "system", "content": c("multi-turn: system")},
            {"role": "developer", "content": [{"type": "text", "text": c("multi-turn: dev")}]},
            {"role": "user", "content": c("multi-turn: user turn 1")},
            {"role": "assistant", "content": c("multi-turn: assistant turn 1")},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": c("multi-turn: user part")},
                    {"type": "text", "text": STORY},
                ],
            },
        ]
        raw = self.sdk.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=conversation,  # type: ignore[arg-type]
            max_tokens=GEN,
            temperature=0,
            logit_bias=NO_END,
            stop=[c("multi-turn: stop 1"), c("multi-turn: stop 2")],
            user=c("multi-turn: user field"),
        )
        text = raw.parse().choices[0].message.content or ""
        self.note("sdk_multi_turn", raw.status_code, text=text)

    def sdk_completions(self) -> None:
        body = self.completion("sdk_completions", GEN)
        raw = self.sdk.completions.with_raw_response.create(**body)
        self.note("sdk_completions", raw.status_code, text=raw.parse().choices[0].text)

    def sdk_completions_list(self) -> None:
        body = self.completion("sdk_completions_list", GEN)
        body["prompt"] = [
            f"The sea ({self.c('completions list: prompt 1')}) was",
            f"The ship ({self.c('completions list: prompt 2')}) sailed",
        ]
        raw = self.sdk.completions.with_raw_response.create(**body)
        for choice in raw.parse().choices:
            self.note("sdk_completions_list", raw.status_code, text=choice.text)

    def sdk_completions_stream(self) -> None:
        body = self.completion("sdk_completions_stream", GEN)
        pieces = self.sdk.completions.create(**body, stream=True)
        text = "".join(p.choices[0].text for p in pieces if p.choices)
        self.note("sdk_completions_stream", 200, text=text)

    def raw_chat_query_string(self) -> None:
        c = self.c
        path = f"/v1/chat/completions?trace={c('query string value')}&{c('query string name')}=1"
        resp = self.post("raw_chat_query_string", path, json=self.chat("query string", GEN))
        self.traffic.completions.append(resp.json()["choices"][0]["message"]["content"])

    def raw_completions_stream(self) -> None:
        body = self.completion("raw_completions_stream", GEN, stream=True)
        self.stream("raw_completions_stream", "/v1/completions", body)

    # ---- structured outputs and tools: canaries in schemas, tool definitions, calls, results

    def schema(self, case: str) -> dict[str, Any]:
        c = self.c
        return {
            "title": c(f"{case}: schema title"),
            "description": c(f"{case}: schema description"),
            "type": "object",
            "properties": {
                "answer": {"type": "string", "maxLength": 20, "description": c(f"{case}: prop")},
                "kind": {"enum": [c(f"{case}: enum value"), "other"]},
            },
            "required": ["answer", "kind"],
            "additionalProperties": False,
        }

    def tools(self, case: str) -> list[dict[str, Any]]:
        c = self.c
        return [
            {
                "type": "function",
                "function": {
                    "name": c(f"{case}: function name"),
                    "description": c(f"{case}: function description"),
                    "parameters": self.schema(f"{case}: parameters"),
                },
            }
        ]

    def note_calls(self, case: str, status: int, message: Any) -> None:
        self.note(case, status, text=message.content or "")
        for call in message.tool_calls or ():
            self.traffic.completions.append(call.function.arguments)

    def sdk_json_schema(self) -> None:
        body = self.chat("sdk_json_schema", 48)
        fmt = {"name": self.c("json_schema name"), "schema": self.schema("json_schema")}
        raw = self.sdk.chat.completions.with_raw_response.create(
            **body, response_format={"type": "json_schema", "json_schema": fmt}
        )
        self.note("sdk_json_schema", raw.status_code, text=raw.parse().choices[0].message.content)

    def sdk_tools(self) -> None:
        tools = self.tools("sdk_tools")
        raw = self.sdk.chat.completions.with_raw_response.create(
            **self.chat("sdk_tools", 48), tools=tools, tool_choice="required"
        )
        self.note_calls("sdk_tools", raw.status_code, raw.parse().choices[0].message)

    def sdk_tools_stream(self) -> None:
        tools = self.tools("sdk_tools_stream")
        choice = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        chunks = self.sdk.chat.completions.create(
            **self.chat("sdk_tools_stream", 48), tools=tools, tool_choice=choice, stream=True
        )
        arguments = "".join(
            call.function.arguments or ""
            for chunk in chunks
            if chunk.choices
            for call in chunk.choices[0].delta.tool_calls or ()
            if call.function
        )
        self.note("sdk_tools_stream", 200, text=arguments)

    def raw_tool_history(self) -> None:
        c = self.c
        body = self.chat("raw_tool_history", GEN)
        call_id = c("history: tool call id")
        body["messages"] += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": c("history: called function"),
                            "arguments": json.dumps({"q": c("history: call arguments")}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": c("history: tool result")},
        ]
        body["tools"] = self.tools("raw_tool_history")
        resp = self.post("raw_tool_history", CHAT, json=body)
        self.note_calls("raw_tool_history", resp.status_code, _Message(resp.json()))

    # ---- refusals

    def validation_errors(self) -> None:
        """A value out of range, an unknown field, a bad logit_bias key, broken JSON, and a body
        over the server's limit."""
        chat, c = self.chat, self.c
        hot = chat("validation_temperature", temperature=5)
        self.post("validation_temperature", CHAT, json=hot)
        unknown = chat("validation_unknown_field")
        unknown[c("unknown field name")] = c("unknown field value")
        self.post("validation_unknown_field", CHAT, json=unknown)
        bias = chat("validation_logit_bias_key", logit_bias={c("logit_bias key"): 1})
        self.post("validation_logit_bias_key", CHAT, json=bias)
        schema = self.schema("validation_schema_keyword")
        schema["properties"][c("schema: property name")] = {"minimum": 1, c("keyword"): 2}
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        self.post("validation_schema_keyword", CHAT, json=chat("schema_kw", response_format=fmt))
        missing = {"type": "function", "function": {"name": c("tool_choice: missing function")}}
        body = chat("tool_choice", tools=self.tools("validation_tool_choice"), tool_choice=missing)
        self.post("validation_tool_choice", CHAT, json=body)
        broken = json.dumps(chat("invalid_json"))[:-20].encode()
        headers = {"Content-Type": "application/json"}
        self.post("invalid_json", CHAT, content=broken, headers=headers)
        big = chat("oversized_body")
        big["messages"][1]["content"] = (c("oversized body: user message") + " ") * 1200
        assert len(json.dumps(big)) > MAX_BODY
        self.post("oversized_body", CHAT, json=big)

    def unknown_names(self) -> None:
        """Models and routes that do not exist, named by canaries."""
        c = self.c
        body = {**self.chat("unknown_model_chat"), "model": c("model name (chat)")}
        self.post("unknown_model_chat", CHAT, json=body)
        body = {**self.completion("unknown_model_compl"), "model": c("model name (completions)")}
        self.post("unknown_model_completions", COMPLETIONS, json=body)
        self.get("unknown_model_get", f"/v1/models/{c('model name in a path')}")
        path = f"/v1/{c('unknown route path')}/x?{c('unknown route query')}=1"
        self.post("unknown_route", path, json=self.chat("unknown_route"))
        path = f"/{c('anonymous route path')}?q={c('anonymous route query')}"
        self.get("unknown_route_anonymous", path, None)

    def auth_failures(self) -> None:
        """Credentials that carry a canary: malformed, well-formed but unknown, a real key id
        with a wrong secret, a JWT-shaped token (no JWT configured), another scheme."""
        c = self.c
        app_id = parse_api_key(self.keys["app"])[0]
        for case, value in (
            ("auth_malformed_key", f"Bearer ag_{c('malformed key')}"),
            ("auth_unknown_key", f"Bearer {forged_key('Z' * 12, c('unknown key secret'))}"),
            ("auth_wrong_secret", f"Bearer {forged_key(app_id, c('wrong secret'))}"),
            ("auth_jwt_shaped", f"Bearer {jwt_shaped(c)}"),
            ("auth_basic", f"Basic {c('basic credential')}"),
        ):
            self.post(case, CHAT, None, json=self.chat(case), headers={"Authorization": value})

    def policy_denials(self) -> None:
        chat = self.chat
        self.post("policy_model_not_allowed", CHAT, "denied", json=chat("policy_model_denied"))
        body = chat("policy_model_not_allowed_stream", stream=True)
        self.stream("policy_model_not_allowed_stream", CHAT, body, role="denied")
        body = self.completion("policy_max_tokens_over_cap", 100)
        self.post("policy_max_tokens_over_cap", COMPLETIONS, json=body)
        self.post("policy_auditor", CHAT, "auditor", json=chat("policy_auditor"))

    def engine_errors(self) -> None:
        """Refused by the engine: a prompt past the context, a bias past the vocabulary."""
        long_prompt = (self.c("context length: repeated prompt") + " ") * 150
        body = self.chat("engine_context_length_chat")
        body["messages"][1]["content"] = long_prompt
        self.post("engine_context_length_chat", CHAT, json=body)
        body = self.completion("engine_context_length_completions", prompt=long_prompt)
        self.post("engine_context_length_completions", COMPLETIONS, json=body)
        body = self.chat("engine_logit_bias_vocabulary", logit_bias={"999999999": 1})
        self.post("engine_logit_bias_vocabulary", CHAT, json=body)

    def embedding_errors(self) -> None:
        """Embedding inputs refused: an empty one, a token id past the vocabulary, one past
        the context (each next to a canaried input that was fine)."""
        fine = self.c("embeddings refused: the fine input")
        long_input = (self.c("embeddings_context_length: long input") + " ") * 100
        cases: tuple[tuple[str, list[Any]], ...] = (
            ("embeddings_empty_input", [fine, ""]),
            ("embeddings_token_vocabulary", [[7, 8], [1, 999_999_999]]),
            ("embeddings_context_length", [fine, long_input]),
        )
        for case, inputs in cases:
            self.post(case, EMBEDDINGS, json={"model": EMBEDDER, "input": inputs})

    def disconnect_mid_stream(self) -> None:
        """Hang up after the first generated text; wait until the server is done with it."""
        # no stop string: the model may echo a canary, which a stop canary's prefix holds back
        body = self.chat("disconnect_mid_stream", 64, stream=True, stop=None)
        with self.http.stream("POST", CHAT, json=body, headers=self.bearer("app")) as resp:
            request_id = resp.headers.get("x-request-id", "")
            self.note("disconnect_mid_stream", resp.status_code, request_id)
            for line in resp.iter_lines():
                assert "[DONE]" not in line
                if line.startswith("data: ") and sse_texts(iter([line]), "content")[0]:
                    break
        self.server.wait_until(
            lambda: any(r.get("request_id") == request_id for r in self.server.request_records()),
            "the disconnected stream's request is over",
        )

    def rate_limits(self) -> None:
        """Team "burst" may send one request a minute: the second and third are refused."""
        self.post("rate_first", CHAT, "burst", json=self.chat("rate_first"))
        self.post("rate_limited", CHAT, "burst", json=self.chat("rate_limited"))
        body = self.chat("rate_limited_stream", stream=True)
        self.stream("rate_limited_stream", CHAT, body, role="burst")


def auth(keys: dict[str, str], role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys[role]}"}


def handed_out(server: Server, keys: dict[str, str]) -> dict[str, bytes]:
    """What the server gives out about past requests: audit exports, Prometheus metrics."""
    out = {}
    for fmt in FORMATS:
        resp = httpx.get(
            f"{server.base_url}/audit/export?format={fmt}", headers=auth(keys, "auditor")
        )
        assert resp.status_code == 200, (fmt, resp.text)
        out[f"audit export (api {fmt})"] = resp.content
    resp = httpx.get(f"{server.base_url}/metrics", headers=auth(keys, "admin"))
    assert resp.status_code == 200, resp.text
    out["metrics exposition (GET /metrics)"] = resp.content
    return out


async def offline_exports(data_dir: Path) -> dict[str, bytes]:
    engine = create_db_engine(database_url(data_dir, ""))
    try:
        return {
            f"audit export (offline {fmt})": b"".join([c async for c in export(engine, fmt)])
            for fmt in FORMATS
        }
    finally:
        await engine.dispose()


def redis_snapshot(client: redis.Redis) -> list[tuple[str, bytes]]:
    """Every key of every Redis database with its value, by type (keys may vanish meanwhile)."""
    entries = []
    for db_name in client.info("keyspace"):
        # (redis-py types every reply loosely: bytes or str; these are bytes, no decoding)
        db: Any = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=int(db_name.removeprefix("db")))
        with db:
            for key in db.scan_iter(count=1000):
                kind = db.type(key).decode()
                parts: list[bytes] = []
                if kind == "string":
                    parts = [db.get(key) or b""]
                elif kind == "hash":
                    parts = [b for kv in db.hgetall(key).items() for b in kv]
                elif kind == "list":
                    parts = db.lrange(key, 0, -1)
                elif kind == "set":
                    parts = list(db.smembers(key))
                elif kind == "zset":
                    parts = [m for m, _ in db.zrange(key, 0, -1, withscores=True)]
                elif kind == "stream":
                    parts = [b for _, fields in db.xrange(key) for kv in fields.items() for b in kv]
                entries.append((f"redis {db_name} {key!r} ({kind})", b"\x00".join([key, *parts])))
    return entries


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Run]:
    """The server, its traffic and a graceful stop; afterwards the Redis keys it made go."""
    client = redis_client()
    root = tmp_path_factory.mktemp("zero-retention")
    data_dir = seed_data_dir(root / "data", model_dir)
    team_keys = asyncio.run(create_team_keys(data_dir))
    keys = keys_of(data_dir)
    key_ids = {name: parse_api_key(k)[0] for name, k in {**keys, **team_keys}.items()}
    (root / "policy.toml").write_text(POLICY)
    config = root / "airgate.toml"
    sink = OtlpSink()  # the traces the server exports, as a collector would keep them
    sink.__enter__()
    config.write_text(
        f"[server]\nmax_request_bytes = {MAX_BODY}\n\n"
        f'[limits]\nredis_url = "redis://{REDIS_HOST}:{REDIS_PORT}/0"\n\n'
        f"[policy]\npath = {json.dumps(str(root / 'policy.toml'))}\n\n"
        f'[telemetry]\notlp_endpoint = "{sink.endpoint}"\n\n'
        # the checkpoint witness: a sink too (under the scanned working directory)
        f"[audit]\nwitness_dir = {json.dumps(str(root / 'cwd' / 'witness'))}\n"
    )
    tmpdir, cwd = root / "tmpdir", root / "cwd"
    tmpdir.mkdir()
    cwd.mkdir()
    (cwd / "witness").mkdir()
    canaries = Canaries()
    started = time.time()
    log_path = root / "server.log"
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            serve_command(port, data_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=clean_env({**SERVER_ENV, "AIRGATE_CONFIG": str(config), "TMPDIR": str(tmpdir)}),
            cwd=cwd,
        )
    server = Server(process, port, data_dir, log_path)
    try:
        try:
            server.wait_ready()
            with (
                httpx.Client(base_url=server.base_url, timeout=120) as http,
                OpenAI(base_url=f"{server.base_url}/v1", api_key=keys["app"], max_retries=0) as sdk,
            ):
                traffic = Driver(server, canaries, {**keys, **team_keys}, http, sdk).run()
                responses = ResponsesDriver(server, canaries, keys, http, sdk)
                responses.traffic = traffic  # the same record: one scan covers all three
                responses.run()
                ollama = OllamaDriver(server, canaries, keys, http, sdk)
                ollama.traffic = traffic
                ollama.run()
            exports = handed_out(server, keys)
        finally:
            stop_and_check(server)  # the last spans are flushed at shutdown
        exports["otlp traces (raw protobuf at the collector)"] = sink.raw_bytes()
        snapshot = redis_snapshot(client)
        exports.update(asyncio.run(offline_exports(data_dir)))
        yield Run(server, tmpdir, cwd, started, canaries, traffic, key_ids, exports, snapshot)
    finally:
        sink.__exit__(None, None, None)
        for key_id in key_ids.values():
            for key in client.scan_iter(match=f"airgate:rl:{{{key_id}}}*"):
                client.delete(key)
        client.close()


# ---- the scan ----------------------------------------------------------------------------------


def regular_files(root: Path) -> Iterator[Path]:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    yield path
            except OSError:
                continue


def sqlite_rows(db_path: Path) -> Iterator[tuple[str, bytes]]:
    """Every row of every table (and the schema itself), each column as raw bytes."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    conn.text_factory = bytes
    try:
        schema = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
        yield f"sqlite {db_path.name} schema", repr(schema).encode()
        for kind, table, _ in schema:
            if kind != b"table":
                continue
            name = table.decode()
            for i, row in enumerate(conn.execute(f'SELECT * FROM "{name}"')):
                cells = [v if isinstance(v, bytes) else str(v).encode() for v in row]
                yield f"sqlite {db_path.name} table {name} row {i}", b"\x00".join(cells)
    finally:
        conn.close()


def sink_files(run: Run) -> Iterator[tuple[str, Path]]:
    yield "server log (stdout+stderr)", run.server.log_path
    for label, root in (
        ("data dir", run.server.data_dir),
        ("TMPDIR", run.tmpdir),
        ("cwd", run.cwd),
    ):
        for path in regular_files(root):
            yield f"{label} file {path.relative_to(root)}", path
    since = run.started - CLOCK_SLACK_S
    for path in regular_files(SHM):
        try:
            st = path.lstat()
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) >= since:
            yield f"/dev/shm file {path.relative_to(SHM)}", path


def scan_all(
    run: Run,
    scanner: Scanner,
    redis_entries: list[tuple[str, bytes]],
    databases: tuple[Path, ...] = (),
) -> list[str]:
    """Every hit of `scanner` in every sink (the server's, plus extra SQLite files)."""
    hits: list[str] = []
    for db_path in (run.server.data_dir / "airgate.db", *databases):
        for label, blob in sqlite_rows(db_path):
            hits += scanner.scan(label, blob)
    for label, blob in redis_entries:
        hits += scanner.scan(label, blob)
    for label, blob in run.exports.items():
        hits += scanner.scan(label, blob)
    for label, path in sink_files(run):
        try:
            hits += scanner.scan_file(label, path)
        except OSError:
            continue  # gone meanwhile (another session's /dev/shm file)
    return hits


def content_needles(run: Run) -> dict[bytes, Describe]:
    needles: dict[bytes, Describe] = {run.canaries.run.encode(): run.canaries.name}
    for i, text in enumerate(run.traffic.completions):
        # only texts long and varied enough never to occur by chance
        if len(text) >= 24 and len(set(text)) >= 8:
            for form in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
                needles[form.encode()] = named(f"completion text #{i} ({text[:40]!r}...)")
    return needles


def named(what: str) -> Describe:
    return lambda _: what


# ---- the tests ---------------------------------------------------------------------------------


def test_every_path_was_taken(run: Run) -> None:
    assert run.traffic.statuses == {**EXPECTED, **RESPONSES_EXPECTED, **OLLAMA_EXPECTED}
    kinds = {
        json.loads(line)["event"]["kind"]
        for line in run.exports["audit export (offline jsonl)"].decode().splitlines()
    }
    assert kinds >= {
        "inference.admitted",
        "inference.completed",
        "inference.failed",
        "inference.cancelled",
        "auth.failure",
        "policy.denied",
        "rate.limited",
        "audit.access",
        "embedding.completed",
    }, kinds
    actions = {
        json.loads(line)["event"].get("action")
        for line in run.exports["audit export (offline jsonl)"].decode().splitlines()
    }
    assert actions >= {"chat.completions", "completions", "responses", "embeddings"}, actions
    assert sum(len(t) >= 24 and len(set(t)) >= 8 for t in run.traffic.completions) >= 6, (
        run.traffic.completions
    )


def test_no_canary_and_no_completion_text_in_any_sink(run: Run) -> None:
    hits = scan_all(run, Scanner(content_needles(run)), run.redis_entries)
    assert hits == [], "content reached a sink:\n" + "\n".join(hits)


def test_the_scan_reads_every_sink(run: Run) -> None:
    """The sinks that must hold a known id do, as the scan sees them."""
    request_id = run.traffic.request_ids["raw_chat_query_string"]
    burst_id = run.key_ids["burst"]
    assert request_id and burst_id
    scanner = Scanner(
        {request_id.encode(): named("request id"), burst_id.encode(): named("key id")}
    )
    hits = scan_all(run, scanner, run.redis_entries)
    sinks = {hit.split(": ")[0] for hit in hits if hit.endswith(": request id")}
    assert any(s.startswith("sqlite airgate.db table audit_events row") for s in sinks), sinks
    assert "server log (stdout+stderr)" in sinks, sinks
    for fmt in FORMATS:
        for origin in ("api", "offline"):
            assert f"audit export ({origin} {fmt})" in sinks, sinks
    assert any(s.startswith("data dir file airgate.db") for s in sinks), sinks
    assert "otlp traces (raw protobuf at the collector)" in sinks, sinks  # spans did arrive
    assert b"vllm:num_requests_running" in run.exports["metrics exposition (GET /metrics)"]
    # the server kept its limits in this Redis (team "burst": a request TAT, keyed by key id)
    redis_hits = [h for h in hits if h.startswith("redis ") and h.endswith(": key id")]
    assert any(f"airgate:rl:{{{burst_id}}}:r" in h for h in redis_hits), redis_hits


def test_the_scan_finds_planted_canaries(run: Run, tmp_path: Path) -> None:
    """A canary planted in TMPDIR (across a chunk boundary), Redis and a SQLite row is found."""
    planted = run.canaries("positive control")
    control_file = run.tmpdir / "planted.bin"
    control_file.write_bytes(b"\x00" * (CHUNK - 10) + planted.encode() + b"\x00" * 100)
    control_db = tmp_path / "planted.db"
    with sqlite3.connect(control_db) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b BLOB, c TEXT)")
        conn.execute("INSERT INTO t VALUES (1, ?, ?)", (b"\x01" + planted.encode(), "-"))
    conn.close()
    client = redis_client()
    redis_key = f"airgate-canary-control:{run.canaries.run}"
    try:
        client.set(redis_key, f"x{planted}x", ex=600)
        entries = redis_snapshot(client)
        hits = scan_all(run, Scanner(content_needles(run)), entries, (control_db,))
    finally:
        client.delete(redis_key)
        client.close()
        control_file.unlink()
    planted_hits = {h.split(": ")[0] for h in hits if "positive control" in h}
    assert planted_hits == {
        "TMPDIR file planted.bin",
        "sqlite planted.db table t row 0",
        f"redis db0 {redis_key.encode()!r} (string)",
    }, hits


# ---- the Responses API (POST /v1/responses): its traffic runs on the same server, after the rest

RESPONSES = "/v1/responses"
RESPONSES_EXPECTED = {
    "responses_items": 200,
    "responses_stream": 200,
    "responses_json_schema": 200,
    "responses_tools_required": 200,
    "responses_tools_stream": 200,
    "responses_previous_response_id": 400,
    "responses_store_true": 400,
    "responses_builtin_tool": 400,
    "responses_image_input": 400,
    "responses_bad_item": 400,
    "responses_context_length": 400,
    "responses_retrieve": 404,
    "responses_delete": 404,
}


class ResponsesDriver(Driver):
    """Responses traffic with a canary in every content field: instructions, input items
    (messages and their text parts, an earlier assistant turn, function calls and their
    outputs), function tools, the `text.format` schema, metadata and user; then refusals."""

    def run(self) -> Traffic:
        successes = (
            self.responses_items,
            self.responses_stream,
            self.responses_json_schema,
            self.responses_tools_required,
            self.responses_tools_stream,
        )
        with ThreadPoolExecutor(len(successes)) as pool:
            for future in [pool.submit(send) for send in successes]:
                future.result()
        self.responses_refusals()
        return self.traffic

    def base(self, case: str, max_output_tokens: int = GEN, **kw: Any) -> dict[str, Any]:
        c = self.c
        return {
            "model": MODEL,
            "instructions": f"A storyteller ({c(f'{case}: instructions')}).",
            "input": f"{STORY} (ticket {c(f'{case}: input')})",
            "max_output_tokens": max_output_tokens,
            "temperature": 0,
            "metadata": {"ticket": c(f"{case}: metadata")},
            "user": c(f"{case}: user field"),
            **kw,
        }

    def function_tools(self, case: str) -> list[dict[str, Any]]:
        return [{"type": "function", **tool["function"]} for tool in self.tools(case)]

    def note_response(self, case: str, status: int, body: dict[str, Any]) -> None:
        self.note(case, status)
        for item in body.get("output", ()):
            if item["type"] == "message":
                self.traffic.completions.append(
                    "".join(part.get("text", "") for part in item["content"])
                )
            elif item["type"] == "function_call":
                self.traffic.completions.append(item["arguments"])

    def responses_items(self) -> None:
        c = self.c
        name = c("items: function name")
        items = [
            {"role": "developer", "content": c("items: developer message")},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": c("items: user text part")}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": c("items: assistant text"), "annotations": []}
                ],
            },
            {
                "type": "function_call",
                "call_id": c("items: call id"),
                "name": name,
                "arguments": json.dumps({"answer": c("items: call arguments")}),
            },
            {
                "type": "function_call_output",
                "call_id": c("items: output call id"),
                "output": c("items: tool output"),
            },
            {"role": "user", "content": f"{STORY} ({c('items: last user message')})"},
        ]
        tools = self.function_tools("items")
        raw = self.sdk.responses.with_raw_response.create(
            **self.base("responses_items", input=items, tools=tools, tool_choice="auto")
        )
        self.note_response("responses_items", raw.status_code, json.loads(raw.content))

    def stream_response(self, case: str, body: dict[str, Any]) -> None:
        """A streamed response read to its final event (completed, or incomplete at the
        max_output_tokens cap, which the SDK's stream helper treats as an error)."""
        with self.http.stream("POST", RESPONSES, json=body, headers=self.bearer("app")) as resp:
            assert resp.status_code == 200, resp.read()
            final: dict[str, Any] = {}
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    if event["type"] in ("response.completed", "response.incomplete"):
                        final = event["response"]
            assert final, f"{case}: the stream ended without its final event"
            self.note_response(case, resp.status_code, final)

    def responses_stream(self) -> None:
        self.stream_response("responses_stream", self.base("responses_stream", stream=True))

    def responses_json_schema(self) -> None:
        fmt = {
            "type": "json_schema",
            "name": self.c("responses: format name"),
            "schema": self.schema("responses text.format"),
        }
        raw = self.sdk.responses.with_raw_response.create(
            **self.base("responses_json_schema", 48, text={"format": fmt})
        )
        self.note_response("responses_json_schema", raw.status_code, json.loads(raw.content))

    def responses_tools_required(self) -> None:
        tools = self.function_tools("responses_tools_required")
        raw = self.sdk.responses.with_raw_response.create(
            **self.base("responses_tools_required", 48, tools=tools, tool_choice="required")
        )
        self.note_response("responses_tools_required", raw.status_code, json.loads(raw.content))

    def responses_tools_stream(self) -> None:
        tools = self.function_tools("responses_tools_stream")
        body = self.base(
            "responses_tools_stream", 48, tools=tools, tool_choice="required", stream=True
        )
        self.stream_response("responses_tools_stream", body)

    def responses_refusals(self) -> None:
        c = self.c
        for case, extra in (
            ("responses_previous_response_id", {"previous_response_id": c("previous id")}),
            ("responses_store_true", {"store": True}),
            ("responses_builtin_tool", {"tools": [{"type": "web_search", "x": c("web")}]}),
            (
                "responses_image_input",
                {
                    "input": [
                        {
                            "role": "user",
                            "content": [{"type": "input_image", "image_url": c("image url")}],
                        }
                    ]
                },
            ),
            ("responses_bad_item", {"input": [{"type": "item_reference", "id": c("item ref")}]}),
            ("responses_context_length", {"input": (c("long input") + " ") * 150}),
        ):
            resp = self.post(case, RESPONSES, json=self.base(case, **extra))
            assert c.run not in resp.text, case  # errors never repeat what was sent
        path = f"{RESPONSES}/resp_{c('retrieved id')}"
        self.get("responses_retrieve", path)
        resp = self.http.delete(path, headers=self.bearer("app"))
        self.note("responses_delete", resp.status_code, resp.headers.get("x-request-id", ""))


# ---- Ollama's API (/api/...): its traffic runs on the same server, after the Responses API's

OLLAMA_EXPECTED = {
    "ollama_chat": 200,
    "ollama_chat_stream": 200,
    "ollama_generate": 200,
    "ollama_generate_stream": 200,
    "ollama_format_schema": 200,
    "ollama_tools": 200,
    "ollama_embed": 200,
    "ollama_bad_option": 400,
    "ollama_generate_context": 400,
    "ollama_unknown_model": 404,
    "ollama_pull": 403,
}


class OllamaDriver(Driver):
    """Ollama traffic with a canary in every content field: messages (and an earlier tool call
    and its result), the system prompt and prompt of generate, stop strings, the `format`
    schema, tools, embed inputs; then refusals whose bodies carry canaries."""

    def run(self) -> Traffic:
        successes = (
            self.ollama_chat,
            self.ollama_chat_stream,
            self.ollama_generate,
            self.ollama_generate_stream,
            self.ollama_format_schema,
            self.ollama_tools,
            self.ollama_embed,
        )
        with ThreadPoolExecutor(len(successes)) as pool:
            for future in [pool.submit(send) for send in successes]:
                future.result()
        self.ollama_refusals()
        return self.traffic

    def options(self, case: str) -> dict[str, Any]:
        return {"temperature": 0, "num_predict": GEN, "stop": [self.c(f"{case}: stop string")]}

    def messages(self, case: str) -> list[dict[str, Any]]:
        c = self.c
        return [
            {"role": "system", "content": f"A storyteller ({c(f'{case}: system')})."},
            {"role": "user", "content": f"{STORY} (ticket {c(f'{case}: user')})"},
        ]

    def note_ollama(self, case: str, resp: httpx.Response, field_name: str) -> None:
        self.note(case, resp.status_code, resp.headers.get("x-request-id", ""))
        body = resp.json()
        message = body.get("message", {})
        self.traffic.completions.append(body.get(field_name) or message.get("content") or "")
        for call in message.get("tool_calls") or ():
            self.traffic.completions.append(json.dumps(call["function"]["arguments"]))

    def ndjson(self, case: str, path: str, body: dict[str, Any], field_name: str) -> None:
        with self.http.stream("POST", path, json=body, headers=self.bearer("app")) as resp:
            assert resp.status_code == 200, resp.read()
            lines = [json.loads(line) for line in resp.iter_lines() if line]
        assert lines and lines[-1]["done"] is True, case
        if field_name == "message":
            text = "".join(line["message"]["content"] for line in lines)
        else:
            text = "".join(line[field_name] for line in lines)
        self.note(case, resp.status_code, resp.headers.get("x-request-id", ""), text=text)

    def chat_body(self, case: str, **kw: Any) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": self.messages(case),
            "options": self.options(case),
            "keep_alive": "5m",
            **kw,
        }

    def generate_body(self, case: str, **kw: Any) -> dict[str, Any]:
        c = self.c
        return {
            "model": MODEL,
            "system": f"A storyteller ({c(f'{case}: system')}).",
            "prompt": f"{STORY} (ticket {c(f'{case}: prompt')})",
            "options": self.options(case),
            **kw,
        }

    def ollama_chat(self) -> None:
        resp = self.post(
            "ollama_chat", "/api/chat", json=self.chat_body("ollama_chat", stream=False)
        )
        self.note_ollama("ollama_chat", resp, "message")

    def ollama_chat_stream(self) -> None:
        self.ndjson(
            "ollama_chat_stream", "/api/chat", self.chat_body("ollama_chat_stream"), "message"
        )

    def ollama_generate(self) -> None:
        body = self.generate_body("ollama_generate", stream=False)
        self.note_ollama(
            "ollama_generate", self.post("ollama_generate", "/api/generate", json=body), "response"
        )

    def ollama_generate_stream(self) -> None:
        body = self.generate_body("ollama_generate_stream", raw=True)
        self.ndjson("ollama_generate_stream", "/api/generate", body, "response")

    def ollama_format_schema(self) -> None:
        body = self.chat_body("ollama_format", stream=False, format=self.schema("ollama_format"))
        body["options"]["num_predict"] = 48
        resp = self.post("ollama_format_schema", "/api/chat", json=body)
        self.note_ollama("ollama_format_schema", resp, "message")

    def ollama_tools(self) -> None:
        c = self.c
        tools = self.tools("ollama_tools")
        name = tools[0]["function"]["name"]
        messages = [
            *self.messages("ollama_tools"),
            {
                "role": "assistant",
                "content": c("ollama_tools: assistant text"),
                "tool_calls": [
                    {"function": {"name": name, "arguments": {"answer": c("ollama_tools: args")}}}
                ],
            },
            {"role": "tool", "content": c("ollama_tools: tool result"), "tool_name": name},
            {"role": "user", "content": f"{STORY} ({c('ollama_tools: last user message')})"},
        ]
        body = self.chat_body("ollama_tools", stream=False, messages=messages, tools=tools)
        body["options"]["num_predict"] = 48
        self.note_ollama(
            "ollama_tools", self.post("ollama_tools", "/api/chat", json=body), "message"
        )

    def ollama_embed(self) -> None:
        c = self.c
        body = {
            "model": EMBEDDER,
            "input": [c("ollama_embed: input 1"), c("ollama_embed: input 2")],
        }
        resp = self.post("ollama_embed", "/api/embed", json=body)
        assert len(resp.json()["embeddings"]) == 2

    def ollama_refusals(self) -> None:
        c = self.c
        for case, path, body in (
            (
                "ollama_bad_option",
                "/api/chat",
                self.chat_body("ollama_bad_option", options={"mirostat": 2}),
            ),
            (
                "ollama_generate_context",
                "/api/generate",
                self.generate_body("ollama_generate_context", context=[1, 2, 3]),
            ),
            (
                "ollama_unknown_model",
                "/api/chat",
                self.chat_body("x", model=c("ollama model name")),
            ),
            ("ollama_pull", "/api/pull", {"model": c("ollama pull model")}),
        ):
            resp = self.post(case, path, json=body)
            assert c.run not in resp.text, case  # errors never repeat what was sent
            assert list(resp.json()) == ["error"], case
