"""Anonymous flooding: a per-address budget of failed authentications, spent before any lookup.

A red team sent 11,575 unauthenticated requests in 10 s from one address; each cost a key
lookup and a durable audit row, and legitimate p50 latency rose from 1.0 to 6.6 ms.  Each client
address now has a token bucket (`[auth] failure_burst`, refilled at `failure_rate_per_s`): a
request that fails authentication spends a token; an address with none left is answered 429 with
`Retry-After` before its credential is parsed or looked up.  Only failures spend: a caller
whose requests succeed never runs dry, and refusals do not dig the hole deeper (the bucket
refills while the flood goes on, so the flooder gets `failure_rate_per_s` real attempts).

Who is refused while an address is limited: everyone there, except a credential this process
has seen succeed recently (`remember`).  Telling a valid credential from the flood otherwise
takes the very lookup the limit exists to avoid (a well-formed unknown key costs a database
read), and checksums and key shapes are public, so "looks valid" lets an attacker through.
The exception is cheap and unforgeable: a keyed BLAKE2b fingerprint of the Authorization header
(or client certificate), matched in memory.  So an application that shares its address (NAT,
a jump host) with a misconfigured or hostile client keeps working; a new key first used from a
limited address waits until the address recovers (`Retry-After`).

Memory is bounded: at most `MAX_ADDRESSES` buckets (the least recently failed is evicted) and
`MAX_REMEMBERED` fingerprints (least recently used evicted, each forgotten after
`REMEMBER_S`).  The clock is passed in (monotonic seconds); nothing here awaits.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import OrderedDict
from typing import Final

__all__ = ["MAX_ADDRESSES", "MAX_REMEMBERED", "REMEMBER_S", "FloodGuard", "retry_after_header"]

MAX_ADDRESSES: Final = 16_384  # ~4 MB of buckets at most
MAX_REMEMBERED: Final = 8_192
REMEMBER_S: Final = 900.0
_MAX_CREDENTIAL: Final = 16 * 1024  # longer credentials are never remembered (and fail anyway)


class _Bucket:
    __slots__ = ("tokens", "updated")

    def __init__(self, tokens: float, updated: float) -> None:
        self.tokens = tokens
        self.updated = updated


class FloodGuard:
    """Failed-authentication budgets per client address, and the credentials known to work.

    `burst` 0 turns the limit off (`retry_after` is always None); failures are then not
    tracked at all."""

    def __init__(
        self,
        *,
        burst: int,
        rate_per_s: float,
        max_addresses: int = MAX_ADDRESSES,
        max_remembered: int = MAX_REMEMBERED,
        remember_s: float = REMEMBER_S,
    ) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.burst = burst
        self.rate = rate_per_s
        self._max_addresses = max_addresses
        self._max_remembered = max_remembered
        self._remember_s = remember_s
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._known: OrderedDict[bytes, float] = OrderedDict()  # fingerprint -> expiry
        self._key = secrets.token_bytes(32)  # per process: fingerprints mean nothing elsewhere

    @property
    def enabled(self) -> bool:
        return self.burst > 0

    @property
    def tracked(self) -> int:
        """How many addresses have a bucket (bounded by `max_addresses`)."""
        return len(self._buckets)

    def retry_after(self, address: str, now: float) -> float | None:
        """None when `address` may try to authenticate; else the seconds until it may."""
        bucket = self._buckets.get(address)
        if bucket is None:
            return None
        tokens = self._refill(bucket, now)
        if tokens >= 1.0:
            if tokens >= self.burst:  # full again: the same as no bucket at all
                del self._buckets[address]
            return None
        return (1.0 - tokens) / self.rate

    def failed(self, address: str, now: float) -> None:
        """`address` failed to authenticate: spend one token."""
        if not self.enabled:
            return
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= self._max_addresses:
                self._buckets.popitem(last=False)  # the least recently failed
            bucket = self._buckets[address] = _Bucket(float(self.burst), now)
        else:
            self._buckets.move_to_end(address)
        bucket.tokens = max(0.0, self._refill(bucket, now) - 1.0)

    def _refill(self, bucket: _Bucket, now: float) -> float:
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate)
        bucket.updated = now
        return bucket.tokens

    # -- credentials known to work ---------------------------------------------------------

    def fingerprint(self, credential: bytes) -> bytes | None:
        if not credential or len(credential) > _MAX_CREDENTIAL:
            return None
        return hashlib.blake2b(credential, key=self._key, digest_size=16).digest()

    def remember(self, credential: bytes, now: float) -> None:
        """`credential` has just authenticated: it passes this guard for `remember_s`."""
        if not self.enabled:
            return
        fp = self.fingerprint(credential)
        if fp is None:
            return
        self._known[fp] = now + self._remember_s
        self._known.move_to_end(fp)
        while len(self._known) > self._max_remembered:
            self._known.popitem(last=False)

    def forget(self, credential: bytes) -> None:
        """`credential` failed (revoked, expired): it no longer passes while limited."""
        fp = self.fingerprint(credential)
        if fp is not None:
            self._known.pop(fp, None)

    def known(self, credential: bytes, now: float) -> bool:
        fp = self.fingerprint(credential)
        if fp is None:
            return False
        expiry = self._known.get(fp)
        if expiry is None:
            return False
        if expiry <= now:
            del self._known[fp]
            return False
        return True


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
