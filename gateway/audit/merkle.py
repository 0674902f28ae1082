"""Merkle tree hash over row hashes, as Certificate Transparency defines it (RFC 6962 §2.1).

    leaf = SHA-256(0x00 || data)        node = SHA-256(0x01 || left || right)

The tree over n leaves splits at the largest power of two below n; building it bottom-up and
carrying an odd node up a level unchanged gives the same root (never duplicating a node, which
would let two different lists share a root).  The empty tree's root is SHA-256 of nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["leaf_hash", "merkle_root", "node_hash"]


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over `leaves` (each leaf's data, e.g. a raw 32-byte row hash)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    level = [leaf_hash(leaf) for leaf in leaves]
    while len(level) > 1:
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]
