"""Embeddings through the pipeline: the same admission, routing and audit as a generation,
with one engine call instead of a stream.

    embed(pipeline, request)   resolve the model (it must embed) -> admit (policy with action
                               "embeddings", limits reserving the inputs' size, `inference.
                               admitted`) -> route -> engine.embed (another deployment, once,
                               if this one fails) -> `embedding.completed` with counts only

The limiter settles on the tokens the inputs really took; the vectors go back to the adapter
and nowhere else (they are content: never logged, audited or traced).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from backends.types import EmbeddingRequest, EmbeddingResult

from ..engines.registry import ServedModel
from ..errors import GatewayError, InvalidRequest, translate_engine_errors
from ..routing import Lease
from ..telemetry.traces import InferenceSpan
from .admission import admit
from .attempts import deployment_failed
from .completion import Admitted
from .facts import InferenceRequest, Progress, Record

if TYPE_CHECKING:
    from .run import Pipeline

__all__ = ["Embedded", "embed"]


class Embedded:
    """An embeddings answer: the vectors and their token counts, and the response headers."""

    __slots__ = ("headers", "model", "result")

    def __init__(self, model: ServedModel, result: EmbeddingResult, headers: dict[str, str]):
        self.model = model
        self.result = result
        self.headers = headers


def check_dimensions(model: ServedModel, dimensions: int | None) -> None:
    """A `dimensions` the model cannot give is the client's mistake (400, before admission)."""
    if dimensions is None:
        return
    engine = model.deployments[0].engine
    size = engine.embedding_size or 0
    if dimensions > size or (dimensions != size and not engine.truncatable):
        raise InvalidRequest(
            f"dimensions must be {size} for this model: it cannot shorten its vectors"
            if not engine.truncatable
            else f"dimensions must be between 1 and {size} for this model",
            param="dimensions",
        )


async def embed(pipeline: Pipeline, request: InferenceRequest, record: Record) -> Embedded:
    """Admit, route and run one embeddings request; raise the GatewayError its client gets."""
    assert request.embedding is not None
    model = pipeline.models.resolve(request.model)
    if model.task != "embed":
        raise InvalidRequest("this model does not create embeddings", param="model")
    check_dimensions(model, request.embedding.dimensions)
    progress = Progress(model.id, False)
    record.progress = progress
    span = pipeline.telemetry.inference_span(
        "embeddings", model.id, request.request_id, traceparent=request.traceparent
    )
    security = pipeline.security
    try:
        admitted = await admit(security, request, model, progress)
    except GatewayError as exc:
        span.set_error(exc.code or exc.type)
        span.end()
        raise
    job = EmbeddingRequest(
        request_id=request.request_id,
        inputs=request.embedding.inputs,
        dimensions=request.embedding.dimensions,
        priority=admitted.decision.priority,
    )
    principal = request.principal
    team = principal.team or f"key:{principal.key_id}"
    metrics = pipeline.metrics
    start = time.perf_counter()
    tried: frozenset[str] = frozenset()
    try:
        while True:
            lease = await pipeline.router.acquire(
                model, allowed=admitted.decision.engine_classes, team=team, exclude=tried
            )
            tried |= {lease.deployment.name}
            _routed(lease, progress, admitted, span)
            try:
                with translate_engine_errors(request.prompt_param):
                    result = await _run(lease, job)
                break
            except GatewayError as exc:
                retry = (
                    exc.__cause__ is not None
                    and deployment_failed(exc.__cause__)
                    and pipeline.router.settings.retry
                    and progress.attempts < 2
                    and len(model.deployments) > len(tried)
                )
                if not retry:
                    raise
                pipeline.router.retried(model.id)
        progress.prompt_tokens = sum(result.prompt_tokens)
        progress.completion_tokens = 0
        labels = (model.id, lease.deployment.engine.name, lease.deployment.name)
        metrics.prompt_tokens.labels(*labels).inc(progress.prompt_tokens)
        metrics.e2e.labels(*labels).observe(time.perf_counter() - start)
        span.set_response(
            prompt_tokens=progress.prompt_tokens,
            completion_tokens=0,
            finish_reasons=[],
            ttft_s=None,
            response_model=model.id,
        )
        await admitted.complete(kind="embedding.completed")
    except BaseException as exc:
        if isinstance(exc, GatewayError):
            progress.error_code = exc.code or exc.type
            span.set_error(progress.error_code)
        await admitted.close(exc if isinstance(exc, Exception) else None)
        raise
    finally:
        span.end()  # once, whatever happened
    await admitted.close()  # the refund: settles on the tokens the inputs took
    return Embedded(model, result, admitted.headers)


def _routed(lease: Lease, progress: Progress, admitted: Admitted, span: InferenceSpan) -> None:
    d = lease.deployment
    progress.deployment, progress.route_reason = d.name, lease.reason
    progress.attempts += 1
    admitted.routed(d.name, d.engine_class, lease.reason, progress.attempts)
    span.set_route(
        deployment=d.name, engine=d.engine.name, engine_class=d.engine_class, reason=lease.reason
    )


async def _run(lease: Lease, job: EmbeddingRequest) -> EmbeddingResult:
    """One engine call on the leased deployment; its health follows the outcome."""
    try:
        result = await lease.deployment.engine.embed(job)
    except BaseException as exc:
        if deployment_failed(exc):
            lease.failed()
        lease.release()
        raise
    lease.ok()
    lease.release()
    return result
