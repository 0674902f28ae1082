"""Request decoding with OpenAI-style errors that never repeat client values."""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from ..errors import InvalidRequest, UnsupportedParameter

__all__ = ["decode"]

T = TypeVar("T")
_FIELD = re.compile(r"`([A-Za-z0-9_.\-]{1,64})`")


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
    # The path is the last " - at " part (a value could contain the separator).
    message, _, where = text.rpartition(" - at ")
    if not _:
        message, where = text, ""
    param = _param(where) if where else None
    if message.startswith("Object contains unknown field"):
        found = _FIELD.search(message)
        if found is None:
            return UnsupportedParameter(
                "The request contains a parameter this server does not support.", param=param
            )
        name = found.group(1)
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
    target = f"'{param}'" if param else "the request body"
    # msgspec's "Expected `int` >= 1" / "Expected `str`, got `int`" name only types and bounds;
    # any message that quotes something may be quoting the client's value, so it is not used.
    if message.startswith("Expected") and "'" not in message and '"' not in message:
        return InvalidRequest(
            f"Invalid value for {target}: {message.replace('`', '')}.", param=param
        )
    return InvalidRequest(f"Invalid value for {target}.", param=param)
