"""A submitted vLLM request: its delta outputs as `GenerationDelta`s, and its cancellation.

With `n > 1` choices vLLM runs one child sequence per choice behind one output collector: a
DELTA output holds only the choices that advanced since the last read, each `CompletionOutput`
named by its `.index`, and is `finished` once every child is.  A choice ends on the output
whose completion carries its `finish_reason`.  Greedy choices are one sequence whose deltas are
copied to every index (`_params.sequences`).  One choice (the common case) keeps the direct
path: one output, one delta.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import msgspec

from ..errors import EngineError, EngineFailure
from ..types import FinishReason, GenerationDelta, TokenLogprob, Usage

__all__ = ["Handle", "HandleContext"]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",  # vLLM's repetition detector (off unless asked) ends like a stop
}


class HandleContext:
    """What handles share with their engine: token bytes, abort, bookkeeping."""

    __slots__ = ("abort", "finished", "mean_duration_s", "piece")

    def __init__(
        self,
        piece: Callable[[int], bytes],
        abort: Callable[[str], None],
        finished: Callable[[Handle], None],
    ) -> None:
        self.piece = piece
        self.abort = abort
        self.finished = finished
        self.mean_duration_s = 2.0  # EMA of request time, for Retry-After


class Handle:
    """Iterate for deltas (the last carries `finish_reason` and `usage`); cancel() aborts the
    request in the engine core.  Iterating is optional: an unread request still runs to its
    end and is counted finished by vLLM's output processor."""

    __slots__ = (
        "__weakref__",
        "_cancelled",
        "_choice_tokens",
        "_choices",
        "_collector",
        "_completion_tokens",
        "_copies",
        "_ctx",
        "_done",
        "_echo",
        "_echoed",
        "_logprobs",
        "_prompt_logprobs",
        "_prompt_text",
        "_prompt_tokens",
        "_submitted",
    )

    def __init__(
        self,
        ctx: HandleContext,
        collector: Any,
        *,
        prompt_tokens: int,
        logprobs: int | None,
        echo: bool,
        prompt_text: str | None,
        choices: int = 1,
        copies: bool = False,
    ) -> None:
        self._ctx = ctx
        self._collector = collector  # vLLM's RequestOutputCollector for this request
        self._prompt_tokens = prompt_tokens
        self._logprobs = logprobs
        self._echo = echo
        self._prompt_text = prompt_text
        self._completion_tokens = 0
        self._done = False
        self._cancelled = False
        self._submitted = time.monotonic()
        self._choices = choices
        self._copies = copies  # one vLLM sequence copied to every choice (greedy)
        self._choice_tokens = [0] * choices  # completion tokens per choice (vLLM's n > 1)
        self._echoed = [False] * choices
        self._prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def request_id(self) -> str:
        """vLLM's internal id of this request (its external id plus a random suffix)."""
        rid: str = self._collector.request_id
        return rid

    @property
    def prompt_tokens(self) -> int:
        return self._prompt_tokens

    async def __aiter__(self) -> AsyncIterator[GenerationDelta]:
        collector = self._collector
        first = True
        try:
            while not self._done:
                try:
                    output = collector.get_nowait() or await collector.get()
                except EngineError:
                    self._finish()
                    raise
                except Exception as exc:
                    self._finish()
                    # vLLM's exceptions name no content, but ours say less still.
                    raise EngineFailure(
                        f"the vLLM engine failed while generating ({type(exc).__name__})"
                    ) from exc
                if self._choices == 1:
                    delta = self._delta(output, first)
                    first = False
                    yield delta
                    continue
                for delta in self._choice_deltas(output, first):
                    yield delta
                first = False
        finally:
            if not self._done:  # the consumer stopped early: free the engine's slot
                self.cancel()

    def cancel(self) -> None:
        if not self._done and not self._cancelled:
            self._cancelled = True
            self._ctx.abort(self.request_id)

    def fail(self, exc: EngineError) -> None:
        """End the stream with `exc` (the engine is stopping), unless it has already ended."""
        pending = self._collector.output
        if not self._done and not getattr(pending, "finished", False):
            self._collector.put(exc)

    def _finish(self, *, completed: bool = False) -> None:
        if not self._done:
            self._done = True
            ctx = self._ctx
            if completed:  # aborted and failed requests say nothing about request time
                duration = time.monotonic() - self._submitted
                ctx.mean_duration_s = 0.9 * ctx.mean_duration_s + 0.1 * duration
            ctx.finished(self)

    def _delta(self, output: Any, first: bool) -> GenerationDelta:
        completion = output.outputs[0] if output.outputs else None
        token_ids: list[int] = list(completion.token_ids) if completion is not None else []
        self._completion_tokens += len(token_ids)
        logprobs: tuple[TokenLogprob, ...] = ()
        if self._logprobs is not None and completion is not None and completion.logprobs:
            logprobs = tuple(
                self._token_logprob(tok, entry)
                for tok, entry in zip(token_ids, completion.logprobs, strict=False)
            )
        prompt_text = None
        prompt_logprobs: tuple[TokenLogprob, ...] = ()
        if first and self._echo:
            prompt_text = self._prompt_text
            if output.prompt_logprobs is not None and output.prompt_token_ids is not None:
                prompt_logprobs = self._prompt_logprobs_of(
                    output.prompt_token_ids, output.prompt_logprobs
                )
        finish: FinishReason | None = None
        usage = None
        if output.finished:
            reason = str(completion.finish_reason) if completion is not None else "abort"
            self._finish(completed=reason in ("stop", "length"))
            if reason not in _FINISH:
                raise EngineFailure(f"the vLLM engine failed this request ({reason})")
            finish = _FINISH[reason]
            usage = Usage(self._prompt_tokens, self._completion_tokens)
        return GenerationDelta(
            text=completion.text if completion is not None else "",
            n_tokens=len(token_ids),
            logprobs=logprobs,
            finish_reason=finish,
            usage=usage,
            prompt_text=prompt_text,
            prompt_logprobs=prompt_logprobs,
        )

    def _choice_deltas(self, output: Any, first: bool) -> Iterator[GenerationDelta]:
        """One output of a request with several choices, as one delta per choice it holds."""
        if self._copies:
            delta = self._delta(output, first)
            yield delta
            usage = delta.usage
            if usage is not None:  # the prompt is counted once, on choice 0
                usage = Usage(0, usage.completion_tokens)
            for index in range(1, self._choices):
                yield msgspec.structs.replace(delta, index=index, usage=usage)
            return
        failed = None
        for completion in output.outputs:
            index = completion.index
            token_ids: list[int] = list(completion.token_ids)
            tokens = self._choice_tokens[index] = self._choice_tokens[index] + len(token_ids)
            logprobs: tuple[TokenLogprob, ...] = ()
            if self._logprobs is not None and completion.logprobs:
                logprobs = tuple(
                    self._token_logprob(tok, entry)
                    for tok, entry in zip(token_ids, completion.logprobs, strict=False)
                )
            prompt_text = None
            prompt_logprobs: tuple[TokenLogprob, ...] = ()
            if self._echo and not self._echoed[index]:  # each choice starts with the prompt
                self._echoed[index] = True
                prompt_text = self._prompt_text
                prompt_logprobs = self._echo_logprobs(output)
            finish: FinishReason | None = None
            usage = None
            if completion.finish_reason is not None:
                reason = str(completion.finish_reason)
                if reason not in _FINISH:
                    failed = reason
                    continue
                finish = _FINISH[reason]
                usage = Usage(self._prompt_tokens if index == 0 else 0, tokens)
            yield GenerationDelta(
                text=completion.text,
                n_tokens=len(token_ids),
                logprobs=logprobs,
                finish_reason=finish,
                usage=usage,
                prompt_text=prompt_text,
                prompt_logprobs=prompt_logprobs,
                index=index,
            )
        if failed is not None:
            self.cancel()  # the other choices end with this one
            self._finish()
            raise EngineFailure(f"the vLLM engine failed this request ({failed})")
        if output.finished:
            self._finish(completed=not self._cancelled)

    def _echo_logprobs(self, output: Any) -> tuple[TokenLogprob, ...]:
        """The prompt's logprobs, kept from the first output (every child computes them; the
        collector keeps the first child's when it merges outputs)."""
        if self._prompt_logprobs is None:
            if output.prompt_logprobs is None or output.prompt_token_ids is None:
                return ()
            self._prompt_logprobs = self._prompt_logprobs_of(
                output.prompt_token_ids, output.prompt_logprobs
            )
        return self._prompt_logprobs

    def _prompt_logprobs_of(
        self, token_ids: Iterable[int], entries: Iterable[Any]
    ) -> tuple[TokenLogprob, ...]:
        out = []
        piece = self._ctx.piece
        for tok, entry in zip(token_ids, entries, strict=False):
            if entry is None:  # the first prompt token: nothing predicts it
                out.append(TokenLogprob(tok, piece(tok), None))
            else:
                out.append(self._token_logprob(tok, entry))
        return tuple(out)

    def _token_logprob(self, token_id: int, entry: Any) -> TokenLogprob:
        """vLLM's {token id: Logprob(logprob, rank, text)} for one position: the chosen token
        plus the top N (the chosen one may be among them, or ranked below)."""
        piece = self._ctx.piece
        n = self._logprobs or 0
        chosen = entry.get(token_id) if entry else None
        top = sorted(
            (
                (lp.rank, tok, lp.logprob)
                for tok, lp in (entry or {}).items()
                if lp.rank is not None and lp.rank <= n
            ),
        )
        return TokenLogprob(
            token_id,
            piece(token_id),
            None if chosen is None else float(chosen.logprob),
            tuple((tok, piece(tok), float(lp)) for _, tok, lp in top[:n]),
        )
