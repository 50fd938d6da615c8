"""Set tables up to behaviour: which hash tables of a small set of page ids no use can tell apart.

A block manager's sets (the used pages, each prefix-index entry) are state beyond what a snapshot
shows: the hash table decides the iteration order after later adds and removes (eviction order,
which duplicate-hash page a lookup pins). The explorer keys its states by the tables themselves
(:func:`~proofs.explorer.set_clone.set_layout`), which over-distinguishes: two tables that differ
only in where a dummy sits, or in a fill that will never trigger a resize, behave alike forever.

:func:`layout_classes` computes, for sets of page ids ``0..n-1``, every table reachable from an
empty set by the operations a set offers (add and remove of an id, ``pop``, ``copy``, ``clear``)
and the coarsest partition of them such that two tables in one class iterate in the same order
now and stay in one class after every operation (partition refinement, as for a bisimulation).
It is computed by running CPython's own set code (no model of it), once per ``n`` per process.

Two objects whose sets are in the same classes and whose other state is equal therefore answer
every call alike — *provided* nothing but those operations (and reads of iteration order,
membership and size) ever touches the sets, and only ids ``0..n-1`` are ever added: true of
kvspec's own block managers, which add only page ids they took from the free deque or validated,
and never introspect a table. The block-manager model uses the classes for exactly those classes
and keeps every other object's raw tables (``BlockManagerBounds.layout_classes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proofs.explorer.set_clone import clone_set, set_layout

MAX_IDS = 4  # 1,731 tables in 916 classes in ~0.2 s; 5 ids: 14,535 tables and ~3 s

Layout = tuple[int, bytes]
_CACHE: dict[int, dict[Layout, int]] = {}
_SETS: dict[int, dict[Layout, set[int]]] = {}  # a set with each table (what the tests replay)


def _operations(n: int) -> list[Callable[[set[int]], set[int]]]:
    """Each operation as a function from a set to the set it leaves (a fresh table for ``copy``)."""

    def add(k: int) -> Callable[[set[int]], set[int]]:
        def op(s: set[int]) -> set[int]:
            s.add(k)
            return s

        return op

    def discard(k: int) -> Callable[[set[int]], set[int]]:
        def op(s: set[int]) -> set[int]:
            s.discard(k)
            return s

        return op

    def pop(s: set[int]) -> set[int]:
        if s:
            s.pop()
        return s

    def clear(s: set[int]) -> set[int]:
        s.clear()
        return s

    def copy(s: set[int]) -> set[int]:
        return s.copy()

    return [*(add(k) for k in range(n)), *(discard(k) for k in range(n)), pop, clear, copy]


def layout_classes(n: int) -> dict[Layout, int]:
    """Every table of a set of ids ``0..n-1`` reachable from ``set()``, mapped to its class."""
    found = _CACHE.get(n)
    if found is not None:
        return found
    ops = _operations(n)
    start: set[int] = set()
    sets: dict[Layout, set[int]] = {set_layout(start): start}
    order = [set_layout(start)]
    moves: list[list[int]] = []  # table number -> the table number after each operation
    number = {order[0]: 0}
    i = 0
    while i < len(order):
        s = sets[order[i]]
        row = []
        for op in ops:
            after = op(clone_set(s))
            key = set_layout(after)
            j = number.get(key)
            if j is None:
                j = number[key] = len(order)
                order.append(key)
                sets[key] = after
            row.append(j)
        moves.append(row)
        i += 1
    # refine: start from what a use sees now (the iteration order), split until stable
    seen: dict[Any, int] = {}
    cls = [seen.setdefault(tuple(sets[k]), len(seen)) for k in order]
    while True:
        seen = {}
        refined = [
            seen.setdefault((cls[j], tuple(cls[t] for t in moves[j])), len(seen))
            for j in range(len(order))
        ]
        if len(seen) == len(set(cls)):
            break
        cls = refined
    _SETS[n] = sets
    found = _CACHE[n] = {key: cls[j] for j, key in enumerate(order)}
    return found


def tables(n: int) -> dict[Layout, set[int]]:
    """A set with each table :func:`layout_classes` found (each a private copy)."""
    layout_classes(n)
    return {key: clone_set(s) for key, s in _SETS[n].items()}
