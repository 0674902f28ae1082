"""The continuous-batching loop: one thread owns the llama.cpp context.

Each step runs one `llama_decode`: the next token of every decoding sequence, or one prompt chunk
(up to `n_batch` tokens) of one sequence, alternating while both exist.  Requests join between
steps; a long prompt is prefilled a chunk per step so running streams keep flowing; a cancelled
sequence is dropped and its cache freed at the next step.

Results leave the thread once per step: a single `call_soon_threadsafe` hands every sequence's
delta to its asyncio queue.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._text import StopMatcher, Utf8Stream
from ..errors import EngineFailure, EngineNotReady, EngineOverloaded
from ..types import FinishReason, GenerationDelta, SamplingParams, TokenLogprob, Usage
from ._native import Batch, Context
from ._sampler import Sampler, free_sampler

__all__ = ["Scheduler", "Sequence"]

_log = logging.getLogger("airgate.llamacpp")

# At 8 or more rows llama.cpp (0.3.36, CPU) computes some rows differently from how it computes
# them in smaller batches; up to 7 rows every sequence gets bit-identical logits.
INVARIANT_DECODE_ROWS = 7

Outbox = list[
    tuple[asyncio.Queue[GenerationDelta | BaseException], GenerationDelta | BaseException]
]


class Sequence:
    """One request's state inside the scheduler."""

    __slots__ = (
        "cancelled",
        "echo_prompt",
        "finished",
        "generated",
        "grammar",
        "last_token",
        "logprobs",
        "max_tokens",
        "n_past",
        "out",
        "params",
        "prompt",
        "prompt_logprobs",
        "prompt_text",
        "sampler",
        "slot",
        "stop",
        "submitted",
        "utf8",
    )

    def __init__(
        self,
        *,
        prompt: list[int],
        max_tokens: int,
        stop: tuple[str, ...],
        params: SamplingParams,
        logprobs: int | None,
        echo_prompt: bool,
        prompt_text: str | None,
        out: asyncio.Queue[GenerationDelta | BaseException],
        grammar: Any = None,
    ) -> None:
        self.prompt = prompt
        self.grammar = grammar  # a grammar sampler until the sequence's chain takes it
        self.max_tokens = max_tokens
        self.params = params
        self.logprobs = logprobs
        self.echo_prompt = echo_prompt
        self.prompt_text = prompt_text
        self.prompt_logprobs: list[TokenLogprob] = []
        self.out = out
        self.stop = StopMatcher(stop)
        self.utf8 = Utf8Stream()
        self.sampler: Sampler | None = None
        self.slot = -1
        self.n_past = 0
        self.generated = 0
        self.last_token = -1
        self.cancelled = False
        self.finished = False
        self.submitted = time.monotonic()

    def drop_grammar(self) -> None:
        if self.grammar is not None:
            free_sampler(self.grammar)
            self.grammar = None

    @property
    def want_prompt_logprobs(self) -> bool:
        return self.echo_prompt and self.logprobs is not None


