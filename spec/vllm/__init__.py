"""Reference models of vLLM's CPU KV-offload manager and its cache policies.

Source of truth: docs/vllm.md §0–§4, §7, §8, "the #50992 state" (§0.1) plus named
variants. Modules:

* :mod:`spec.vllm.offload_manager` — ``CPUOffloadingManager`` (§1), the block-id pool, events,
  the #45757 guard and the #35846 protection;
* :mod:`spec.vllm.arc` — ``ARCCachePolicy`` (§2), rescan selection, ``t1_fallback`` (#55461);
* :mod:`spec.vllm.lru` — ``LRUCachePolicy`` (§3), ``variant="v1" | "v2"`` (#46216).

This module holds the vocabulary the three share (upstream ``cpu/policies/base.py``): keys,
``BlockStatus`` and the canonical form of a block table inside a snapshot.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

__all__ = ["BlockEntry", "BlockStatus", "Key", "block_entries"]

Key = Hashable
"""An offload key. Upstream: block-hash bytes + 4-byte group index; opaque to every model here."""

BlockEntry = tuple[int, Key, int]
"""``(block_id, key, ref_cnt)``: one cached block as it appears in a snapshot."""


@dataclass(slots=True)
class BlockStatus:
    """One CPU block: its id and reference count (upstream ``BlockStatus``, §1.1).

    ``ref_cnt == -1``: a store is in flight (not ready; the state a block is created in);
    ``0``: idle (evictable); ``> 0``: the number of in-flight loads (pinned).
    """

    block_id: int
    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        """Whether the block may be read (its store completed)."""
        return self.ref_cnt >= 0


def block_entries(items: Iterable[tuple[Key, BlockStatus]]) -> tuple[BlockEntry, ...]:
    """The cached blocks ordered by block id: a canonical order that needs no key comparison.

    Block ids of cached blocks are distinct (the pool hands each id to one key at a time), so the
    order is total; keys may be of any hashable type.
    """
    return tuple(sorted(((b.block_id, k, b.ref_cnt) for k, b in items), key=lambda e: e[0]))
