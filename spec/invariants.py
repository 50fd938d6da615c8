"""Invariants as pure predicates over snapshots — one name per invariant, used everywhere.

Each predicate returns ``None`` when it holds and a message naming the offending pages otherwise.
The same names appear in the stateful machines, the proofs and the mutant catalogue
(shared/DESIGN.md "Invariants"). Reference: shared/reference/infinilm.md §8.1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from spec.infinilm.snapshot import BlockManagerSnapshot

Violation = str | None


def free_and_used_partition_pool(s: BlockManagerSnapshot) -> Violation:
    """The free deque (no duplicates) and the used set partition ``{0..N-1}``."""
    free, used = set(s.free_block_ids), set(s.used_block_ids)
    if (
        len(free) + len(used) == s.num_blocks
        and len(free) == len(s.free_block_ids)
        and free | used == set(range(s.num_blocks))
    ):
        return None  # fast path: a partition, no duplicates
    dupes = sorted(p for p, n in Counter(s.free_block_ids).items() if n > 1)
    if dupes:
        return f"pages {dupes} appear twice on the free deque"
    both = sorted(free & used)
    if both:
        return f"pages {both} are both free and used"
    missing = sorted(set(range(s.num_blocks)) - free - used)
    if missing:
        return f"pages {missing} are neither free nor used"
    return f"ids {sorted((free | used) - set(range(s.num_blocks)))} are outside the pool"


def free_pages_unreferenced(s: BlockManagerSnapshot) -> Violation:
    """Every free page has ref_count 0 and no hash; no ref count is negative."""
    bad = [
        p for p in s.free_block_ids if 0 <= p < s.num_blocks and (s.ref_counts[p] or s.hashes[p])
    ]
    if bad:
        return f"free pages {bad} are referenced or hashed"
    negative = [p for p, r in enumerate(s.ref_counts) if r < 0]
    if negative:
        return f"pages {negative} have negative ref counts"
    return None


def prefix_index_consistent(s: BlockManagerSnapshot) -> Violation:
    """``p in index[h]`` iff ``hash(p) == h != b""``; indexed pages are used; no empty sets."""
    indexed = {(h, p) for h, ids in s.hash_to_block_ids for p in ids}
    hashed = {(h, p) for p, h in enumerate(s.hashes) if h}
    if indexed != hashed:
        return (
            f"index and page hashes disagree: indexed-not-hashed "
            f"{sorted(p for _, p in indexed - hashed)}, hashed-not-indexed "
            f"{sorted(p for _, p in hashed - indexed)}"
        )
    empty = [h.hex() for h, ids in s.hash_to_block_ids if not ids]
    if empty:
        return f"empty index sets for hashes {empty}"
    used = set(s.used_block_ids)
    stray = sorted(p for _, p in indexed if p not in used)
    if stray:
        return f"indexed pages {stray} are not in use"
    return None


def referenced_count_matches_live_pages(
    s: BlockManagerSnapshot,
    usable_blocks: int,
    holders: Iterable[Iterable[int]] | None = None,
) -> Violation:
    """``usable == N - |{p : ref(p) > 0}|``; with ``holders`` also ``ref(p)`` == occurrences of p.

    ``usable_blocks`` is what the target's ``get_total_usable_blocks()`` answered (an O(1) counter in
    #576-style implementations, so this checks the counter); ``holders`` are the live block tables
    and pins a driver knows of.
    """
    live = sum(1 for r in s.ref_counts if r > 0)
    if usable_blocks != s.num_blocks - live:
        return f"usable={usable_blocks} but N - referenced = {s.num_blocks} - {live}"
    if holders is not None:
        expected: Counter[int] = Counter()
        for table in holders:
            expected.update(table)
        wrong = {
            p: (r, expected.get(p, 0))
            for p, r in enumerate(s.ref_counts)
            if r != expected.get(p, 0)
        }
        if wrong:
            return "ref_count != live occurrences (page: (ref, occurrences)): " + str(wrong)
    return None


def no_live_eviction(s: BlockManagerSnapshot, holders: Iterable[Iterable[int]]) -> Violation:
    """No page held by a live table or pin is on the free deque."""
    free = set(s.free_block_ids)
    evicted = sorted({p for table in holders for p in table if p in free})
    if evicted:
        return f"live pages {evicted} were returned to the free deque"
    return None


def no_leak_at_quiescence(s: BlockManagerSnapshot) -> Violation:
    """With no live holder left, every page is free or an unreferenced cached page."""
    leaked = [p for p, r in enumerate(s.ref_counts) if r != 0]
    if leaked:
        return f"pages {leaked} are still referenced at quiescence"
    return None


def atomic_failure(before: BlockManagerSnapshot, after: BlockManagerSnapshot) -> Violation:
    """A validate-first operation that raised left every observable unchanged."""
    changed = before.differing_fields(after)
    if changed:
        return f"a rejected operation changed {changed}"
    return None


def identical_eviction_order(spec_free: tuple[int, ...], target_free: tuple[int, ...]) -> Violation:
    """Spec and target put pages on the free deque in the same order (same evictions, same order)."""
    if spec_free != target_free:
        return f"free deque differs: spec {list(spec_free)} vs target {list(target_free)}"
    return None


# Predicates of one snapshot alone, checked after every step by every checker.
STATE_INVARIANTS: Mapping[str, Callable[[BlockManagerSnapshot], Violation]] = {
    "free_and_used_partition_pool": free_and_used_partition_pool,
    "free_pages_unreferenced": free_pages_unreferenced,
    "prefix_index_consistent": prefix_index_consistent,
}
