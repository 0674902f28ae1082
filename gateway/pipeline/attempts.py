"""Routing and running one admitted request: a deployment lease and one engine handle per
sequence, a retry elsewhere when a deployment fails before the first token, and the deltas as
they come, with their metrics.

A deployment that fails (or is full) at submission or before its first token is counted against
its circuit and left for another deployment, once; errors that are the client's own (a prompt
too long for the context) propagate at once.  After the first token a failure ends the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from backends import errors as engine_errors
from backends.types import GenerationDelta, GenerationHandle, GenerationRequest

from ..engines.registry import ServedModel
from ..errors import GatewayError, translate_engine_errors
from ..routing import Lease
from ..telemetry.traces import InferenceSpan
from .completion import Admitted
from .facts import InferenceRequest, Progress

if TYPE_CHECKING:
    from .run import Pipeline

__all__ = ["Attempts", "deployment_failed"]


def deployment_failed(exc: BaseException) -> bool:
    """The deployment's fault (retry elsewhere, count against its circuit), not the client's."""
    if isinstance(exc, engine_errors.EngineError):
        return isinstance(exc, engine_errors.EngineFailure | engine_errors.EngineNotReady)
    return isinstance(exc, Exception)


class Attempts:
    """The engine side of one request: where it runs, and what comes back."""

    def __init__(
        self,
        pipeline: Pipeline,
        request: InferenceRequest,
        model: ServedModel,
        progress: Progress,
        admitted: Admitted,
        span: InferenceSpan,
        requests: Sequence[GenerationRequest],
    ) -> None:
        self._pipeline = pipeline
        self._prompt_param = request.prompt_param  # named by a context-length error
        principal = request.principal
        self._team = principal.team or f"key:{principal.key_id}"  # the router's fair share
        self._model = model
        self._progress = progress
        self._admitted = admitted
        self._span = span
        self._requests = requests
        self._n = request.n  # choices per engine request
        self._choices = len(requests) * request.n
        self._handles: list[GenerationHandle] = []
        self._lease: Lease | None = None
        self._tried: frozenset[str] = frozenset()
        self._labels = (model.id, "", "")
        self._start = time.perf_counter()

    async def dispatch(self, started: float) -> None:
        """Route, then submit every sequence to the chosen deployment (another one, once, if
        it fails or is full).  `started`: when the request arrived, for the overhead metric."""
        router = self._pipeline.router
        while True:
            lease = await router.acquire(
                self._model,
                allowed=self._admitted.decision.engine_classes,
                team=self._team,
                exclude=self._tried,
            )
            self._use(lease)
            try:
                engine = lease.deployment.engine
                for req in self._requests:
                    self._handles.append(await engine.submit(req))
            except Exception as exc:
                full = isinstance(exc, engine_errors.EngineOverloaded)
                if not self._after_failure(exc, full=full):
                    raise
                continue
            router.observe_overhead(started, lease)
            self._progress.prompt_tokens = sum(h.prompt_tokens for h in self._handles)
            return

    def _use(self, lease: Lease) -> None:
        self._lease = lease
        d = lease.deployment
        self._tried |= {d.name}
        self._labels = (self._model.id, d.engine.name, d.name)
        p = self._progress
        p.deployment, p.route_reason = d.name, lease.reason
        p.attempts += 1
        self._admitted.routed(d.name, d.engine_class, lease.reason, p.attempts)
        self._span.set_route(
            deployment=d.name,
            engine=d.engine.name,
            engine_class=d.engine_class,
            reason=lease.reason,
        )

    def _after_failure(self, exc: BaseException, *, full: bool = False) -> bool:
        """Report a failure of the current deployment; whether to try another one."""
        failed = deployment_failed(exc)
        if failed and self._lease is not None:
            self._lease.failed()
        self.drop()
        router = self._pipeline.router
        retry = (
            (failed or full)
            and router.settings.retry
            and self._progress.attempts < 2
            and len(self._model.deployments) > len(self._tried)
        )
        if retry:
            router.retried(self._model.id)
        return retry

    def drop(self) -> None:
        """Abort what runs and give the lease back."""
        self._cancel()
        self._handles.clear()
        if self._lease is not None:
            self._lease.release()

    def _cancel(self) -> None:
        for handle in self._handles:
            handle.cancel()

    async def _from_engines(self) -> AsyncIterator[tuple[int, GenerationDelta]]:
        """The deltas of the current deployment; when it fails before anything was yielded,
        those of one other deployment."""
        while True:
            yielded = False
            try:
                if len(self._handles) == 1:  # the common case: no merging layer per delta
                    async for delta in self._handles[0]:
                        if not yielded:
                            yielded = True
                            self._first()
                        yield delta.index, delta
                else:
                    n = self._n
                    async for handle, delta in _merge(self._handles):
                        if not yielded:
                            yielded = True
                            self._first()
                        yield handle * n + delta.index, delta
                return
            except Exception as exc:
                if yielded or not self._after_failure(exc):
                    raise
            await self.dispatch(time.perf_counter())  # the client's error if none can serve

    def _first(self) -> None:
        """Something came back: the deployment is healthy."""
        if self._lease is not None:
            self._lease.ok()

    async def deltas(self) -> AsyncIterator[tuple[int, GenerationDelta]]:
        """(choice index, delta) as they come; records metrics; aborts the engine on exit
        and, unless every choice finished, audits the failure or cancellation."""
        metrics = self._pipeline.metrics
        progress = self._progress
        last = None
        itl: Any = None  # the histogram child, once the deployment is settled (first token)
        completion = seen = finished = 0
        failed: BaseException | None = None
        try:
            with translate_engine_errors(self._prompt_param):
                async for index, delta in self._from_engines():
                    labels = self._labels
                    now = time.perf_counter()
                    if delta.n_tokens:
                        seen += delta.n_tokens
                        if last is None:
                            progress.ttft_s = now - self._start
                            metrics.ttft.labels(*labels).observe(progress.ttft_s)
                            itl = metrics.itl.labels(*labels)
                        else:
                            itl.observe(now - last)
                        last = now
                    if delta.finish_reason is not None:
                        finished += 1
                        if delta.usage is not None:
                            completion += delta.usage.completion_tokens
                            progress.completion_tokens = completion  # the completion audits it
                        progress.finish_reason = delta.finish_reason
                        metrics.request_success.labels(*labels, delta.finish_reason).inc()
                    yield index, delta
        except Exception as exc:
            failed = exc
            raise
        finally:
            done = finished == self._choices
            self._cancel()
            if self._lease is not None:
                if failed is None and done:
                    self._lease.ok()
                self._lease.release()
            if not done and failed is None:  # the client went away
                completion = max(completion, seen)
                if progress.error_code is None:
                    progress.error_code = "client_disconnected"
            progress.completion_tokens = completion
            labels = self._labels
            metrics.prompt_tokens.labels(*labels).inc(progress.prompt_tokens or 0)
            metrics.generation_tokens.labels(*labels).inc(completion)
            if done:
                metrics.e2e.labels(*labels).observe(time.perf_counter() - self._start)
            self.end_span(failed, finished=finished)
            if failed is not None or not done:
                await self._admitted.close(failed)  # else the completion closes it

    def end_span(self, failed: BaseException | None, *, finished: int = 0) -> None:
        """The trace span: usage, finish reason and the error code, if any (never text)."""
        span, p = self._span, self._progress
        if not span.recording:
            return
        span.set_response(
            prompt_tokens=p.prompt_tokens or 0,
            completion_tokens=p.completion_tokens or 0,
            finish_reasons=[p.finish_reason] if finished and p.finish_reason else [],
            ttft_s=p.ttft_s,
            response_model=self._model.id,
        )
        if isinstance(failed, GatewayError):
            span.set_error(failed.code or failed.type)
        elif failed is not None:
            span.set_error("internal_error")
        elif p.error_code is not None:
            span.set_error(p.error_code)
        span.end()


async def _merge(handles: Sequence[GenerationHandle]) -> AsyncIterator[tuple[int, GenerationDelta]]:
    """The deltas of several handles as they come, with the index of their handle."""
    queue: asyncio.Queue[tuple[int, GenerationDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, handle: GenerationHandle) -> None:
        try:
            async for delta in handle:
                queue.put_nowait((index, delta))
        except BaseException as exc:  # delivered to the consumer, which re-raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
