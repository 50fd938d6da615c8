"""Mutants planted in code the impl inlines still change what runs.

When the impl inlines a helper (eviction in ``try_free_blocks``, admission in the prefill loop), a
mutant that only overrides the helper silently becomes the impl. These mutants carry the impl
method's own source with one substitution; each test drives the impl and the mutant through the
same calls and shows the planted difference directly, without a checker in between.
"""

from __future__ import annotations

import pytest

from impl.infinilm.block_manager import BlockManager
from stateful_tests import mutants_infinilm as m
from stateful_tests.planting import method_with

HASH = b"\x01" * 16


def _one_cached_page(cls: type[BlockManager]) -> BlockManager:
    """A 3-page pool: page 0 published under HASH and released (an eviction candidate), page 1
    held, page 2 free."""
    bm = cls(3, 2)
    table, _ = bm.allocate_slots(2)
    bm.publish_computed_blocks(table, [HASH], 0, 2)
    bm.free_blocks(table)
    held = bm.allocate_slots(2)
    assert held is not None and list(bm.free_block_ids) == [2]
    return bm


def test_method_with_needs_exactly_one_match() -> None:
    with pytest.raises(RuntimeError, match="occurs 0 times"):
        method_with(BlockManager.try_free_blocks, "no such text", "x")
    with pytest.raises(RuntimeError, match="occurs 2 times"):
        method_with(BlockManager.try_free_blocks, "if blocks[page].ref_count == 0:", "if True:")


def test_planted_methods_are_not_the_impl_methods() -> None:
    planted = {
        m.HashIndexNotCleanedOnEviction: "try_free_blocks",
        m.CounterDecrementedOnEviction: "try_free_blocks",
        m.LifoFreeList: "try_free_blocks",
    }
    for cls, name in planted.items():
        base = cls.__mro__[1]
        assert cls.__dict__[name] is not getattr(base, name), (cls.__name__, name)
        assert cls.__dict__[name].__qualname__ == getattr(base, name).__qualname__


def test_eviction_mutants_differ_from_the_impl_in_try_free_blocks() -> None:
    impl = _one_cached_page(BlockManager)
    assert impl.try_free_blocks(2) and HASH not in impl.hash_to_block_ids

    stale = _one_cached_page(m.HashIndexNotCleanedOnEviction)
    assert stale.try_free_blocks(2)
    assert stale.hash_to_block_ids.get(HASH) == {0}  # the evicted page is still indexed

    counted = _one_cached_page(m.CounterDecrementedOnEviction)
    assert counted.try_free_blocks(2)
    assert (impl.num_referenced, counted.num_referenced) == (1, 0)

    lifo = _one_cached_page(m.LifoFreeList)
    assert lifo.try_free_blocks(2)
    assert (list(impl.free_block_ids), list(lifo.free_block_ids)) == ([2, 0], [0, 2])
