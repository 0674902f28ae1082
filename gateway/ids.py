"""Random identifiers (request ids, audit event ids), read from the OS's CSPRNG in pools.

`os.urandom` is one system call per id: about 12 µs each on our 2-core VM (cProfile), three per
inference request (its request id and two audit events).  A pool of 4 KiB per thread makes that
one call per 256 event ids; the bytes are the same CSPRNG's, each handed out once (a forked
child starts with an empty pool).
"""

from __future__ import annotations

import os
import threading

__all__ = ["random_hex"]

_POOL_BYTES = 4096


class _Pool(threading.local):
    def __init__(self) -> None:
        self.data = b""
        self.used = 0


_pool = _Pool()


def _forget() -> None:
    """A forked child must not hand out its parent's bytes again."""
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget)


def random_hex(nbytes: int) -> str:
    """`nbytes` fresh random bytes as hex (what `os.urandom(nbytes).hex()` gives, cheaper)."""
    pool = _pool
    end = pool.used + nbytes
    if end > len(pool.data):
        pool.data, pool.used, end = os.urandom(max(_POOL_BYTES, nbytes)), 0, nbytes
    chunk = pool.data[pool.used : end]
    pool.used = end
    return chunk.hex()
