"""The slice of llama-cpp-python's low-level (ctypes) API we drive, behind small typed objects.

Only the scheduler thread touches a `Context` or a `Batch`; a `Model`'s vocabulary is read-only
after load, so tokenising from other threads is safe.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

from ..errors import EngineFailure
from ..types import ModelSource

__all__ = ["Batch", "Context", "Model", "init_backend", "open_model"]

_log = logging.getLogger("airgate.llamacpp")
_GGML_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_init_lock = threading.Lock()
_initialised = False


@ll.llama_log_callback  # type: ignore[untyped-decorator]
def _on_native_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp logs load-time facts (tensor counts, cache sizes), never token text.
    if text:
        _log.log(
            _GGML_LEVELS.get(level, logging.DEBUG), "%s", text.decode("utf-8", "replace").rstrip()
        )


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logging through ours."""
    global _initialised
    with _init_lock:
        if not _initialised:
            ll.llama_log_set(_on_native_log, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: str) -> None:
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        # No weight repacking: the repacked kernels switch to a gemm path at >= 4 rows, so a
        # sequence's logits (and its greedy output) would depend on the batch it shares.
        params.use_extra_bufts = False
        ptr = ll.llama_model_load_from_file(path.encode(), params)
        if not ptr:
            raise EngineFailure("llama.cpp could not load the model file (see the log for why)")
        self.ptr = ptr
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = ll.llama_model_n_ctx_train(ptr)
        self.eos: int = ll.llama_vocab_eos(self.vocab)
        self._piece_buf = threading.local()

    def close(self) -> None:
        if self.ptr:
            ll.llama_model_free(self.ptr)
            self.ptr = None

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        out = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), out, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            out = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), out, cap, add_special, parse_special)
        if n < 0:
            raise EngineFailure("tokenisation failed")
        return list(out[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens render as nothing)."""
        buf = getattr(self._piece_buf, "buf", None)
        if buf is None:
            buf = self._piece_buf.buf = ctypes.create_string_buffer(256)
        n = ll.llama_token_to_piece(self.vocab, token, buf, 256, 0, False)
        if n < 0:  # a piece longer than the buffer: retry with the exact size
            big = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, big, -n, 0, False)
            return big.raw[:n]
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None


class Context:
    """One llama.cpp context with `n_seq` sequences of `n_ctx_seq` tokens each.

    The KV cache is split per sequence, not unified: in a unified cache a sequence's cells sit
    between other sequences' cells, and the masked sums of attention then round differently
    depending on who else is running (greedy outputs changed under load).
    """

    def __init__(
        self,
        model: Model,
        *,
        n_seq: int,
        n_ctx_seq: int,
        n_batch: int,
        n_threads: int,
        unified: bool = True,
    ) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.kv_unified = False  # each sequence attends over its own cells only
        params.no_perf = True
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise EngineFailure("llama.cpp could not create a context (see the log for why)")
        self.ptr = ptr
        self.model = model
        self.memory = ll.llama_get_memory(ptr)
        self.n_ctx_seq: int = ll.llama_n_ctx_seq(ptr)
        self.n_batch: int = ll.llama_n_batch(ptr)

    def close(self) -> None:
        if self.ptr:
            ll.llama_free(self.ptr)
            self.ptr = None

    def decode(self, batch: Batch) -> int:
        return int(ll.llama_decode(self.ptr, batch.raw))

    def clear_seq(self, seq: int) -> None:
        ll.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def logits(self, batch_index: int) -> npt.NDArray[np.float32]:
        ptr = ll.llama_get_logits_ith(self.ptr, batch_index)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))


class Batch:
    """A reusable llama_batch with numpy views over its arrays (one sequence id per token)."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.raw = ll.llama_batch_init(capacity, 0, n_seq_max)
        self._token = np.ctypeslib.as_array(self.raw.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(self.raw.pos, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(self.raw.logits, shape=(capacity,))
        np.ctypeslib.as_array(self.raw.n_seq_id, shape=(capacity,))[:] = 1
        self._seq_id = self.raw.seq_id
        self.n = 0

    def close(self) -> None:
        ll.llama_batch_free(self.raw)

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(
        self, tokens: Sequence[int], start_pos: int, seq: int, logits: bool | Sequence[bool]
    ) -> int:
        """Append tokens of one sequence; returns the batch index of the first one."""
        i, k = self.n, len(tokens)
        self._token[i : i + k] = tokens
        self._pos[i : i + k] = np.arange(start_pos, start_pos + k, dtype=np.int32)
        self._logits[i : i + k] = logits if not isinstance(logits, bool) else int(logits)
        for j in range(i, i + k):
            self._seq_id[j][0] = seq
        self.n += k
        self.raw.n_tokens = self.n
        return i

    def set_last_logits(self) -> None:
        self._logits[self.n - 1] = 1


def copy_seq(ctx: Context, src: int, dst: int) -> None:
    """Give sequence `dst` a copy of sequence `src`'s cache (`dst` must be empty).

    With the split cache (`kv_unified=False`: one stream per sequence) llama.cpp copies only
    whole streams: it takes `src`'s cell metadata at once and copies the stream's K/V buffers
    at the start of the next `llama_decode`.  `dst` then has the same cells at the same places
    as `src`, so both compute exactly what `src` alone would.  (In a unified cache the same
    call shares the cells instead.)
    """
    ll.llama_memory_seq_cp(ctx.memory, src, dst, -1, -1)


class EmbeddingContext:
    """A llama.cpp context that embeds: up to `n_seq` whole inputs per `llama_decode`.

    Every input of a decode is its own sequence and sits whole in one ubatch (`n_ubatch` =
    `n_batch`): a non-causal encoder cannot split a sequence across ubatches, and llama.cpp
    aborts the process when a batch exceeds the ubatch.  With mean pooling it also aborts at
    context creation unless `n_batch % n_seq == 0`: the caller passes powers of two.  The cache
    is unified and cleared after every decode, so each decode starts from nothing.
    """

    def __init__(self, model: Model, *, n_seq: int, n_batch: int, n_threads: int) -> None:
        if n_batch % n_seq:
            raise ValueError("n_batch must be a multiple of n_seq")
        params = ll.llama_context_default_params()
        params.n_ctx = n_batch
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = ll.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
        params.no_perf = True
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise EngineFailure("llama.cpp could not create a context (see the log for why)")
        self.ptr = ptr
        self.model = model
        self.memory = ll.llama_get_memory(ptr)  # NULL for encoders without a cache (BERT)
        self.n_seq = n_seq
        self.n_batch: int = ll.llama_n_batch(ptr)
        self.n_embd: int = ll.llama_model_n_embd(model.ptr)
        self.pooling: int = ll.llama_pooling_type(ptr)

    def close(self) -> None:
        if self.ptr:
            ll.llama_free(self.ptr)
            self.ptr = None

    def decode(self, batch: Batch) -> int:
        try:
            return int(ll.llama_decode(self.ptr, batch.raw))
        finally:
            if self.memory:
                ll.llama_memory_clear(self.memory, True)

    def pooled(self, seq: int) -> npt.NDArray[np.float32]:
        """A copy of sequence `seq`'s pooled embedding from the last decode."""
        ptr = ll.llama_get_embeddings_seq(self.ptr, seq)
        if not ptr:
            raise EngineFailure("llama.cpp returned no pooled embedding")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()


__all__ += ["EmbeddingContext"]


def open_model(source: str | ModelSource) -> Model:
    """The model at a path, or from a source opened for the load and released right after it
    (a decrypted bundle's plaintext lives no longer than the load)."""
    init_backend()
    if isinstance(source, str):
        return Model(source)
    try:
        return Model(source.open())
    finally:
        source.release()
