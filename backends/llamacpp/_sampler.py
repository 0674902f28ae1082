"""Per-request sampling in llama.cpp: the sampler chain, and constrained decoding's grammar.

Only the scheduler thread samples; a grammar sampler is handed over already parsed (compiled by
`_grammar.GrammarCache` off that thread).
"""

from __future__ import annotations

import ctypes
import secrets
from typing import Any

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

from ..errors import EngineFailure
from ..types import SamplingParams
from ._native import Context

__all__ = ["Sampler", "free_sampler"]

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# When the grammar refuses the chain's token: greedy checks the `_LIKELY` best candidates;
# sampling draws candidates in rounds of growing size (the grammar checks each round's distinct
# tokens in one call: 16,384 draws cost about a millisecond) before the grammar is run over the
# whole vocabulary (about 45 ms on Gemma's 262k tokens).
_LIKELY = 1024
_DRAWS = (64, 256, 1024, 4096, 16384)


class Sampler:
    """A per-request sampler chain in llama.cpp's usual order, and its grammar, if any.

    A grammar is not in the chain: checking all of a large vocabulary against it at every step
    (262k tokens for Gemma) cost two thirds of the decode speed.  As llama.cpp's own server
    does, the chain samples first and the grammar checks that one token; only a token the
    grammar refuses makes it filter the whole vocabulary and the chain sample again.
    """

    def __init__(
        self,
        params: SamplingParams,
        n_vocab: int,
        max_tokens: int,
        grammar: Any = None,
        end_token: int = -1,
    ) -> None:
        chain_params = ll.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = ll.llama_sampler_chain_init(chain_params)
        add = lambda s: ll.llama_sampler_chain_add(self.ptr, s)  # noqa: E731
        if params.logit_bias:
            arr = (ll.llama_logit_bias * len(params.logit_bias))()
            for j, (tok, bias) in enumerate(params.logit_bias):
                arr[j].token = tok  # type: ignore[assignment]
                arr[j].bias = bias
            add(ll.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), arr))
        if (
            params.repetition_penalty != 1.0
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
        ):
            # Penalties see the generated tokens (OpenAI's "so far" semantics): the window covers
            # the whole completion.
            add(
                ll.llama_sampler_init_penalties(
                    n_vocab,
                    max(1, max_tokens),
                    params.repetition_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        self.grammar = grammar  # owned from here: freed with the sampler
        self._end = end_token  # answered when the grammar allows no token the chain allows
        self._cur: npt.NDArray[np.void] | None = None
        self._greedy = params.greedy
        if grammar is not None:
            self._cur = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._cur["id"] = np.arange(n_vocab, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)
            self._rng = np.random.default_rng(params.seed)
        if params.greedy:
            add(ll.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(ll.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(ll.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(ll.llama_sampler_init_min_p(params.min_p, 1))
        add(ll.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else secrets.randbits(32)
        add(ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx: Context, batch_index: int) -> int:
        """Sample and accept the next token."""
        if self.grammar is None:
            return int(ll.llama_sampler_sample(self.ptr, ctx.ptr, batch_index))
        logits = ctx.logits(batch_index)
        arr = self._apply(self.ptr, logits)
        token = int(arr.data[arr.selected].id)
        one = self._one
        one["id"], one["logit"] = token, 0.0
        if not self._filter(one)[0]:  # refused
            choice = self._among_likely(_candidates(arr))
            if choice is None:  # the whole vocabulary through the grammar, then the chain
                arr = self._apply(self.grammar, logits, then=self.ptr)
                choice = int(arr.data[arr.selected].id)
                one["id"], one["logit"] = choice, 0.0
                if not self._filter(one)[0] or not np.isfinite(arr.data[arr.selected].logit):
                    # nothing both allow (a logit_bias banned every token the grammar wants):
                    # the sequence ends here; the grammar never accepts a token it refuses
                    return self._end
            token = choice
        ll.llama_sampler_accept(self.grammar, token)
        ll.llama_sampler_accept(self.ptr, token)
        return token

    def _apply(self, first: Any, logits: npt.NDArray[np.float32], then: Any = None) -> Any:
        cur = self._cur
        assert cur is not None
        cur["logit"] = logits
        arr = _token_array(cur)
        ll.llama_sampler_apply(first, ctypes.byref(arr))
        if then is not None:
            ll.llama_sampler_apply(then, ctypes.byref(arr))
        if arr.selected < 0:
            raise EngineFailure("the sampler selected no token")
        return arr

    def _filter(self, data: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
        """Which of these candidates the grammar allows next."""
        ll.llama_sampler_apply(self.grammar, ctypes.byref(_token_array(data)))
        return np.isfinite(data["logit"])

    def _among_likely(self, view: npt.NDArray[np.void]) -> int | None:
        """The grammar refused the chain's token: choose another among the chain's candidates
        without running the grammar over all of them (None: that is needed after all).

        Greedy: the best allowed token among the `_LIKELY` highest is the best allowed token
        overall (exact).  Sampling: rejection sampling from the chain's probabilities, drawn in
        batches and checked together, is exact: the first allowed draw is a sample of the
        allowed tokens in proportion to their probabilities.  When allowed tokens are too
        unlikely to be drawn soon, every candidate is checked instead.
        """
        if self._greedy:
            key = view["logit"]
            n = len(view)
            top = np.argpartition(-key, _LIKELY - 1)[:_LIKELY] if n > _LIKELY else np.arange(n)
            likely = view[top]  # a copy: the grammar marks it
            ok = self._filter(likely)
            if not ok.any():
                return None
            allowed = likely[ok]
            return int(allowed["id"][np.argmax(allowed["logit"])])
        cdf = np.cumsum(view["p"], dtype=np.float64)
        total = float(cdf[-1])
        if not 0.99 < total < 1.01:
            return None  # no probabilities from the chain
        ids = view["id"]
        for draws in _DRAWS:
            drawn = ids[
                np.minimum(np.searchsorted(cdf, self._rng.random(draws) * total), len(ids) - 1)
            ]
            unique, first = np.unique(drawn, return_index=True)
            check = np.zeros(len(unique), dtype=_TOKEN_DATA)
            check["id"] = unique
            ok = self._filter(check)
            if ok.any():
                return int(drawn[first[ok].min()])
        return None

    def close(self) -> None:
        if self.ptr:
            ll.llama_sampler_free(self.ptr)
            self.ptr = None
        if self.grammar is not None:
            ll.llama_sampler_free(self.grammar)
            self.grammar = None


def _candidates(arr: Any) -> npt.NDArray[np.void]:
    """The candidates a sampler chain left (it may have truncated or moved the array)."""
    size = int(arr.size)
    base = ctypes.cast(arr.data, ctypes.c_void_p).value
    buffer = (ctypes.c_char * (size * _TOKEN_DATA.itemsize)).from_address(base or 0)
    return np.frombuffer(memoryview(buffer), dtype=_TOKEN_DATA)


def _token_array(data: npt.NDArray[np.void]) -> Any:
    return ll.llama_token_data_array(
        data=data.ctypes.data_as(ll.llama_token_data_p), size=len(data), selected=-1, sorted=False
    )


def free_sampler(ptr: Any) -> None:
    """Free a sampler no chain took (a grammar of a request dropped before it ran)."""
    ll.llama_sampler_free(ptr)
