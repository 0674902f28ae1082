"""Merkle tree hashes, tree heads and consistency proofs, as Certificate Transparency defines
them (RFC 6962 §2.1; verification as RFC 9162 §2.1.4.2 writes it).

    leaf = SHA-256(0x00 || data)        node = SHA-256(0x01 || left || right)

The tree over n leaves splits at the largest power of two below n.  `CompactTree` keeps only the
roots of the perfect subtrees along the right edge (one per set bit of n), so appending a leaf
and reading the root of the tree so far cost O(log n): the audit writer keeps one to sign a tree
head after every commit, and verification streams every leaf through one.

A consistency proof from size m to size n shows that the first m leaves of the tree of size n
are exactly the tree of size m: whoever kept an old tree head (a witness, a compliance officer)
checks a new one without the leaves.  The empty tree's root is SHA-256 of nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = [
    "EMPTY_ROOT",
    "CompactTree",
    "consistency_proof",
    "leaf_hash",
    "merkle_root",
    "node_hash",
    "verify_consistency",
]

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class CompactTree:
    """The right edge of a Merkle tree: append leaves, read the root at the current size."""

    __slots__ = ("_stack", "size")

    def __init__(self, size: int = 0, stack: Sequence[bytes] = ()) -> None:
        if len(stack) != size.bit_count():
            raise ValueError("a compact tree holds one subtree root per set bit of its size")
        self.size = size
        self._stack = list(stack)  # perfect subtree roots, largest (leftmost) first

    def append(self, data: bytes) -> None:
        """Add the leaf whose data is `data` (a raw 32-byte row hash)."""
        node = leaf_hash(data)
        size = self.size
        while size & 1:  # merge with each perfect subtree of the same height
            node = node_hash(self._stack.pop(), node)
            size >>= 1
        self._stack.append(node)
        self.size += 1

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        node = self._stack[-1]
        for left in reversed(self._stack[:-1]):
            node = node_hash(left, node)
        return node

    @property
    def stack(self) -> tuple[bytes, ...]:
        return tuple(self._stack)

    def copy(self) -> CompactTree:
        return CompactTree(self.size, self._stack)


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over `leaves` (each leaf's data, e.g. a raw 32-byte row hash)."""
    tree = CompactTree()
    for leaf in leaves:
        tree.append(leaf)
    return tree.root()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def _hashed_root(hashes: Sequence[bytes]) -> bytes:
    """The root over already-hashed leaves."""
    if len(hashes) == 1:
        return hashes[0]
    k = _split(len(hashes))
    return node_hash(_hashed_root(hashes[:k]), _hashed_root(hashes[k:]))


def consistency_proof(leaves: Sequence[bytes], m: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 §2.1.2, for 0 < m <= n = len(leaves)."""
    n = len(leaves)
    if not 0 < m <= n:
        raise ValueError("a consistency proof needs 0 < m <= n")
    hashed = [leaf_hash(leaf) for leaf in leaves]
    proof: list[bytes] = []
    start, end, complete = 0, n, True  # SUBPROOF(m, D[start:end], complete)
    while True:
        size = end - start
        if m == size:
            if not complete:
                proof.append(_hashed_root(hashed[start:end]))
            break
        k = _split(size)
        if m <= k:
            proof.append(_hashed_root(hashed[start + k : end]))
            end = start + k
        else:
            proof.append(_hashed_root(hashed[start : start + k]))
            start += k
            m -= k
            complete = False
    proof.reverse()  # the deepest node first, as the verifier consumes them
    return proof


def verify_consistency(
    m: int, n: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether `proof` shows the tree of size m with `old_root` is a prefix of the tree of
    size n with `new_root` (RFC 9162 §2.1.4.2)."""
    if not 0 < m <= n:
        return False
    if m == n:
        return not proof and old_root == new_root
    path = list(proof)
    if m & (m - 1) == 0:  # m is a power of two: the old root is the first node of the path
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
