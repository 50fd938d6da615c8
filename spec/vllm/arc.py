"""vLLM's ARC offload cache policy (``cpu/policies/arc.py``) — the executable spec.

Source of truth: docs/vllm.md §2 (and §0.1, §7.1 O1/O3/O5/O6, §8). Reproduced exactly:

* four ordered lists, front = LRU: ``t1`` (seen once), ``t2`` (seen again), ghosts ``b1``/``b2``
  (keys only), and the float ``target_t1_size`` in ``[0, cache_capacity]`` (§2.1);
* ``touch`` walks the keys *reversed*, so the first key ends most recent; a not-ready T1 block stays
  in T1 (moved to its MRU end, #34576); a ghost hit adapts the target and refreshes the ghost (§2.2);
* ``evict`` is the simple **rescan** selection (§2.3 variant A): per victim, the first eligible
  entry from the front of T1 while the *virtual* T1 size ``v`` is ``>= int(target)``, else of T2;
  ``v`` starts at ``len(t1)`` (ineligible entries included) and drops only on T1 picks;
* eviction is atomic (#37874): nothing — not the lists, not ghost order, not the target — changes
  until all ``n`` victims are found; a failed eviction returns ``None`` and changes nothing; on
  success victims move to their ghost list's MRU end in selection order, then both ghost lists are
  trimmed from the front to ``cache_capacity``;
* variant ``t1_fallback`` (#55461, §2.5, O6): when T2 has no further eligible entry, fall back to
  T1 (still ``v -= 1``) before failing. ``False`` is the #50992 state.

Eligibility (§2.1, §8): ``ref_cnt == 0 and key not in protected`` (pending stores and loading
blocks are never victims). The production version (``impl/vllm/arc.py``, #50992 monotonic
iterators) must select the same victims in the same order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple, TypeVar

from spec.errors import InvalidArgument
from spec.infinilm.block_manager import check_count
from spec.vllm import BlockEntry, BlockStatus, Key, block_entries

__all__ = ["ARCCachePolicy", "ARCSnapshot", "read_arc_policy", "rescan_victims"]


K = TypeVar("K")
B = TypeVar("B")


def rescan_victims(
    t1: Iterable[tuple[K, B]],
    t2: Iterable[tuple[K, B]],
    t1_size: int,
    target: int,
    n: int,
    t1_fallback: bool,
    eligible: Callable[[K, B], bool],
) -> list[tuple[K, B, bool]] | None:
    """ARC victim selection by rescanning (§2.3 variant A): the pure kernel of ``evict``.

    ``t1``/``t2`` are ``(key, block)`` from the LRU end; ``t1_size`` is ``len(t1)``, ineligible
    entries included; ``target`` is ``int(target_t1_size)``; ``eligible(key, block)`` is asked on
    every visit, as the legacy rescan does.

    pre: n >= 0
    post: _ is None or len(_) == n
    Returns ``[(key, block, from_t1), ...]`` in selection order, or ``None`` if fewer than ``n``
    victims can be chosen. Per victim: the first eligible, not yet taken entry of T1 while the
    virtual T1 size ``v`` (``t1_size`` minus T1 picks so far) is ``>= target``, else of T2, else
    (``t1_fallback``, #55461) of T1.
    """
    t1, t2 = list(t1), list(t2)
    taken: set[K] = set()
    picks: list[tuple[K, B, bool]] = []

    def first(entries: list[tuple[K, B]]) -> tuple[K, B] | None:
        for key, block in entries:  # rescan from the LRU end every time
            if eligible(key, block) and key not in taken:
                return key, block
        return None

    virtual = t1_size
    for _ in range(n):
        from_t1 = virtual >= target
        pick = first(t1) if from_t1 else None
        if pick is None:
            from_t1, pick = False, first(t2)
        if pick is None and t1_fallback:
            from_t1, pick = True, first(t1)
        if pick is None:
            return None
        if from_t1:
            virtual -= 1  # only T1 picks shrink the virtual T1 (§2.3)
        picks.append((*pick, from_t1))
        taken.add(pick[0])
    return picks


class ARCSnapshot(NamedTuple):
    """Every observable of an ARC policy; hashable and comparable.

    ``blocks`` is every cached block ``(block_id, key, ref_cnt)`` by block id; the four lists are
    keys front (LRU, evicted first) to back (MRU); ``target_t1_size`` is always a float.
    """

    blocks: tuple[BlockEntry, ...]
    t1: tuple[Key, ...]
    t2: tuple[Key, ...]
    b1: tuple[Key, ...]
    b2: tuple[Key, ...]
    target_t1_size: float

    def differing_fields(self, other: ARCSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]


def read_arc_policy(policy: Any) -> ARCSnapshot:
    """Snapshot any object with upstream ARC attribute names (``t1``, ``t2``, ``b1``, ``b2``,
    ``target_t1_size``; T1/T2 values with ``block_id`` and ``ref_cnt``)."""
    return ARCSnapshot(
        blocks=block_entries([*policy.t1.items(), *policy.t2.items()]),
        t1=tuple(policy.t1),
        t2=tuple(policy.t2),
        b1=tuple(policy.b1),
        b2=tuple(policy.b2),
        target_t1_size=float(policy.target_t1_size),
    )


class ARCCachePolicy:
    """Adaptive Replacement Cache over offload keys (reference §2)."""

    def __init__(self, cache_capacity: int, *, t1_fallback: bool = False) -> None:
        """Pre: ``cache_capacity >= 0``; ``t1_fallback`` is a bool. Post: all lists empty, target 0."""
        check_count("cache_capacity", cache_capacity)
        if not isinstance(t1_fallback, bool):
            raise InvalidArgument(f"t1_fallback must be a bool, got {t1_fallback!r}")
        self.cache_capacity = cache_capacity
        self.t1_fallback = t1_fallback
        self.target_t1_size: float = 0.0
        self.t1: OrderedDict[Key, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[Key, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()

    def snapshot(self) -> ARCSnapshot:
        """All observable state (see :class:`ARCSnapshot`)."""
        return read_arc_policy(self)

    def items(self) -> Iterator[tuple[Key, BlockStatus]]:
        """Every cached ``(key, block)``: T1 front to back, then T2."""
        yield from self.t1.items()
        yield from self.t2.items()

    # ------------------------------------------------------------ the CachePolicy verbs
    def get(self, key: Key) -> BlockStatus | None:
        """The block cached under ``key`` (T1 or T2), else ``None``. Ghosts are not cached."""
        block = self.t1.get(key)
        return block if block is not None else self.t2.get(key)

    def insert(self, key: Key, block: BlockStatus) -> None:
        """Pre: ``key`` is not cached. Post: ``key`` at T1's MRU end and in no ghost list.

        No target adaptation here (§2.4): only ``touch`` adapts.
        """
        self.t1[key] = block
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: Key) -> None:
        """Post: ``key`` is in neither T1 nor T2, and *no* ghost entry is made (failed store)."""
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        """Record an access to each key, last key first (§2.2; ``req_context`` unused, #47744).

        Post, per key in *reversed* order: a ready T1 block moves to T2's MRU end, a not-ready one
        to T1's MRU end (#34576); a T2 block to T2's MRU end; a B1 ghost raises the target by
        ``max(1, |B2|/|B1|)`` (capped at capacity), a B2 ghost lowers it by ``max(1, |B1|/|B2|)``
        (floored at 0), and the ghost moves to its list's MRU end; unknown keys are ignored.
        """
        for key in reversed(list(keys)):
            if key in self.t1:
                block = self.t1.pop(key)
                if block.is_ready:
                    self.t2[key] = block
                else:
                    self.t1[key] = block  # a store in flight is not a second access
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        """Keys about to be stored, as ghost hits (vLLM 0.31.0+, ``arc_store_miss``).

        Post, per key in *reversed* order: a B1 or B2 ghost adapts the target and moves to its
        list's MRU end as in :meth:`touch`; other keys change nothing. T1 and T2 are untouched.
        """
        for key in reversed(keys):
            self._ghost_hit(key)

    def _ghost_hit(self, key: Key) -> None:
        """A B1 ghost raises the target by ``max(1, |B2|/|B1|)`` (capped at capacity), a B2 ghost
        lowers it by ``max(1, |B1|/|B2|)`` (floored at 0); the ghost moves to its MRU end."""
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        """Evict exactly ``n`` eligible blocks, atomically (§2.3 variant A, + C if ``t1_fallback``).

        Pre: ``n >= 0``. Post on success: the victims, in selection order, left T1/T2 for the
        MRU end of B1/B2 (by origin); both ghost lists were trimmed from the front to capacity;
        returns ``[(key, block), ...]`` in selection order (``[]`` for ``n == 0``). If fewer than
        ``n`` victims can be selected: returns ``None`` and nothing changed.
        """
        check_count("n", n)
        if n == 0:
            return []
        picks = rescan_victims(
            self.t1.items(),
            self.t2.items(),
            len(self.t1),
            int(self.target_t1_size),  # int() truncates the float target
            n,
            self.t1_fallback,
            lambda key, block: block.ref_cnt == 0 and key not in protected,
        )
        if picks is None:
            return None  # atomic: nothing has been mutated yet
        for key, _, from_t1 in picks:  # commit, in selection order
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.cache_capacity:
                ghost.popitem(last=False)
        return [(key, block) for key, block, _ in picks]

    def clear(self) -> None:
        """Post: all four lists empty and the target back to 0.0 (``reset_cache``)."""
        for entries in (self.t1, self.t2, self.b1, self.b2):
            entries.clear()
        self.target_t1_size = 0.0

    def mark_evictable(self, key: Key) -> None:
        """No-op: ARC computes eligibility from ``ref_cnt`` on the fly (§2.1)."""

    def mark_non_evictable(self, key: Key) -> None:
        """No-op: ARC computes eligibility from ``ref_cnt`` on the fly (§2.1)."""