class Scheduler:
    """Owns the context, the batch and the thread; `submit` and `cancel` are thread-safe."""

    def __init__(
        self,
        ctx: Context,
        *,
        n_slots: int,
        max_waiting: int,
        loop: asyncio.AbstractEventLoop,
        batch_invariant: bool = False,
    ) -> None:
        self._ctx = ctx
        self._model = ctx.model
        self._n_slots = n_slots
        self._max_waiting = max_waiting
        self._loop = loop
        self._batch = Batch(ctx.n_batch, n_slots)
        self._cv = threading.Condition()
        self._pending: collections.deque[Sequence] = collections.deque()
        self._slots: list[Sequence | None] = [None] * n_slots
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="airgate-llamacpp", daemon=True)
        self._mean_duration_s = 2.0  # EMA of request time, for Retry-After
        self._prefill_turn = False
        # batch_invariant: cut decode steps so no llama_decode sees more than 7 rows (results
        # never depend on the load, at a throughput cost when more than 7 sequences run)
        self._max_decode_rows = INVARIANT_DECODE_ROWS if batch_invariant else n_slots
        self.kv_tokens = 0

    # ---- called from the event loop -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, seq: Sequence) -> None:
        with self._cv:
            if self._stopping:
                raise EngineNotReady("the engine is shutting down")
            free = sum(s is None for s in self._slots)
            if len(self._pending) >= self._max_waiting + free:
                waiting = len(self._pending)
                raise EngineOverloaded(
                    f"the engine is at capacity ({self._n_slots} running, {waiting} waiting)",
                    retry_after_s=max(1.0, self._mean_duration_s * (waiting + 1) / self._n_slots),
                )
            self._pending.append(seq)
            self._cv.notify()

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True  # read by the scheduler thread at its next step
        with self._cv:
            self._cv.notify()

    def counts(self) -> tuple[int, int]:
        running = sum(s is not None for s in self._slots)
        return running, len(self._pending)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self._batch.close()

    # ---- the scheduler thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stopping and not self._pending and not self._has_active():
                        self._cv.wait()
                    if self._stopping:
                        break
                    dropped = self._admit_locked()
                outbox: Outbox = [(seq.out, self._final(seq, "abort", "")) for seq in dropped]
                self._reap(outbox)
                if self._has_active():
                    self._step(outbox)
                if outbox:
                    self._loop.call_soon_threadsafe(_deliver, outbox)
        except BaseException as exc:  # the loop must never die silently
            _log.exception("llama.cpp scheduler crashed")
            self._fail_all(EngineFailure(f"engine failure: {type(exc).__name__}"))
            raise
        self._fail_all(EngineNotReady("the engine stopped"))

    def _has_active(self) -> bool:
        return any(s is not None for s in self._slots)

    def _admit_locked(self) -> list[Sequence]:
        """Move waiting requests into free slots; returns those cancelled while waiting."""
        dropped = [s for s in self._pending if s.cancelled]
        if dropped:
            self._pending = collections.deque(s for s in self._pending if not s.cancelled)
            for seq in dropped:
                seq.finished = True
                seq.drop_grammar()
        for slot, current in enumerate(self._slots):
            if current is not None:
                continue
            if self._pending:
                seq = self._pending.popleft()
                seq.slot = slot
                seq.sampler = Sampler(seq.params, self._model.n_vocab, seq.max_tokens, seq.grammar)
                seq.grammar = None
                self._slots[slot] = seq
        return dropped

    def _release(self, seq: Sequence) -> None:
        self._ctx.clear_seq(seq.slot)
        if seq.sampler is not None:
            seq.sampler.close()
            seq.sampler = None
        self._slots[seq.slot] = None
        self.kv_tokens = sum(s.n_past for s in self._slots if s is not None)
        seq.finished = True
        duration = time.monotonic() - seq.submitted
        self._mean_duration_s = 0.9 * self._mean_duration_s + 0.1 * duration

    def _reap(self, outbox: Outbox) -> None:
        for seq in self._slots:
            if seq is not None and seq.cancelled:
                self._release(seq)
                outbox.append((seq.out, self._final(seq, "abort", "")))

    def _step(self, outbox: Outbox) -> None:
        """One llama_decode: either the next token of every decoding sequence, or one prompt
        chunk of one sequence.  The two alternate while both kinds of work exist, so a long
        prompt stalls running streams for at most one chunk per token they receive.

        Keeping prompt chunks out of decode batches (and cutting every prompt at the same
        offsets whatever else is running) is what makes results batch-invariant: a sequence's
        tokens always meet the same kernels with the same shapes, alone or under load.
        """
        active = [s for s in self._slots if s is not None]
        decoding = [s for s in active if s.n_past >= len(s.prompt)]
        prefilling = [s for s in active if s.n_past < len(s.prompt)]
        if prefilling and (not decoding or self._prefill_turn):
            self._prefill_turn = False
            # oldest first: the request that has waited longest gets its first token first
            self._prefill_chunk(min(prefilling, key=lambda s: s.submitted), outbox)
        else:
            self._prefill_turn = True
            self._decode(decoding, outbox)
        self.kv_tokens = sum(s.n_past for s in self._slots if s is not None)

    def _prefill_chunk(self, seq: Sequence, outbox: Outbox) -> None:
        batch = self._batch
        batch.clear()
        take = min(batch.capacity, len(seq.prompt) - seq.n_past)
        completes = seq.n_past + take == len(seq.prompt)
        all_logits = seq.want_prompt_logprobs
        idx = batch.add(
            seq.prompt[seq.n_past : seq.n_past + take], seq.n_past, seq.slot, all_logits
        )
        if completes:
            batch.set_last_logits()
        seq.n_past += take
        if not self._run_batch([seq], outbox):
            return
        if all_logits:
            self._collect_prompt_logprobs(seq, idx, take)
        if completes:
            self._sample(seq, idx + take - 1, outbox)

    def _decode(self, seqs: list[Sequence], outbox: Outbox) -> None:
        rows = self._max_decode_rows
        for start in range(0, len(seqs), rows):
            group = seqs[start : start + rows]
            batch = self._batch
            batch.clear()
            outputs = []
            for seq in group:
                outputs.append((seq, batch.add((seq.last_token,), seq.n_past, seq.slot, True)))
                seq.n_past += 1
            if self._run_batch(group, outbox):
                for seq, idx in outputs:
                    self._sample(seq, idx, outbox)

    def _run_batch(self, seqs: list[Sequence], outbox: Outbox) -> bool:
        rc = self._ctx.decode(self._batch)
        if rc == 0:
            return True
        _log.error("llama_decode returned %d for a batch of %d tokens", rc, self._batch.n)
        for seq in seqs:
            self._release(seq)
            outbox.append((seq.out, EngineFailure(f"llama_decode failed ({rc})")))
        return False

    def _collect_prompt_logprobs(self, seq: Sequence, first: int, n: int) -> None:
        model = self._model
        start = seq.n_past - n  # position of batch index `first`
        if start == 0:
            tok = seq.prompt[0]
            seq.prompt_logprobs.append(TokenLogprob(tok, model.piece(tok), None))
        top_n = seq.logprobs or 0
        for j in range(n):
            pos = start + j
            if pos + 1 >= len(seq.prompt):
                break
            nxt = seq.prompt[pos + 1]
            lp, top = _logprobs(self._ctx.logits(first + j), nxt, top_n, model.piece)
            seq.prompt_logprobs.append(TokenLogprob(nxt, model.piece(nxt), lp, top))

    def _sample(self, seq: Sequence, idx: int, outbox: Outbox) -> None:
        assert seq.sampler is not None
        model = self._model
        token = seq.sampler.sample(self._ctx, idx)
        seq.last_token = token
        seq.generated += 1
        logprobs: tuple[TokenLogprob, ...] = ()
        if seq.logprobs is not None:
            lp, top = _logprobs(self._ctx.logits(idx), token, seq.logprobs, model.piece)
            logprobs = (TokenLogprob(token, model.piece(token), lp, top),)
        prompt_text = prompt_lp = None
        if seq.generated == 1 and seq.echo_prompt:
            prompt_text = seq.prompt_text
            prompt_lp = tuple(seq.prompt_logprobs)
        if model.is_eog(token):
            self._release(seq)
            outbox.append((seq.out, self._final(seq, "stop", "", logprobs, prompt_text, prompt_lp)))
            return
        text, stopped = seq.stop.feed(seq.utf8.feed(model.piece(token)))
        if stopped:
            self._release(seq)
            outbox.append(
                (seq.out, self._final(seq, "stop", text, logprobs, prompt_text, prompt_lp))
            )
        elif seq.generated >= seq.max_tokens:
            self._release(seq)
            tail = text + seq.stop.feed(seq.utf8.flush())[0] + seq.stop.flush()
            outbox.append(
                (seq.out, self._final(seq, "length", tail, logprobs, prompt_text, prompt_lp))
            )
        else:
            delta = GenerationDelta(
                text=text,
                n_tokens=1,
                logprobs=logprobs,
                prompt_text=prompt_text,
                prompt_logprobs=prompt_lp or (),
            )
            outbox.append((seq.out, delta))

    def _final(
        self,
        seq: Sequence,
        reason: FinishReason,
        text: str,
        logprobs: tuple[TokenLogprob, ...] = (),
        prompt_text: str | None = None,
        prompt_logprobs: tuple[TokenLogprob, ...] | None = None,
    ) -> GenerationDelta:
        return GenerationDelta(
            text=text,
            n_tokens=1 if reason != "abort" else 0,
            logprobs=logprobs,
            finish_reason=reason,
            usage=Usage(len(seq.prompt), seq.generated),
            prompt_text=prompt_text,
            prompt_logprobs=prompt_logprobs or (),
        )

    def _fail_all(self, exc: BaseException) -> None:
        outbox: Outbox = []
        with self._cv:
            self._stopping = True
            waiting = list(self._pending)
            self._pending.clear()
        for seq in waiting:
            seq.drop_grammar()
            outbox.append((seq.out, exc))
        for running in self._slots:
            if running is not None:
                self._release(running)
                outbox.append((running.out, exc))
        if outbox and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, outbox)


def _deliver(outbox: Outbox) -> None:
    for queue, item in outbox:
        queue.put_nowait(item)


def _logprobs(
    logits: np.ndarray, token: int, top_n: int, piece: Callable[[int], bytes]
) -> tuple[float, tuple[tuple[int, bytes, float], ...]]:
    """log-softmax of the raw logits: the chosen token's value and the top `top_n`."""
    x = logits.astype(np.float64, copy=False)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    chosen = float(x[token]) - lse
    if top_n <= 0:
        return chosen, ()
    idx = np.argpartition(x, -top_n)[-top_n:]
    idx = idx[np.argsort(-x[idx])]
    return chosen, tuple((int(i), piece(int(i)), float(x[i]) - lse) for i in idx)
