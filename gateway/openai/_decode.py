"""Request decoding with OpenAI-style errors that never repeat client values."""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from ..errors import InvalidRequest, UnsupportedParameter

__all__ = ["decode"]

T = TypeVar("T")
_QUOTED = re.compile(r"'[^']*'")
_FIELD = re.compile(r"`([^`]{1,64})`")


def _param(where: str) -> str | None:
    path = where.strip().strip("`").removeprefix("$").lstrip(".")
    return path or None


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _translate(str(exc)) from None
    except msgspec.DecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request: it is not valid JSON "
            "(the OpenAI API expects a JSON object)."
        ) from None


def _translate(text: str) -> InvalidRequest:
    message, _, where = text.partition(" - at ")
    param = _param(where) if where else None
    if message.startswith("Object contains unknown field"):
        found = _FIELD.search(message)
        name = found.group(1) if found else "?"
        full = f"{param}.{name}" if param else name
        return UnsupportedParameter(
            f"Unsupported parameter: '{full}' is not supported by this server.", param=full
        )
    if message.startswith("Object missing required field"):
        found = _FIELD.search(message)
        name = found.group(1) if found else "?"
        full = f"{param}.{name}" if param else name
        return InvalidRequest(f"Missing required parameter: '{full}'.", param=full)
    if message.startswith("Expected `object`") and param is None:
        return InvalidRequest("The request body must be a JSON object.")
    # Type and range errors: keep msgspec's description of what was expected, drop any value.
    detail = _QUOTED.sub("value", message).replace("`", "")
    target = f"'{param}'" if param else "the request body"
    return InvalidRequest(f"Invalid value for {target}: {detail}.", param=param)
