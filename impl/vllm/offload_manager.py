"""Production CPU offload manager: the spec's API and observables, with the #45757 counter.

Differences from :mod:`spec.vllm.offload_manager`, each observably neutral:

* ``_num_evictable_cache_blocks`` is a counter kept in step with every ``ref_cnt`` transition to or
  from 0 (store completion +1, first load -1, last load completion +1, eviction -len, reset 0)
  instead of a scan; the #45757 guard reads it in O(1). It must always equal the number of idle
  blocks (invariant ``evictable_counter_matches_scan``); a drift would turn into false ``None``.
* the policies are :mod:`impl.vllm.arc` (one-pass batch eviction, #50992) and
  :mod:`impl.vllm.lru` (v2: an ordered evictable set, #46216).

Validation (order and exception kinds) is the spec's, so bad input raises the same exception.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator

from impl.vllm.arc import ARCCachePolicy
from impl.vllm.lru import LRUCachePolicy
from spec.errors import DoubleFreeError, InvalidArgument, OffloadStateError
from spec.vllm import BlockStatus, Key
from spec.vllm.lru import LRUVariant
from spec.vllm.offload_manager import (
    CachePolicyName,
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadManagerSnapshot,
    PrepareStoreOutput,
    check_constructor,
    check_release_features,
    filter_metadata_only,
    make_policy,
    read_offload_manager,
)
from spec.vllm.releases import ThresholdCounting, ThresholdScope, record_offers, select_store_keys

__all__ = [
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "LookupResult",
    "OffloadManagerSnapshot",
    "OffloadingEvent",
    "PrepareStoreOutput",
]

_EMPTY_SPEC = CPULoadStoreSpec(())


class CPUOffloadingManager:
    """Drop-in replacement for :class:`spec.vllm.offload_manager.CPUOffloadingManager`."""

    def __init__(
        self,
        num_blocks: int,
        cache_policy: CachePolicyName = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        *,
        arc_t1_fallback: bool = False,
        lru: LRUVariant = "v2",
        threshold_counting: ThresholdCounting = "lookup",
        threshold_scope: ThresholdScope = "all_inputs",
        arc_store_miss: bool = False,
        failed_store_event: bool = False,
    ) -> None:
        check_constructor(num_blocks, store_threshold, max_tracker_size, arc_t1_fallback)
        check_release_features(
            threshold_counting, threshold_scope, arc_store_miss, failed_store_event
        )
        self.threshold_counting = threshold_counting
        self.threshold_scope = threshold_scope
        self.arc_store_miss = arc_store_miss and cache_policy == "arc"
        self.failed_store_event = failed_store_event
        self.medium = CPULoadStoreSpec.medium()
        self._num_blocks = num_blocks
        self._num_allocated_blocks = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._policy = make_policy(
            cache_policy,
            num_blocks,
            arc_t1_fallback=arc_t1_fallback,
            lru=lru,
            arc_cls=ARCCachePolicy,
            lru_cls=LRUCachePolicy,
        )
        # #45757: cached blocks with ref_cnt == 0 (relies on evictable_counter_matches_scan).
        self._num_evictable_cache_blocks = 0
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.stores_skipped_in_current_batch = 0
        self.counts: OrderedDict[Key, int] | None = OrderedDict() if store_threshold >= 2 else None

    def snapshot(self) -> OffloadManagerSnapshot:
        return read_offload_manager(self)

    def _get_num_free_blocks(self) -> int:
        return self._num_blocks - self._num_allocated_blocks + len(self._free_list)

    def lookup(self, key: Key, req_context: object = None) -> LookupResult:
        counts = self.counts
        if counts is not None and self.threshold_counting == "lookup":
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
            else:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[key] = 1
        block = self._policy.get(key)
        if block is None:
            return LookupResult.MISS
        return LookupResult.HIT if block.is_ready else LookupResult.HIT_PENDING

    def touch(self, keys: Collection[Key], req_context: object = None) -> None:
        self._policy.touch(keys, req_context)

    def prepare_load(self, keys: Collection[Key], req_context: object = None) -> CPULoadStoreSpec:
        keys = list(keys)
        get = self._policy.get
        blocks: list[BlockStatus] = []
        for key in keys:  # validate every key before pinning any (as the spec)
            block = get(key)
            if block is None:
                raise OffloadStateError(f"Block {key!r} not found in cache")
            if block.ref_cnt < 0:
                raise OffloadStateError(f"Block {key!r} is not ready for reading")
            blocks.append(block)
        policy = self._policy
        for key, block in zip(keys, blocks, strict=True):
            if block.ref_cnt == 0:
                policy.mark_non_evictable(key)
                self._num_evictable_cache_blocks -= 1  # 0 -> 1: no longer idle
            block.ref_cnt += 1
        return CPULoadStoreSpec(tuple(b.block_id for b in blocks))

    def complete_load(self, keys: Collection[Key], req_context: object = None) -> None:
        keys = list(keys)
        times = Counter(keys)
        get = self._policy.get
        blocks: list[BlockStatus] = []
        for key in keys:
            block = get(key)
            if block is None:
                raise OffloadStateError(f"Block {key!r} not found")
            if block.ref_cnt < 0:
                raise OffloadStateError(f"Block {key!r} is being stored, not loaded")
            if block.ref_cnt < times[key]:
                raise DoubleFreeError(
                    f"Block {key!r} ref_cnt is already 0 (ref_cnt={block.ref_cnt}, "
                    f"completed {times[key]} time(s))"
                )
            blocks.append(block)
        policy = self._policy
        for key, block in zip(keys, blocks, strict=True):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._num_evictable_cache_blocks += 1  # 1 -> 0: idle again
                policy.mark_evictable(key)

    def prepare_store(
        self, keys: Collection[Key], req_context: object = None
    ) -> PrepareStoreOutput | None:
        keys = list(keys)
        if len(set(keys)) != len(keys):
            dupes = [k for k, n in Counter(keys).items() if n > 1]
            raise InvalidArgument(f"prepare_store keys must be distinct; repeated: {dupes!r}")
        counts = self.counts
        policy = self._policy
        get = policy.get
        if counts is None and self.threshold_scope == "all_inputs":  # the common case, inline
            keys_to_store = [k for k in keys if get(k) is None]
            protected = set(keys)
        else:
            if counts is not None and self.threshold_counting != "lookup":
                record_offers(counts, keys, self.max_tracker_size, self.threshold_counting)
            keys_to_store, protected, skipped = select_store_keys(
                keys,
                counts,
                self.store_threshold,
                lambda k: get(k) is not None,
                self.threshold_scope,
            )
            self.stores_skipped_in_current_batch += skipped
        if self.arc_store_miss:
            policy.on_store_miss(keys_to_store)
        if not keys_to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=_EMPTY_SPEC, evicted_keys=[])
        num_new = len(keys_to_store)
        need = num_new - self._get_num_free_blocks()
        evicted_keys: list[Key] = []
        free_list = self._free_list
        if need > 0:
            # #45757: O(1) fast fail; exact because of evictable_counter_matches_scan.
            if need > self._num_evictable_cache_blocks:
                return None
            evicted = policy.evict(need, protected)  # #35846: the input keys are protected
            if evicted is None:
                return None
            self._num_evictable_cache_blocks -= len(evicted)  # policies evict idle blocks only
            for key, block in evicted:
                free_list.append(block.block_id)
                evicted_keys.append(key)
            if self.events is not None:
                self.events.append(
                    OffloadingEvent(keys=evicted_keys, medium=self.medium, removed=True)
                )
        # Fresh ids ascending, then the free list as a stack (last freed, first reused).
        start = self._num_allocated_blocks
        fresh = min(num_new, self._num_blocks - start)
        self._num_allocated_blocks = start + fresh
        block_ids = list(range(start, start + fresh))
        for _ in range(num_new - fresh):
            block_ids.append(free_list.pop())
        insert = policy.insert
        for key, block_id in zip(keys_to_store, block_ids, strict=True):
            insert(key, BlockStatus(block_id))
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=CPULoadStoreSpec(tuple(block_ids)),
            evicted_keys=evicted_keys,
        )

    def complete_store(
        self, keys: Collection[Key], req_context: object = None, success: bool = True
    ) -> None:
        policy = self._policy
        get = policy.get
        stored: list[Key] = []
        dropped: list[Key] = []
        for key in keys:
            block = get(key)
            if block is None or block.ref_cnt >= 0:
                continue  # unknown or already ready: skipped, as upstream
            if success:
                block.ref_cnt = 0
                self._num_evictable_cache_blocks += 1  # -1 -> 0: idle
                policy.mark_evictable(key)
                stored.append(key)
            else:
                policy.remove(key)  # a pending block was never counted as evictable
                self._free_list.append(block.block_id)
                dropped.append(key)
        if stored and self.events is not None:
            self.events.append(OffloadingEvent(keys=stored, medium=self.medium, removed=False))
        if dropped and self.failed_store_event and self.events is not None:
            self.events.append(
                OffloadingEvent(keys=dropped, medium=self.medium, removed=True, metadata_only=True)
            )

    def reset_cache(self) -> None:
        self._policy.clear()
        self._num_evictable_cache_blocks = 0
        self._free_list.clear()
        self._num_allocated_blocks = 0

    def take_events(self) -> Iterator[OffloadingEvent]:
        if self.events is not None:
            get = self._policy.get
            for event in self.events:
                yield from filter_metadata_only(event, lambda k: get(k) is not None)
            self.events.clear()
