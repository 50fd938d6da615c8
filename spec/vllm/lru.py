"""vLLM's LRU offload cache policy (``cpu/policies/lru.py``) — the executable spec.

Source of truth: docs/vllm.md §3 (and §7.1 O7/O9, §8). Two named variants:

* ``variant="v1"`` (#37874 up to #46216, §3.1): recency = insertion (``prepare_store``) or
  ``touch``, whatever the block's state; loads and store completions do not reorder.
* ``variant="v2"`` (#46216, §3.2, the #50992 state): recency = the moment a block last *became
  idle* (store completion, last load completion) or was touched *while idle*; touching a pending
  or loading block does nothing.

The spec keeps one ordered dict of every cached block, front = least recent, and in both variants
evicts the first ``n`` entries with ``ref_cnt == 0`` that are not protected (atomic: fewer -> ``None``,
nothing changed). For v2 ``mark_evictable`` moves the block to the back; the positions of busy
blocks are then irrelevant (each one is moved to the back when it becomes idle), so the observable
order of v2 is the order of the *idle* blocks only. Upstream v2 keeps those in a separate
``evictable_blocks`` dict (that is what ``impl/vllm/lru.py`` does); both give the same victims.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal, NamedTuple

from spec.errors import InvalidArgument
from spec.infinilm.block_manager import check_count
from spec.vllm import BlockEntry, BlockStatus, Key, block_entries

__all__ = ["LRUCachePolicy", "LRUSnapshot", "LRUVariant", "read_lru_policy"]

LRUVariant = Literal["v1", "v2"]
LRU_VARIANTS: tuple[LRUVariant, ...] = ("v1", "v2")


class LRUSnapshot(NamedTuple):
    """Every observable of an LRU policy; hashable and comparable.

    ``blocks`` is every cached block ``(block_id, key, ref_cnt)`` by block id; ``order`` is the
    eviction order, front (evicted first) to back: v1 every cached key, v2 the idle keys only.
    """

    blocks: tuple[BlockEntry, ...]
    order: tuple[Key, ...]

    def differing_fields(self, other: LRUSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]


def read_lru_policy(policy: Any) -> LRUSnapshot:
    """Snapshot an object with upstream LRU attribute names.

    ``blocks`` maps key -> block (``block_id``, ``ref_cnt``); an upstream v2 object also has
    ``evictable_blocks`` (idle keys in LRU order), whose order is then the eviction order.
    """
    evictable = getattr(policy, "evictable_blocks", None)
    order = tuple(policy.blocks) if evictable is None else tuple(evictable)
    return LRUSnapshot(blocks=block_entries(policy.blocks.items()), order=order)


class LRUCachePolicy:
    """Least-recently-used over offload keys, in the named ``variant`` (reference §3)."""

    def __init__(self, cache_capacity: int, *, variant: LRUVariant = "v2") -> None:
        """Pre: ``cache_capacity >= 0`` (unused, as upstream); ``variant`` in ``("v1", "v2")``.

        Post: empty.
        """
        check_count("cache_capacity", cache_capacity)
        if variant not in LRU_VARIANTS:
            raise InvalidArgument(f"LRU variant must be one of {LRU_VARIANTS}, got {variant!r}")
        self.cache_capacity = cache_capacity
        self.variant: LRUVariant = variant
        self.blocks: OrderedDict[Key, BlockStatus] = OrderedDict()  # front = least recent

    def snapshot(self) -> LRUSnapshot:
        """All observable state (see :class:`LRUSnapshot`)."""
        order = (
            tuple(self.blocks)
            if self.variant == "v1"
            else tuple(k for k, b in self.blocks.items() if b.ref_cnt == 0)
        )
        return LRUSnapshot(blocks=block_entries(self.blocks.items()), order=order)

    def items(self) -> Iterator[tuple[Key, BlockStatus]]:
        """Every cached ``(key, block)``, least recent first."""
        yield from self.blocks.items()

    # ------------------------------------------------------------ the CachePolicy verbs
    def get(self, key: Key) -> BlockStatus | None:
        """The block cached under ``key``, else ``None``."""
        return self.blocks.get(key)

    def insert(self, key: Key, block: BlockStatus) -> None:
        """Pre: ``key`` is not cached. Post: ``key`` is the most recent entry."""
        self.blocks[key] = block

    def remove(self, key: Key) -> None:
        """Pre: ``key`` is cached. Post: it is not (failed store)."""
        del self.blocks[key]

    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        """Make each key most recent, last key first, so ``keys[0]`` ends most recent (§3).

        v2: only idle blocks (``ref_cnt == 0``) move; pending or loading ones do not (§3.2).
        Unknown keys are ignored; ``req_context`` is unused (#47744).
        """
        for key in reversed(list(keys)):
            block = self.blocks.get(key)
            if block is not None and (self.variant == "v1" or block.ref_cnt == 0):
                self.blocks.move_to_end(key)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        """No-op: upstream forwards store misses to ``touch``, and the keys are not cached."""

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        """Evict the ``n`` least recent idle, unprotected blocks, atomically (§3.1, §3.2).

        Pre: ``n >= 0``. Post on success: they are gone; returns ``[(key, block), ...]`` least
        recent first (``[]`` for ``n == 0``). Fewer than ``n`` eligible: ``None``, no change.
        """
        check_count("n", n)
        if n == 0:
            return []
        victims = [
            (key, block)
            for key, block in self.blocks.items()
            if block.ref_cnt == 0 and key not in protected
        ][:n]
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self.blocks[key]
        return victims

    def clear(self) -> None:
        """Post: empty (``reset_cache``)."""
        self.blocks.clear()

    def mark_evictable(self, key: Key) -> None:
        """The block's ``ref_cnt`` just became 0. v2: it becomes the most recent entry (§3.2)."""
        if self.variant == "v2":
            self.blocks.move_to_end(key)

    def mark_non_evictable(self, key: Key) -> None:
        """The block's ``ref_cnt`` just left 0: nothing to do here (eviction skips busy blocks)."""
