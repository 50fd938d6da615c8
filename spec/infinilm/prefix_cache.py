"""InfiniLM's chained prefix hash (docs/infinilm.md §2).

``hash_block_tokens(tokens, parent)`` is xxh3-128 over a domain tag, the parent digest (or a single
zero byte for the first block), the token count as 4 little-endian bytes and the tokens packed as
little-endian int32. Token ids must fit in int32 (reference §9.18: upstream overflows or raises).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

EMPTY_BLOCK_HASH = b""
_DOMAIN = b"InfiniLM-prefix-cache-v1\0"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def hash_block_tokens(tokens: Sequence[int], parent: bytes = EMPTY_BLOCK_HASH) -> bytes:
    """Return the 16-byte digest of one block of ``tokens`` chained on ``parent``.

    Pre: ``parent`` is empty or 16 bytes; every token fits in int32.
    Post: equal inputs give equal digests; the digest depends on every earlier block via ``parent``.
    """
    if parent and len(parent) != 16:
        raise ValueError(f"parent hash must be empty or 16 bytes, got {len(parent)} bytes")
    for t in tokens:
        if not _INT32_MIN <= t <= _INT32_MAX:
            raise ValueError(f"token id {t} does not fit in int32")
    h = xxhash.xxh3_128()
    h.update(_DOMAIN)
    h.update(parent if parent else b"\0")
    h.update(len(tokens).to_bytes(4, "little"))
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return h.digest()


def chain_hashes(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of every *full* block of ``tokens``, each chained on the one before."""
    hashes: list[bytes] = []
    parent = EMPTY_BLOCK_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(tokens[start : start + block_size], parent)
        hashes.append(parent)
    return hashes
