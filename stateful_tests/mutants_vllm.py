"""Planted bugs in the vLLM CPU offload manager impls, ARC and LRU (the bug-injection catalogue).

Each mutant is a small subclass of an impl class — never an edit of the impl source — whose
docstring names its origin (origins O1-O10: docs/vllm.md §7.1, and §2.3, §2.6, §1.2). The registry
(``kvspec.components``) attaches :data:`ARC_MUTANTS` and :data:`LRU_MUTANTS` to their components.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Any, ClassVar

from impl.vllm.arc import ARCCachePolicy
from impl.vllm.lru import LRUCachePolicy
from impl.vllm.offload_manager import CPULoadStoreSpec, CPUOffloadingManager, LookupResult
from spec.vllm import BlockStatus, Key
from stateful_tests.checker import Mutant


class _ManagerWithPolicy(CPUOffloadingManager):
    """The impl manager with its policy swapped for a planted-bug policy class (same arguments)."""

    arc_cls: ClassVar[type[ARCCachePolicy]] = ARCCachePolicy
    lru_cls: ClassVar[type[LRUCachePolicy]] = LRUCachePolicy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = self._policy
        if isinstance(policy, ARCCachePolicy):
            self._policy = self.arc_cls(policy.cache_capacity, t1_fallback=policy.t1_fallback)
        elif isinstance(policy, LRUCachePolicy):
            self._policy = self.lru_cls(policy.cache_capacity, variant=policy.variant)


@contextmanager
def _forgetting(obj: object, method: str) -> Iterator[None]:
    """Inside the block ``obj.method(...)`` does nothing: a call the code forgot to make."""
    setattr(obj, method, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        delattr(obj, method)


class _TouchPromotesPendingPolicy(ARCCachePolicy):
    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        for key in reversed(list(keys)):
            block = self.t1.pop(key, None)
            if block is not None:
                self.t2[key] = block  # a store in flight counted as a second access
            else:
                super().touch([key], req_context)


class ARCTouchPromotesPendingBlock(_ManagerWithPolicy):
    """O1, vLLM PR #34576: ``touch`` mishandles a not-ready T1 entry — promotes a block whose store
    is still in flight to T2 (it must stay in T1, moved to its MRU end)."""

    arc_cls = _TouchPromotesPendingPolicy


class _TouchKeyErrorPolicy(ARCCachePolicy):
    def touch(self, keys: Iterable[Key], req_context: object = None) -> None:
        for key in reversed(list(keys)):
            block = self.t1.get(key)
            if block is not None and not block.is_ready:
                self.t1.pop(key)
                self.t1.move_to_end(key)  # KeyError: the key was just popped
            super().touch([key], req_context)


class ARCTouchKeyErrorOnPendingBlock(_ManagerWithPolicy):
    """O1, vLLM PR #34576 (the #27039 code): ``touch`` pops a not-ready T1 key and then calls
    ``move_to_end`` on it — a KeyError in async store paths, and the pending block is gone."""

    arc_cls = _TouchKeyErrorPolicy


class _ProtectsNothingPolicy(ARCCachePolicy):
    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        return super().evict(n, frozenset())


class StoreProtectsNothing(_ManagerWithPolicy):
    """O2, vLLM PR #35846: eviction candidates ignore the store's input keys (``protected =
    set()``), so an already-stored block of the same batch can be evicted by the store that
    skipped it — data lost."""

    arc_cls = _ProtectsNothingPolicy


class _ProtectsOnlyNewKeysPolicy(LRUCachePolicy):
    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        return super().evict(n, {k for k in protected if self.get(k) is None})


class StoreProtectsOnlyNewKeys(_ManagerWithPolicy):
    """O2, vLLM PR #35846: ``protected = set(keys_to_store)`` — only the new keys are protected,
    not the already-stored keys of the same batch."""

    lru_cls = _ProtectsOnlyNewKeysPolicy


class _NonAtomicEvictionPolicy(ARCCachePolicy):
    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        victims: list[tuple[Key, BlockStatus]] = []
        for _ in range(n):  # one victim at a time, each committed before the next is found
            one = super().evict(1, protected)
            if one is None:
                return None  # the victims already taken stay evicted
            victims += one
        return victims


class ARCEvictionNotAtomic(_ManagerWithPolicy):
    """O3, the #27039 ARC code (fixed by #37874): eviction mutates before all ``n`` victims are
    found; a store that then fails leaves blocks moved to the ghosts, their ids lost, no event.
    (On success the victims are the same: only failures differ.)"""

    arc_cls = _NonAtomicEvictionPolicy


class FailedStoreDropsReadyKeys(CPUOffloadingManager):
    """O4, the #27039 ARC code (fixed by #37874): ``complete_store(success=False)`` removes the
    keys it is given whatever their state — a ready key passed with a failed batch silently
    disappears and its id leaks (only the not-ready ones are freed)."""

    def complete_store(
        self, keys: Collection[Key], req_context: object = None, success: bool = True
    ) -> None:
        keys = list(keys)
        super().complete_store(keys, req_context, success)
        if success:
            return
        for key in keys:
            block = self._policy.get(key)
            if block is not None and block.is_ready:
                self._policy.remove(key)
                if block.ref_cnt == 0:
                    self._num_evictable_cache_blocks -= 1


class _OnePassARC(ARCCachePolicy):
    """impl's one-pass selection (#50992) written out step by step, so that a mutant changes one
    step: ``_next`` (advance an iterator to its next eligible entry), ``restart_after_t2_pick``,
    ``fallback_restarts_t1``, ``decrement_on_t2_pick``."""

    restart_after_t2_pick = False
    fallback_restarts_t1 = False
    decrement_on_t2_pick = False

    def _next(
        self, entries: Iterator[tuple[Key, BlockStatus]], protected: AbstractSet[Key]
    ) -> tuple[Key, BlockStatus] | None:
        for key, block in entries:
            if block.ref_cnt == 0 and key not in protected:
                return key, block
        return None

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        if n == 0:
            return []
        t1_iter, t2_iter = iter(self.t1.items()), iter(self.t2.items())
        target, virtual = int(self.target_t1_size), len(self.t1)
        picks: list[tuple[Key, BlockStatus, bool]] = []
        for _ in range(n):
            entry = self._next(t1_iter, protected) if virtual >= target else None
            from_t1 = entry is not None
            if entry is None:
                entry = self._next(t2_iter, protected)
                if entry is not None and self.restart_after_t2_pick:
                    t1_iter = iter(self.t1.items())
            if entry is None and self.t1_fallback:
                if self.fallback_restarts_t1:
                    t1_iter = iter(self.t1.items())
                entry = self._next(t1_iter, protected)
                from_t1 = entry is not None
            if entry is None:
                return None
            if from_t1 or self.decrement_on_t2_pick:
                virtual -= 1
            picks.append((*entry, from_t1))
        for key, _, from_t1 in picks:
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


class _RestartAfterT2Policy(_OnePassARC):
    restart_after_t2_pick = True


class ARCIteratorRestartedAfterT2Pick(_ManagerWithPolicy):
    """O5, vLLM PR #50992 hazard: the T1 iterator is restarted after a T2 pick, so an exhausted T1
    scan starts over and re-selects a block already chosen (a duplicate victim)."""

    arc_cls = _RestartAfterT2Policy


class _StopIterationPolicy(_OnePassARC):
    def _next(
        self, entries: Iterator[tuple[Key, BlockStatus]], protected: AbstractSet[Key]
    ) -> tuple[Key, BlockStatus] | None:
        return next((k, b) for k, b in entries if b.ref_cnt == 0 and k not in protected)


class ARCStopIterationOnExhaustedList(_ManagerWithPolicy):
    """O5, vLLM PR #50992 hazard: ``next(...)`` without a default — StopIteration escapes when a
    list has no further eligible entry (e.g. T1 exhausted while its virtual size is >= target)."""

    arc_cls = _StopIterationPolicy


class _NoFallbackPolicy(ARCCachePolicy):
    def __init__(self, cache_capacity: int, *, t1_fallback: bool = False) -> None:
        super().__init__(cache_capacity, t1_fallback=False)


class ARCMissingT1Fallback(_ManagerWithPolicy):
    """O6, vLLM PR #55461: asked for the T1 fallback, eviction still gives up once T2 has no
    eligible entry — stores fail although T1 holds enough idle blocks (the #50992 code)."""

    arc_cls = _NoFallbackPolicy


class _FallbackRestartsPolicy(_OnePassARC):
    fallback_restarts_t1 = True


class ARCFallbackRestartsT1Iterator(_ManagerWithPolicy):
    """O5/O6, vLLM PR #55461 ("preserves the single-pass optimization of #50992"): the fallback
    starts a fresh T1 scan instead of reusing the T1 iterator, re-selecting a block already taken."""

    arc_cls = _FallbackRestartsPolicy


class EvictableCounterNotIncrementedOnStore(CPUOffloadingManager):
    """O8, vLLM PR #45757 hazard: a completed store (``ref_cnt`` -1 -> 0) is not counted as
    evictable; the counter drifts low and the guard returns false ``None``."""

    def complete_store(
        self, keys: Collection[Key], req_context: object = None, success: bool = True
    ) -> None:
        counter = self._num_evictable_cache_blocks
        super().complete_store(keys, req_context, success)
        if success:
            self._num_evictable_cache_blocks = counter


class EvictableCounterDecrementedOnSecondLoad(CPUOffloadingManager):
    """O8, vLLM PR #45757 hazard (its test's "no double decrement"): a second concurrent load of
    a block (``ref_cnt`` 1 -> 2) decrements the evictable counter again."""

    def prepare_load(self, keys: Collection[Key], req_context: object = None) -> CPULoadStoreSpec:
        keys = list(keys)
        result = super().prepare_load(keys, req_context)
        pins: dict[Key, int] = {}
        for key in keys:
            block = self._policy.get(key)
            assert block is not None
            pins[key] = pins.get(key, block.ref_cnt - keys.count(key))
            if pins[key] > 0:
                self._num_evictable_cache_blocks -= 1
            pins[key] += 1
        return result


class LRUMissingMarkEvictableAfterLastLoad(CPUOffloadingManager):
    """O9, vLLM PR #46216 hazard: ``mark_evictable`` is not called when the last load of a block
    completes — the block never becomes evictable again (missing from the LRU-v2 evictable list)."""

    def complete_load(self, keys: Collection[Key], req_context: object = None) -> None:
        with _forgetting(self._policy, "mark_evictable"):
            super().complete_load(keys, req_context)


class LRUMissingMarkNonEvictable(CPUOffloadingManager):
    """O9, vLLM PR #46216 hazard: ``mark_non_evictable`` is not called when a load starts — a block
    stays in the LRU-v2 evictable list while it is being read and can be evicted under the load."""

    def prepare_load(self, keys: Collection[Key], req_context: object = None) -> CPULoadStoreSpec:
        with _forgetting(self._policy, "mark_non_evictable"):
            return super().prepare_load(keys, req_context)


class LookupReportsPendingAsMiss(CPUOffloadingManager):
    """O10, vLLM PR #41795: a block whose store is in flight is reported as a miss (the request
    recomputes and re-stores instead of waiting): ``HIT_PENDING`` became ``MISS``."""

    def lookup(self, key: Key, req_context: object = None) -> LookupResult:
        result = super().lookup(key, req_context)
        return LookupResult.MISS if result is LookupResult.HIT_PENDING else result


class StoreThresholdOffByOne(CPUOffloadingManager):
    """Planted (issue 30), a bug only ``store_threshold >= 2`` shows: a key is stored after
    ``store_threshold - 1`` offers (the access tracker still counts). At the default threshold 1
    it is the impl itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.store_threshold >= 2:
            self.store_threshold -= 1


class _DecrementOnT2PickPolicy(_OnePassARC):
    decrement_on_t2_pick = True


ARC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "arc_touch_promotes_pending_block",
        "vLLM PR #34576 (O1: not-ready T1 entry in touch)",
        ARCTouchPromotesPendingBlock,
        "snapshot",
    ),
    Mutant(
        "arc_touch_keyerror_on_pending_block",
        "vLLM PR #34576, #27039 code (O1: KeyError in touch)",
        ARCTouchKeyErrorOnPendingBlock,
        "no_live_eviction",
    ),
    Mutant(
        "store_protects_nothing",
        "vLLM PR #35846 (O2: protected = set())",
        StoreProtectsNothing,
        "no_live_eviction",
    ),
    Mutant(
        "arc_eviction_not_atomic",
        "vLLM #27039 code, fixed by #37874 (O3)",
        ARCEvictionNotAtomic,
        "atomic_failure",
    ),
    Mutant(
        "failed_store_drops_ready_keys",
        "vLLM #27039 code, fixed by #37874 (O4)",
        FailedStoreDropsReadyKeys,
        "no_live_eviction",
    ),
    Mutant(
        "arc_iterator_restarted_after_t2_pick",
        "vLLM PR #50992 hazard (O5: restarted iterator)",
        ARCIteratorRestartedAfterT2Pick,
        "atomic_failure",
    ),
    Mutant(
        "arc_stop_iteration_on_exhausted_list",
        "vLLM PR #50992 hazard (O5: StopIteration)",
        ARCStopIterationOnExhaustedList,
        "exception",
    ),
    Mutant(
        "arc_missing_t1_fallback",
        "vLLM PR #55461 (O6: no T1 fallback)",
        ARCMissingT1Fallback,
        "return_value",
        variant="t1_fallback",
    ),
    Mutant(
        "arc_fallback_restarts_t1_iterator",
        "vLLM PR #55461 (O5/O6: fallback rescans T1)",
        ARCFallbackRestartsT1Iterator,
        "atomic_failure",
        variant="t1_fallback",
    ),
    Mutant(
        "evictable_counter_decremented_on_second_load",
        "vLLM PR #45757 (O8: double decrement)",
        EvictableCounterDecrementedOnSecondLoad,
        "evictable_counter_matches_scan",
    ),
)

LRU_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "store_protects_only_new_keys",
        "vLLM PR #35846 (O2: protected = set(keys_to_store))",
        StoreProtectsOnlyNewKeys,
        "no_live_eviction",
    ),
    Mutant(
        "evictable_counter_not_incremented_on_store",
        "vLLM PR #45757 (O8: missing increment)",
        EvictableCounterNotIncrementedOnStore,
        "evictable_counter_matches_scan",
    ),
    Mutant(
        "lru_missing_mark_evictable_after_last_load",
        "vLLM PR #46216 (O9: missing mark_evictable)",
        LRUMissingMarkEvictableAfterLastLoad,
        "lru_order_consistent",
        variant="v2",
    ),
    Mutant(
        "lru_missing_mark_non_evictable",
        "vLLM PR #46216 (O9: missing mark_non_evictable)",
        LRUMissingMarkNonEvictable,
        "lru_order_consistent",
        variant="v2",
    ),
    Mutant(
        "lookup_reports_pending_as_miss",
        "vLLM PR #41795 (O10: pending reported as miss)",
        LookupReportsPendingAsMiss,
        "return_value",
    ),
    Mutant(
        "store_threshold_off_by_one",
        "planted (issue 30): store_threshold >= 2",
        StoreThresholdOffByOne,
        "return_value",
    ),
)


class ARCVirtualSizeDecrementedOnT2Pick(_ManagerWithPolicy):
    """O5, vLLM PR #50992 "hazard": the virtual T1 size also drops on T2 picks. EQUIVALENT, not a
    bug: once a victim comes from T2, either the virtual size is already below ``int(target)`` (and
    only falls further) or T1's iterator is exhausted (and stays exhausted), so no selection
    changes (docs/vllm.md §2.3; a 200,000-state comparison found no difference). Kept out of
    the catalogue: no checker can or should kill it."""

    arc_cls = _DecrementOnT2PickPolicy


ARC_EQUIVALENT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "arc_virtual_size_decremented_on_t2_pick",
        "vLLM PR #50992 hazard (O5), proved equivalent",
        ARCVirtualSizeDecrementedOnT2Pick,
        "none (equivalent)",
    ),
)
"""Planted changes that are provably not bugs: the checkers must let them pass."""
