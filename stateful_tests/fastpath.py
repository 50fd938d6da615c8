"""Verdict-preserving shortcuts for the checkers' hottest invariants.

Each function here answers ``True`` only when the spec predicates it stands for would all return
``None`` on the same arguments; ``False`` says nothing, and the caller then runs the predicates
themselves, so a failure is always reported by the predicate, with its own message. They live
here, not in ``spec/invariants.py``, so that the spec keeps only the plain definitions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain

from spec.infinilm.snapshot import BlockManagerSnapshot


def ledger_holds(snap: BlockManagerSnapshot, usable: int, tables: Iterable[Iterable[int]]) -> bool:
    """``referenced_count_matches_live_pages(snap, usable, tables)`` and
    ``no_live_eviction(snap, tables)`` both hold.

    Why: the pages with a non-zero ref count, as a dict, equal the occurrence counts of the
    tables, so every ref count is its page's occurrences (0 where it has none) and the referenced
    pages number ``len(live)`` (the counter check); and no table page is free."""
    occurrences = Counter(chain.from_iterable(tables))
    live = {p: r for p, r in enumerate(snap.ref_counts) if r}
    return (
        usable == snap.num_blocks - len(live)
        and dict.__eq__(occurrences, live)
        and set(snap.free_block_ids).isdisjoint(occurrences)
    )
