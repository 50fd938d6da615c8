"""Verdict-preserving shortcuts for the checkers' hottest invariants.

Each function here answers ``True`` only when the spec predicates it stands for would all return
``None`` on the same arguments; ``False`` says nothing, and the caller then runs the predicates
themselves, so a failure is always reported by the predicate, with its own message. They live
here, not in ``spec/invariants.py``, so that the spec keeps only the plain definitions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import compress
from operator import itemgetter, not_

from spec.infinilm.prefix_cache import EMPTY_BLOCK_HASH as EMPTY
from spec.infinilm.request import TERMINAL
from spec.infinilm.snapshot import BlockManagerSnapshot, SchedulerSnapshot


def page_occurrences(num_blocks: int, tables: Iterable[Iterable[int]]) -> tuple[int, ...] | None:
    """How often each page ``0..num_blocks-1`` occurs in ``tables`` (``None`` if a table holds an
    id outside the pool or not an int): what ``referenced_count_matches_live_pages`` expects the
    ref counts to be. Drivers compute it once per distinct ledger, not once per call."""
    counts = [0] * num_blocks
    for table in tables:
        for page in table:
            if type(page) is not int or not 0 <= page < num_blocks:
                return None
            counts[page] += 1
    return tuple(counts)


def counts_hold(snap: BlockManagerSnapshot, usable: int, occurrences: tuple[int, ...]) -> bool:
    """``referenced_count_matches_live_pages(snap, usable, tables)`` and
    ``no_live_eviction(snap, tables)`` both hold, for ledger ``tables`` whose
    :func:`page_occurrences` are ``occurrences``.

    Why: ref counts equal to the occurrences are non-negative, so the referenced pages are those
    whose count is not 0, and the counter check is ``usable == count(0)``; a free page that some
    table holds has a non-zero occurrence count (free ids outside the pool are held by none)."""
    refs = snap.ref_counts
    if refs != occurrences or usable != refs.count(0) or snap.num_blocks != len(refs):
        return False
    n = len(refs)
    return not any(occurrences[p] for p in snap.free_block_ids if type(p) is int and 0 <= p < n)


def state_holds(s: BlockManagerSnapshot) -> bool:
    """Every predicate of ``spec.invariants.STATE_INVARIANTS`` holds on ``s``.

    Why, predicate by predicate: ``free_and_used_partition_pool`` — free + used, sorted, is
    ``0..N-1`` (every id once, none outside); ``free_pages_unreferenced`` — each free page has
    count 0 and no hash, and the smallest count is >= 0; ``prefix_index_consistent`` — no
    index key is empty or the empty hash, every indexed page is an in-range int whose hash is the
    key, no page is indexed twice, and the indexed pages are as many as the hashed ones (so the
    (hash, page) pairs are the same sets); indexed pages are hashed, hence not free (free pages
    are unhashed), hence used (the partition)."""
    try:
        return _state_holds(s)
    except (TypeError, IndexError):  # ids or counts of odd types: the predicates decide
        return False


def _state_holds(s: BlockManagerSnapshot) -> bool:
    n, free, refs, hashes = s.num_blocks, s.free_block_ids, s.ref_counts, s.hashes
    if len(refs) != n or len(hashes) != n or sorted(free + s.used_block_ids) != list(range(n)):
        return False
    if n and min(refs) < 0:
        return False
    for p in free:
        if refs[p] or hashes[p]:
            return False
    seen: set[int] = set()
    for h, ids in s.hash_to_block_ids:
        if not ids or not h:
            return False
        for p in ids:
            if type(p) is not int or not 0 <= p < n or hashes[p] != h or p in seen:
                return False
            seen.add(p)
    return len(seen) == n - hashes.count(EMPTY)


_ID, _STATUS = itemgetter(0), itemgetter(1)
_TERMINAL_NAMES = frozenset(status.name for status in TERMINAL)


def placement_holds(s: SchedulerSnapshot, lost: Collection[str]) -> bool:
    """``request_in_exactly_one_place(s, lost)`` holds.

    Why: no id repeats among the placed ones, and the rows whose status is a live one (the
    non-terminal names) are all placed or lost; found with C-level iteration, no Python loop
    per row."""
    places = s.placed()
    placed = set(places)
    if len(placed) != len(places):
        return False
    rows = s.requests
    terminal = map(_TERMINAL_NAMES.__contains__, map(_STATUS, rows))
    live = set(compress(map(_ID, rows), map(not_, terminal)))
    return live <= placed or not (live - placed).difference(lost)
