"""Production LRU offload policy: the spec's API and observables, eviction without walking busy blocks.

* ``variant="v2"`` (#46216): besides ``blocks`` (key -> block, insertion order, never used for
  ordering), an ordered ``evictable_blocks`` holds exactly the idle keys, least recent first. The
  manager reports every ``ref_cnt`` transition to and from 0 (``mark_evictable`` /
  ``mark_non_evictable``), so eviction walks only idle keys and skips just the protected ones,
  instead of the spec's walk over every cached block. Its order equals the spec's order
  restricted to idle blocks: both append a key when it becomes idle or is touched while idle.
* ``variant="v1"``: one ordered dict, as the spec (and upstream before #46216); the walk stops as
  soon as ``n`` victims are found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet

from spec.errors import InvalidArgument
from spec.infinilm.block_manager import check_count
from spec.vllm import BlockStatus, Key, block_entries
from spec.vllm.lru import LRU_VARIANTS, LRUSnapshot, LRUVariant

__all__ = ["LRUCachePolicy", "LRUSnapshot"]


class LRUCachePolicy:
    """Drop-in replacement for :class:`spec.vllm.lru.LRUCachePolicy`."""

    def __init__(self, cache_capacity: int, *, variant: LRUVariant = "v2") -> None:
        check_count("cache_capacity", cache_capacity)
        if variant not in LRU_VARIANTS:
            raise InvalidArgument(f"LRU variant must be one of {LRU_VARIANTS}, got {variant!r}")
        self.cache_capacity = cache_capacity
        self.variant: LRUVariant = variant
        self._v2 = variant == "v2"
        # v1: recency order of every block. v2: insertion order only (not observable).
        self.blocks: OrderedDict[Key, BlockStatus] = OrderedDict()
        # v2 only: exactly the keys with ref_cnt == 0, least recent first. Empty under v1.
        self.evictable_blocks: OrderedDict[Key, None] = OrderedDict()

    def snapshot(self) -> LRUSnapshot:
        order = tuple(self.evictable_blocks) if self._v2 else tuple(self.blocks)
        return LRUSnapshot(blocks=block_entries(self.blocks.items()), order=order)

    def items(self) -> Iterator[tuple[Key, BlockStatus]]:
        yield from self.blocks.items()

    def get(self, key: Key) -> BlockStatus | None:
        return self.blocks.get(key)

    def insert(self, key: Key, block: BlockStatus) -> None:
        self.blocks[key] = block
        if self._v2 and block.ref_cnt == 0:  # never true from the manager (blocks start pending)
            self.evictable_blocks[key] = None

    def remove(self, key: Key) -> None:
        del self.blocks[key]
        if self._v2:
            self.evictable_blocks.pop(key, None)

    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        # v2: evictable_blocks holds exactly the idle keys, so membership is the ref_cnt == 0 test.
        recency = self.evictable_blocks if self._v2 else self.blocks
        for key in reversed(list(keys)):
            if key in recency:
                recency.move_to_end(key)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        """No-op, as the spec's: the keys are not cached."""

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        check_count("n", n)
        if n == 0:
            return []
        blocks = self.blocks
        victims: list[tuple[Key, BlockStatus]] = []
        if self._v2:
            for key in self.evictable_blocks:  # idle keys only: no ref_cnt test needed
                if key not in protected:
                    victims.append((key, blocks[key]))
                    if len(victims) == n:
                        break
        else:
            for key, block in blocks.items():
                if block.ref_cnt == 0 and key not in protected:
                    victims.append((key, block))
                    if len(victims) == n:
                        break
        if len(victims) < n:
            return None  # nothing mutated yet: atomic_failure
        for key, _ in victims:
            del blocks[key]
            if self._v2:
                del self.evictable_blocks[key]
        return victims

    def clear(self) -> None:
        self.blocks.clear()
        self.evictable_blocks.clear()

    def mark_evictable(self, key: Key) -> None:
        if self._v2:
            self.evictable_blocks[key] = None  # became idle: most recent

    def mark_non_evictable(self, key: Key) -> None:
        if self._v2:
            del self.evictable_blocks[key]
