"""What chat and completions share: their sampling fields -> the engine's SamplingParams, the
audit log's numbers and stop strings; the pipeline's `InferenceRequest` around a `Generation`;
and the engine's finish reason -> OpenAI's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from litestar import Request

from backends.types import GenerationDelta, SamplingParams

from ..errors import InvalidRequest
from ..http.authn import caller
from ..http.request_log import RequestInfo
from ..pipeline import Action, Generation, InferenceRequest

__all__ = [
    "audit_sampling",
    "finish_reason",
    "inference_request",
    "sampling_params",
    "stop_strings",
]

_TOKEN_ID = re.compile(r"[0-9]{1,9}")  # ASCII digits only; the engine checks the vocabulary


def sampling_params(body: Any) -> SamplingParams:
    """Sampling from the fields chat and completions share (validated ranges already)."""
    bias: list[tuple[int, float]] = []
    for key, value in (body.logit_bias or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise InvalidRequest(
                "logit_bias keys must be token ids (decimal integers as strings).",
                param="logit_bias",
            )
        bias.append((int(key), float(value)))
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        min_p=body.min_p or 0.0,
        seed=None if body.seed is None else body.seed & 0xFFFFFFFF,
        repetition_penalty=body.repetition_penalty or 1.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=tuple(bias),
    )


_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
)


def audit_sampling(body: Any) -> dict[str, bool | int | float]:
    """The request's sampling parameters for the audit log: numbers and flags only."""
    out: dict[str, bool | int | float] = {"stream": bool(body.stream)}
    for name in _SAMPLING_FIELDS:
        value = getattr(body, name, None)
        if isinstance(value, bool | int | float):
            out[name] = value
    return out


def finish_reason(delta: GenerationDelta) -> str:
    """OpenAI's finish_reason for a final delta (an abort only reaches a client that stayed)."""
    return "stop" if delta.finish_reason == "abort" else (delta.finish_reason or "stop")


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def inference_request(
    request: Request[Any, Any, Any],
    log: RequestInfo,
    body: Any,
    raw: bytes,
    generation: Generation,
    *,
    action: Action,
    prompt_param: str,
) -> InferenceRequest:
    """The pipeline's facts of a chat or completions request (`body` decoded from `raw`)."""
    return InferenceRequest(
        request_id=log.request_id,
        principal=caller(request),
        action=action,
        route=log.route,
        model=body.model,
        prompt_bytes=len(raw),
        stream=bool(body.stream),
        generation=generation,
        sampling=audit_sampling(body),
        prompt_param=prompt_param,
        n=body.n or 1,
        traceparent=request.headers.get("traceparent"),
    )
