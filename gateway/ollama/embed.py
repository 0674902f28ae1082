"""POST /api/embed and the legacy POST /api/embeddings: Ollama's embeddings <-> the pipeline's
facts (action "embeddings", as /v1/embeddings) and its vectors.

Vectors are L2-normalised (as /api/embed's are in Ollama; its legacy route's are not, here they
are).  airgate never truncates an input: one longer than the model's context is a 400 whatever
`truncate` says (Ollama's answer with `truncate: false`).  An empty input is a "load the model"
request: checked, answered with no vectors.  `options` are accepted (num_ctx checked), as they
change nothing about an embedding.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.di import NamedDependency

from ..errors import InvalidRequest
from ..http.authn import caller
from ..http.decode import decode
from ..http.request_log import RequestInfo, request_info
from ..pipeline import EmbeddingInputs, Generation, InferenceRequest, Pipeline
from . import types as t
from .models import visible
from .ndjson import Timing
from .options import Options
from .reply import check_num_ctx

__all__ = ["MAX_INPUTS", "embed", "embeddings"]

MAX_INPUTS = 2048  # inputs per request, as /v1/embeddings allows
_embed = msgspec.json.Decoder(t.EmbedRequest)
_legacy = msgspec.json.Decoder(t.LegacyEmbeddingsRequest)
_encode = msgspec.json.Encoder().encode
_NO_GENERATION = Generation()


def _inputs(value: str | list[str]) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"input may hold at most {MAX_INPUTS} items.", param="input")
    for i, item in enumerate(items):
        if not item:
            where = "input" if isinstance(value, str) else f"input[{i}]"
            raise InvalidRequest(f"{where} must not be empty.", param=where)
    return tuple(items)


async def _vectors(
    request: Request[Any, Any, Any],
    inference: Pipeline,
    log: RequestInfo,
    *,
    model: str,
    raw: bytes,
    texts: tuple[str, ...],
    options: Options | None,
    dimensions: int | None,
    param: str,
) -> tuple[list[list[float]], int, dict[str, str]]:
    """The vectors of `texts` (one each), the tokens they took and the response headers (the
    limits'), through the pipeline; an empty `texts` only checks the model."""
    check_num_ctx(request, inference, model, options)
    if not texts:
        served = inference.models.resolve(model)
        visible(inference.security, caller(request), served)
        if served.task != "embed":
            raise InvalidRequest("this model does not create embeddings", param="model")
        return [], 0, {}
    sampling: dict[str, bool | int | float] = {}
    if dimensions is not None:
        sampling["dimensions"] = dimensions
    facts = InferenceRequest(
        request_id=log.request_id,
        principal=caller(request),
        action="embeddings",
        route=log.route,
        model=model,
        prompt_bytes=len(raw),
        stream=False,
        generation=_NO_GENERATION,
        sampling=sampling,
        prompt_param=param,
        traceparent=request.headers.get("traceparent"),
        embedding=EmbeddingInputs(inputs=texts, dimensions=dimensions),
    )
    done = await inference.embed(facts, log)
    vectors: list[list[float]] = np.asarray(done.result.vectors).tolist()
    return vectors, sum(done.result.prompt_tokens), done.headers


@post("/api/embed", status_code=200)
async def embed(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Embed one input or several (Ollama-compatible): one L2-normalised vector each."""
    log = request_info(request.scope)
    timing = Timing(log.started)
    raw = await request.body()
    body = decode(_embed, raw)
    texts = () if body.input in ("", []) else _inputs(body.input)
    vectors, tokens, headers = await _vectors(
        request,
        inference,
        log,
        model=body.model,
        raw=raw,
        texts=texts,
        options=body.options,
        dimensions=body.dimensions,
        param="input",
    )
    reply = t.EmbedReply(body.model, vectors, timing.elapsed_ns(), 0, tokens)
    return Response(_encode(reply), media_type="application/json", headers=headers)


@post("/api/embeddings", status_code=200)
async def embeddings(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Embed one prompt (Ollama's legacy route): `{"embedding": [...]}`."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_legacy, raw)
    vectors, _, headers = await _vectors(
        request,
        inference,
        log,
        model=body.model,
        raw=raw,
        texts=(body.prompt,) if body.prompt else (),
        options=body.options,
        dimensions=None,
        param="prompt",
    )
    return Response(
        _encode(t.EmbeddingReply(vectors[0] if vectors else [])),
        media_type="application/json",
        headers=headers,
    )
