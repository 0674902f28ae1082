"""Bad input through the `openai` SDK and raw HTTP: the OpenAI error envelope, never a 500, and
never the client's content — not in the error, not in the log.

Every request carries a unique canary in its content and its own X-Request-Id, and the seeded
app key unless the case is about the key; the last test reads the server log back: no canary and
no key anywhere, exactly one JSON line per request, naming the caller by key id.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from server_process import MODEL, NO_END, Server

from gateway.access.auth import generate_api_key, parse_api_key

pytestmark = pytest.mark.e2e

CANARIES: list[str] = []
SENT: dict[str, tuple[int, str | None]] = {}  # X-Request-Id -> (status, X-Request-Id echoed)
MAX_BODY = 4 * 1024 * 1024  # server.max_request_bytes default
ANY = object()
SDK_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    404: openai.NotFoundError,
}
APP_KEY, NO_KEY, UNKNOWN_KEY = "app", "none", "unknown"  # the credential a case sends


def canary() -> str:
    """A string unique to this run; it must never come back in an error nor reach the log."""
    value = f"canary{uuid.uuid4().hex}"
    CANARIES.append(value)
    return value


def chat(secret: str, **kw: Any) -> dict[str, Any]:
    content = f"my secret is {secret}"
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **kw,
    }


def completion(secret: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"my secret is {secret}", "max_tokens": 4, **kw}


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    secret: str
    body: dict[str, Any] | bytes | None
    method: str
    path: str
    param: object
    code: object
    message_has: tuple[str, ...]
    key: str


def case(
    id: str,
    status: int,
    body: Callable[[str], dict[str, Any] | bytes | None],
    *,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    param: object = ANY,
    code: object = ANY,
    message_has: tuple[str, ...] = (),
    key: str = APP_KEY,
) -> Case:
    """A bad request; `body` builds it around a fresh canary."""
    secret = canary()
    return Case(id, status, secret, body(secret), method, path, param, code, message_has, key)


def _malformed(s: str) -> bytes:
    return (
        '{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "' + s + '"}'
    ).encode()


def _image(s: str) -> dict[str, Any]:
    parts = [
        {"type": "text", "text": s},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{s}"}},
    ]
    return {"model": MODEL, "messages": [{"role": "user", "content": parts}]}


def _tools(s: str) -> list[dict[str, Any]]:
    """A tool whose parameters ask for what constrained decoding cannot enforce, the canary
    beside it (a description) and under it (a property name)."""
    parameters = {"type": "object", "properties": {s: {"type": "integer", "minimum": 1}}}
    return [
        {
            "type": "function",
            "function": {"name": "lookup", "description": s, "parameters": parameters},
        }
    ]


def _big(s: str) -> dict[str, Any]:
    body = chat((s + " ") * (MAX_BODY // (len(s) + 1) + 1000))
    assert len(json.dumps(body)) > MAX_BODY
    return body


BAD_PARAM = "unsupported_parameter"
TOO_LONG = "context_length_exceeded"
# OpenAI's opening sentence, which litellm reads to raise ContextWindowExceededError
TOO_LONG_OPENING = "This model's maximum context length is 2048 tokens. However, you requested"
COMPLETIONS = "/v1/completions"
CASES = [
    case("malformed_json", 400, _malformed, param=None, message_has=("JSON",)),
    case("max_tokens_wrong_type", 400, lambda s: chat(s, max_tokens="ten"), param="max_tokens"),
    case("max_tokens_is_the_canary", 400, lambda s: chat(s, max_tokens=s), param="max_tokens"),
    case("negative_max_tokens", 400, lambda s: chat(s, max_tokens=-5), param="max_tokens"),
    case("absurd_max_tokens", 400, lambda s: chat(s, max_tokens=10**7), param="max_tokens"),
    case(
        "max_tokens_past_context",  # within the policy's max_tokens cap (4096)
        400,
        lambda s: chat(s, max_tokens=4000),
        code=TOO_LONG,
        message_has=(TOO_LONG_OPENING, "4000 in the completion"),
    ),
    case("n_9", 400, lambda s: chat(s, n=9), param="n"),  # at most 8 choices
    case("n_9_streaming", 400, lambda s: chat(s, n=9, stream=True), param="n"),
    case(
        "tool_parameters_not_enforceable",
        400,
        lambda s: chat(s, tools=_tools(s)),
        param="tools[0].function.parameters",
        message_has=("'minimum'",),
    ),
    case(
        "unknown_model",
        404,
        lambda s: {**chat(s), "model": f"m-{s}"},
        param="model",
        code="model_not_found",
    ),
    case("body_too_large", 413, _big, code="request_too_large"),
    case(
        "prompt_too_long",
        400,
        lambda s: chat((s + " ") * 400),
        param="messages",
        code=TOO_LONG,
        message_has=(
            TOO_LONG_OPENING,
            "in the messages,",
            "Please reduce the length of the messages",
        ),
    ),
    case("unknown_route", 404, chat, path="/v1/no-such-route", code="not_found"),
    case("wrong_method_put", 405, chat, method="PUT", code="method_not_allowed"),
    case(
        "wrong_method_get",
        405,
        lambda s: None,
        method="GET",
        path=COMPLETIONS,
        code="method_not_allowed",
    ),
    case(
        "empty_messages",
        400,
        lambda s: {"model": MODEL, "messages": [], "user": s},
        param="messages",
    ),
    case("image_content_part", 400, _image, param="messages[0].content[1].type", code=BAD_PARAM),
    case(
        "role_is_the_canary",
        400,
        lambda s: {"model": MODEL, "messages": [{"role": s, "content": s}]},
    ),
    case("temperature_out_of_range", 400, lambda s: chat(s, temperature=3.5), param="temperature"),
    case(
        "logit_bias_key_is_the_canary",
        400,
        lambda s: chat(s, logit_bias={s: 1}),
        param="logit_bias",
    ),
    case(
        "logit_bias_past_vocabulary",
        400,
        lambda s: chat(s, logit_bias={"999999999": 1}),
        param="logit_bias",
    ),
    case(
        "completion_mixed_prompt_list",
        400,
        lambda s: completion(s, prompt=[s, 5]),
        path=COMPLETIONS,
        param="prompt",
    ),
    case(
        "completion_prompt_too_long",
        400,
        lambda s: completion(s, prompt=(s + " ") * 400),
        path=COMPLETIONS,
        param=ANY,
        code=TOO_LONG,
        message_has=(TOO_LONG_OPENING, "in the prompt,", "Please reduce the length of the prompt"),
    ),
    case(
        "completion_unknown_parameter",
        400,
        lambda s: completion(s, suffix=s),
        path=COMPLETIONS,
        param="suffix",
        code=BAD_PARAM,
        message_has=("suffix",),
    ),
    case("missing_api_key", 401, chat, param=None, code="invalid_api_key", key=NO_KEY),
    case("unknown_api_key", 401, chat, param=None, code="invalid_api_key", key=UNKNOWN_KEY),
    case(
        "unknown_api_key_on_an_unknown_route",
        401,
        chat,
        path="/v1/no-such-route",
        code="invalid_api_key",
        key=UNKNOWN_KEY,
    ),
]


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    """Sends no key by itself: each request names its own (`credential`)."""
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.key(), max_retries=0, timeout=120
    ) as c:
        yield c


def credential(server: Server, key: str = APP_KEY) -> dict[str, str]:
    """The Authorization header a request with `key` sends (none for NO_KEY)."""
    if key == NO_KEY:
        return {}
    text = generate_api_key() if key == UNKNOWN_KEY else server.key(key)
    return {"Authorization": f"Bearer {text}"}


def sdk_call(client: OpenAI, case: Case, headers: dict[str, Any]) -> Any:
    """The case through the SDK: its typed `create` where the SDK has one, else its raw methods."""
    body, path = case.body, case.path.removeprefix("/v1")
    typed = {
        "/chat/completions": client.chat.completions.create,
        "/completions": client.completions.create,
    }
    if case.method == "POST" and isinstance(body, dict) and path in typed:
        create = typed[path]
        known = inspect.signature(create).parameters
        kwargs = {k: v for k, v in body.items() if k in known}
        extra = {k: v for k, v in body.items() if k not in known}
        return create(**kwargs, extra_body=extra or None, extra_headers=headers)
    if isinstance(body, bytes):
        options: Any = {"headers": {**headers, "Content-Type": "application/json"}}
        return client.post(path, cast_to=object, content=body, options=options)
    method = getattr(client, case.method.lower())
    if body is None:
        return method(path, cast_to=object, options={"headers": headers})
    return method(path, cast_to=object, body=body, options={"headers": headers})


def check_envelope(case: Case, status: int, payload: Any, text: str) -> None:
    assert status != 500
    assert status == case.status, text[:2000]
    assert case.secret not in text
    assert set(payload) == {"error"}
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    if case.param is not ANY:
        assert error["param"] == case.param
    if case.code is not ANY:
        assert error["code"] == case.code
    for needle in case.message_has:
        assert needle in error["message"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_envelope_over_http(server: Server, http: httpx.Client, case: Case) -> None:
    rid = f"e2e-http-{case.id}"
    headers = {"X-Request-Id": rid, **credential(server, case.key)}
    if isinstance(case.body, bytes):
        headers["Content-Type"] = "application/json"
        response = http.request(case.method, case.path, content=case.body, headers=headers)
    else:
        response = http.request(case.method, case.path, json=case.body, headers=headers)
    SENT[rid] = (response.status_code, response.headers.get("x-request-id"))
    assert response.headers["content-type"].startswith("application/json")
    check_envelope(case, response.status_code, response.json(), response.text)
    if case.status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_envelope_through_the_sdk(server: Server, client: OpenAI, case: Case) -> None:
    rid = f"e2e-sdk-{case.id}"
    headers: dict[str, Any] = {"X-Request-Id": rid}
    if case.key != APP_KEY:  # the client sends the app key unless told otherwise
        headers["Authorization"] = credential(server, case.key).get("Authorization", openai.Omit())
    with pytest.raises(openai.APIStatusError) as caught:
        sdk_call(client, case, headers)
    exc = caught.value
    SENT[rid] = (exc.status_code, exc.response.headers.get("x-request-id"))
    assert exc.status_code == case.status
    assert type(exc) is SDK_ERRORS.get(case.status, openai.APIStatusError)
    envelope = exc.response.json()
    check_envelope(case, exc.status_code, envelope, exc.response.text)
    assert exc.body == envelope["error"]
    assert exc.code == envelope["error"]["code"]
    assert exc.param == envelope["error"]["param"]
    assert case.secret not in str(exc)


def test_refused_stream_is_a_json_error_not_an_event_stream(
    server: Server, http: httpx.Client
) -> None:
    s = canary()
    rid = "e2e-http-stream-refused"
    body = chat((s + " ") * 400, stream=True)
    headers = {"X-Request-Id": rid, **credential(server)}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        text = r.read().decode()
    SENT[rid] = (r.status_code, r.headers.get("x-request-id"))
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert s not in text
    assert json.loads(text)["error"]["code"] == TOO_LONG


def test_log_holds_no_canary_and_one_line_per_request(
    server: Server, client: OpenAI, http: httpx.Client
) -> None:
    """Zero retention: the content of served requests (prompts and completions) stays out too.

    Runs last in the module so that it also checks every request the tests above sent."""
    s = canary()
    served = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Repeat after me: {s} {s}"}],
        max_tokens=8,
        temperature=0,
        logit_bias=NO_END,
        extra_headers={"X-Request-Id": "e2e-ok-chat"},
    )
    SENT["e2e-ok-chat"] = (served.status_code, served.headers.get("x-request-id"))
    assert served.parse().choices[0].finish_reason == "length"
    with client.completions.with_streaming_response.create(
        model=MODEL,
        prompt=f"{s} {s} {s}",
        max_tokens=8,
        temperature=0,
        logit_bias=NO_END,
        stream=True,
        extra_headers={"X-Request-Id": "e2e-ok-stream"},
    ) as streamed:
        SENT["e2e-ok-stream"] = (streamed.status_code, streamed.headers.get("x-request-id"))
        assert "".join(c.choices[0].text for c in streamed.parse() if c.choices)
    refused = http.post(
        "/v1/chat/completions",
        json=chat(s, n=9),
        headers={"X-Request-Id": "e2e-refused", **credential(server)},
    )
    SENT["e2e-refused"] = (refused.status_code, refused.headers.get("x-request-id"))
    assert refused.status_code == 400
    last = http.get("/health", headers={"X-Request-Id": "e2e-last"})
    SENT["e2e-last"] = (last.status_code, last.headers.get("x-request-id"))

    def lines_for(rid: str) -> list[dict[str, Any]]:
        # logged under the server's id (the x-request-id it answered with), never the client's
        served_id = SENT[rid][1]
        return [r for r in server.request_records() if r.get("request_id") == served_id]

    # A request is logged once its response is complete, which may be just after the client saw
    # it: wait for the last one, then (briefly) for any other still missing.
    server.wait_until(lambda: bool(lines_for("e2e-last")), "the last request logged")
    with contextlib.suppress(AssertionError):  # reported below, by name
        server.wait_until(
            lambda: all(lines_for(rid) for rid in SENT), "every request logged", deadline_s=10
        )
    log = server.log_text()
    leaked = [c for c in CANARIES if c in log]
    assert not leaked, f"{len(leaked)} of {len(CANARIES)} canaries reached the log"
    app_key = server.key()
    key_id, secret = parse_api_key(app_key)
    assert app_key not in log and secret not in log
    unlogged = sorted(rid for rid in SENT if not lines_for(rid))
    assert not unlogged, f"requests with no log line: {unlogged}"
    no_header = sorted(rid for rid, (_, served) in SENT.items() if not served or served == rid)
    assert not no_header, f"responses without a server-made X-Request-Id: {no_header}"
    assert not [r for r in server.request_records() if r.get("request_id") in SENT]
    records = server.request_records()
    for status, served in SENT.values():
        (line,) = [r for r in records if r.get("request_id") == served]
        assert line["status"] == status
        assert isinstance(line["latency_ms"], (int, float)) and line["latency_ms"] >= 0
        # the caller, by key id; nobody for a probe or a request that was not authenticated
        authenticated = status != 401 and line["path"] != "/health"
        assert line.get("key_id") == (key_id if authenticated else None), line
    assert lines_for("e2e-ok-chat")[0]["completion_tokens"] == 8
    for record in records:  # every request line, including ones this module did not tag
        assert {"request_id", "status", "latency_ms", "method", "path"} <= set(record)
