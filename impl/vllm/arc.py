"""Production ARC offload policy: the spec's API and observables, batch eviction in one pass.

#50992 (reference §2.3 variant B): the spec rescans T1/T2 from the LRU end for every victim, which
makes a batch eviction O(n·|T|) when the front of a list is pinned or protected. Here each list
gets one iterator for the whole call; an entry is visited at most once per call, and mutation is
deferred until all victims are found, so a failed eviction still changes nothing.

Why the victims are the spec's, in the spec's order (relies on ``atomic_failure`` and on
eligibility being fixed during a call): nothing mutates while selecting and eligibility
(``ref_cnt == 0 and key not in protected``) cannot change mid-call, so "the next eligible entry
after the last one this iterator returned" is exactly "the first eligible entry not yet taken",
which is what the spec's rescan computes. The #55461 fallback reuses the *same* T1 iterator, and an
exhausted iterator stays exhausted (never restarted, never ``StopIteration`` out of the call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TypeVar

from spec.errors import InvalidArgument
from spec.infinilm.block_manager import check_count
from spec.vllm import BlockStatus, Key
from spec.vllm.arc import ARCSnapshot, read_arc_policy

__all__ = ["ARCCachePolicy", "ARCSnapshot", "one_pass_victims"]


K = TypeVar("K")
B = TypeVar("B")


def _next_eligible(
    entries: Iterator[tuple[K, B]], eligible: Callable[[K, B], bool]
) -> tuple[K, B] | None:
    """Advance ``entries`` to its next eligible entry; ``None`` (and exhausted) if there is none."""
    for key, block in entries:
        if eligible(key, block):
            return key, block
    return None


def one_pass_victims(
    t1: Iterable[tuple[K, B]],
    t2: Iterable[tuple[K, B]],
    t1_size: int,
    target: int,
    n: int,
    t1_fallback: bool,
    eligible: Callable[[K, B], bool],
) -> list[tuple[K, B, bool]] | None:
    """The pure kernel of ``evict``: same contract as :func:`spec.vllm.arc.rescan_victims`.

    pre: n >= 0
    post: _ is None or len(_) == n
    One iterator per list for the whole call (#50992): each entry is visited at most once. The
    #55461 fallback reuses the same T1 iterator; an exhausted iterator stays exhausted.
    """
    t1_iter, t2_iter = iter(t1), iter(t2)
    virtual = t1_size
    picks: list[tuple[K, B, bool]] = []
    for _ in range(n):
        if virtual >= target:
            entry = _next_eligible(t1_iter, eligible)
            if entry is not None:
                virtual -= 1
                picks.append((*entry, True))
                continue
        entry = _next_eligible(t2_iter, eligible)
        if entry is not None:
            picks.append((*entry, False))  # T2 picks leave the virtual T1 size alone
            continue
        if t1_fallback:
            entry = _next_eligible(t1_iter, eligible)
            if entry is not None:
                virtual -= 1
                picks.append((*entry, True))
                continue
        return None
    return picks


class ARCCachePolicy:
    """Drop-in replacement for :class:`spec.vllm.arc.ARCCachePolicy`."""

    def __init__(self, cache_capacity: int, *, t1_fallback: bool = False) -> None:
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
        return read_arc_policy(self)

    def items(self) -> Iterator[tuple[Key, BlockStatus]]:
        yield from self.t1.items()
        yield from self.t2.items()

    def get(self, key: Key) -> BlockStatus | None:
        block = self.t1.get(key)
        return block if block is not None else self.t2.get(key)

    def insert(self, key: Key, block: BlockStatus) -> None:
        self.t1[key] = block
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: Key) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        # Same arithmetic, in the same order, as the spec: the float target must match bit for bit.
        t1, t2 = self.t1, self.t2
        for key in reversed(list(keys)):
            block = t1.pop(key, None)
            if block is not None:
                if block.is_ready:
                    t2[key] = block
                else:
                    t1[key] = block
            elif key in t2:
                t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        # keys about to be stored are never cached: only the ghost branch of touch applies
        for key in reversed(keys):
            self._ghost_hit(key)

    def _ghost_hit(self, key: Key) -> None:
        b1, b2 = self.b1, self.b2
        if key in b1:
            delta = max(1, len(b2) / len(b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            b1.move_to_end(key)
        elif key in b2:
            delta = max(1, len(b1) / len(b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            b2.move_to_end(key)

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        check_count("n", n)
        if n == 0:
            return []
        t1, t2 = self.t1, self.t2
        picks = one_pass_victims(
            t1.items(),
            t2.items(),
            len(t1),
            int(self.target_t1_size),  # constant during the call: touch is not called here
            n,
            self.t1_fallback,
            lambda key, block: block.ref_cnt == 0 and key not in protected,
        )
        if picks is None:
            return None  # nothing mutated yet: atomic_failure
        b1, b2 = self.b1, self.b2
        for key, _, from_t1 in picks:  # deferred commit, in selection order
            if from_t1:
                del t1[key]
                b1[key] = None
            else:
                del t2[key]
                b2[key] = None
        capacity = self.cache_capacity
        for ghost in (b1, b2):
            for _ in range(len(ghost) - capacity):
                ghost.popitem(last=False)
        return [(key, block) for key, block, _ in picks]

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def mark_evictable(self, key: Key) -> None:
        return

    def mark_non_evictable(self, key: Key) -> None:
        return
