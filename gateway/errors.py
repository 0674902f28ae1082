"""Gateway errors and their one rendering: the OpenAI error envelope, or Ollama's
`{"error": "..."}` on Ollama's routes (`/api/...`; `error_body_for` picks by path).

    GatewayError                       500 server_error           (base; never raised bare)
    ├── InvalidRequest                 400 invalid_request_error
    │   ├── UnsupportedParameter       400 ... code=unsupported_parameter
    │   └── ContextLengthExceeded      400 ... code=context_length_exceeded
    ├── Unauthenticated                401 invalid_request_error  code=invalid_api_key
    ├── PermissionDenied               403 invalid_request_error  code=permission_denied
    │   ├── PolicyDenied               403 ... code=<the policy decision's code>
    │   └── ModelExpired               403 ... code=model_expired (an imported bundle lapsed)
    ├── NotFound                       404 invalid_request_error  code=not_found
    │   └── ModelNotFound              404 ... code=model_not_found
    ├── MethodNotAllowed               405 invalid_request_error  code=method_not_allowed
    ├── RequestTooLarge                413 invalid_request_error  code=request_too_large
    ├── Overloaded                     429 rate_limit_error       code=engine_overloaded
    ├── RateLimited                    429 rate_limit_error       code=rate_limit_exceeded
    ├── ServiceUnavailable             503 server_error           code=service_unavailable
    ├── ClientClosedRequest            499 invalid_request_error  code=client_disconnected
    └── InternalError                  500 server_error           code=internal_error

Every message is written by us: it may name a parameter, never repeat what the client sent
(a prompt must never come back in an error, nor reach a log through one).
"""

from __future__ import annotations

import contextlib
import logging
import math
import traceback
from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

from backends import errors as engine_errors

__all__ = [
    "ClientClosedRequest",
    "ContextLengthExceeded",
    "GatewayError",
    "InternalError",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelExpired",
    "ModelNotFound",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "PolicyDenied",
    "RateLimited",
    "RequestTooLarge",
    "ServiceUnavailable",
    "Unauthenticated",
    "UnsupportedParameter",
    "error_body",
    "error_body_for",
    "exception_handlers",
    "ollama_error_body",
    "translate_engine_errors",
]

_log = logging.getLogger("airgate.errors")


class GatewayError(Exception):
    status_code: int = 500
    type: ClassVar[str] = "server_error"
    code: str | None = None  # a class default; PolicyDenied sets its own per instance

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}


class InvalidRequest(GatewayError):
    status_code = 400
    type = "invalid_request_error"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthenticated(GatewayError):
    status_code = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status_code = 403
    type = "invalid_request_error"
    code = "permission_denied"


class PolicyDenied(PermissionDenied):
    """Denied by policy; `code` is the decision's code (e.g. model_not_allowed)."""

    def __init__(self, message: str, *, decision_code: str, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.code = decision_code


class ModelExpired(PermissionDenied):
    """The model's bundle is past its offline window or validity: HQ must renew it."""

    code = "model_expired"


class NotFound(GatewayError):
    status_code = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status_code = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTooLarge(GatewayError):
    status_code = 413
    type = "invalid_request_error"
    code = "request_too_large"


class Overloaded(GatewayError):
    status_code = 429
    type = "rate_limit_error"
    code = "engine_overloaded"


class RateLimited(GatewayError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServiceUnavailable(GatewayError):
    status_code = 503
    type = "server_error"
    code = "service_unavailable"


class ClientClosedRequest(GatewayError):
    """The client went away before its answer was ready (nginx's 499): nobody reads this
    response, but the request log and the metrics show why the request ended."""

    status_code = 499
    type = "invalid_request_error"
    code = "client_disconnected"


class InternalError(GatewayError):
    code = "internal_error"


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorDetail


_encode = msgspec.json.Encoder().encode


class OllamaError(msgspec.Struct):
    error: str


OLLAMA_PREFIX = "/api/"  # Ollama's routes (gateway/ollama): no other route lives under it


def error_body(exc: GatewayError) -> bytes:
    """The OpenAI error envelope (every route but Ollama's)."""
    return _encode(ErrorEnvelope(ErrorDetail(exc.message, exc.type, exc.param, exc.code)))


def ollama_error_body(exc: GatewayError) -> bytes:
    """Ollama's error shape, `{"error": "<message>"}` (its clients read that one string)."""
    return _encode(OllamaError(exc.message))


def error_body_for(path: str, exc: GatewayError) -> bytes:
    """The error body a client of `path` reads: Ollama's shape on its routes, else OpenAI's."""
    return ollama_error_body(exc) if path.startswith(OLLAMA_PREFIX) else error_body(exc)


@contextlib.contextmanager
def translate_engine_errors(prompt_param: str = "messages") -> Iterator[None]:
    """Turn engine exceptions into gateway errors at the seam."""
    try:
        yield
    except engine_errors.ContextLengthExceeded as exc:
        param = prompt_param if exc.index is None else f"{prompt_param}[{exc.index}]"
        raise ContextLengthExceeded(exc.message(prompt_param), param=param) from exc
    except engine_errors.InvalidGenerationRequest as exc:
        raise InvalidRequest(str(exc), param=exc.param) from exc
    except engine_errors.EngineOverloaded as exc:
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        raise Overloaded(str(exc) + "; retry later", headers={"Retry-After": retry}) from exc
    except engine_errors.EngineNotReady as exc:
        raise ServiceUnavailable(str(exc), headers={"Retry-After": "5"}) from exc
    except engine_errors.EngineFailure as exc:
        raise InternalError("the engine failed while generating") from exc


def _render(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    return Response(
        error_body_for(request.scope.get("path", ""), exc),
        status_code=exc.status_code,
        media_type="application/json",
        headers=exc.headers,
    )


def _note(request: Request[Any, Any, Any], exc: GatewayError) -> None:
    # the request log's error field (the state is set by the request-log middleware)
    info = request.scope.get("state", {}).get("airgate")
    if info is not None and info.error_code is None:
        info.error_code = exc.code or exc.type


def _on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    _note(request, exc)
    return _render(request, exc)


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    # Litestar's own errors (routing, body limit, its validation): our envelope, our words.
    status = exc.status_code
    mapped: GatewayError
    if status == 404:
        mapped = NotFound("no such route")
    elif status == 405:
        mapped = MethodNotAllowed("method not allowed on this route")
    elif status == 413:
        mapped = RequestTooLarge("the request body is larger than this server accepts")
    elif status == 503:
        mapped = ServiceUnavailable("service unavailable")
    elif 400 <= status < 500:
        mapped = InvalidRequest("invalid request")
        mapped.status_code = status
    else:
        return _on_unexpected(request, exc)
    _note(request, mapped)
    response = _render(request, mapped)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The type and the frames only: an exception's message may carry request content.
    frames = "".join(traceback.format_tb(exc.__traceback__))
    _log.error(
        "unhandled %s on %s %s\n%s", type(exc).__name__, request.method, request.url.path, frames
    )
    err = InternalError("internal error")
    _note(request, err)
    return _render(request, err)


exception_handlers: dict[type[Exception] | int, Any] = {
    GatewayError: _on_gateway_error,
    HTTPException: _on_http_exception,
    Exception: _on_unexpected,
}
