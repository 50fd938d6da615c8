"""The bug-injection catalogue: realistic bugs planted in the production implementations.

Each mutant is a small subclass of an impl class — never an edit of the impl source — whose
docstring names its origin (an upstream PR or issue from shared/reference/, or the hazard a seed PR
states). Every checker must kill every mutant that applies to it; ``kvspec check --target
mutant:NAME`` runs one. This is the one list: later components add their mutants here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from impl.infinilm.block_manager import BlockManager
from impl.infinilm.scheduler import Scheduler
from impl.vllm.arc import ARCCachePolicy
from impl.vllm.lru import LRUCachePolicy
from impl.vllm.offload_manager import CPULoadStoreSpec, CPUOffloadingManager, LookupResult
from spec.infinilm.block_manager import ceil_div
from spec.infinilm.request import InferenceRequest
from spec.infinilm.scheduler import (
    RequestQueue,
    SchedulerOutput,
    exact_blocks,
    legacy_running_blocks,
    remote_reservation,
)
from spec.vllm import BlockStatus, Key


@dataclass(frozen=True)
class Mutant:
    name: str
    component: str
    origin: str
    cls: type
    expected_check: str  # the check that should name the failure (documentation, not enforced)
    # the variant a mutant lives in: a scheduler reservation (legacy/exact/tight), an ARC variant
    # (no_fallback/t1_fallback) or an LRU variant (v1/v2); None: every variant
    variant: str | None = None
    connector: bool | None = None  # a scheduler mutant on the PD path needs a connector


class CounterNotDecrementedInTruncate(BlockManager):
    """PR #576 hazard: every 1->0 transition must decrement ``num_referenced``; truncation forgets."""

    def truncate_blocks(self, block_table: Sequence[int], keep_num_tokens: int) -> list[int]:
        before = self.num_referenced
        result = super().truncate_blocks(block_table, keep_num_tokens)
        self.num_referenced = before
        return result


class CounterDecrementedOnEviction(BlockManager):
    """PR #576 hazard: eviction touches only ref-0 pages, so the counter must not move there."""

    def _deallocate_block(self, block_id: int) -> None:
        super()._deallocate_block(block_id)
        self.num_referenced -= 1


class PinDoesNotCountRevivedPage(BlockManager):
    """PR #576 hazard: a prefix hit on a cached ref-0 page is a 0->1 transition the counter misses."""

    def get_computed_blocks(
        self, block_hashes: Sequence[bytes], max_cache_hit_tokens: int
    ) -> tuple[list[int], int]:
        before = self.num_referenced
        table, hit = super().get_computed_blocks(block_hashes, max_cache_hit_tokens)
        self.num_referenced = before
        return table, hit


class ReclaimEvictsReferencedPage(BlockManager):
    """#578 hazard: a candidate filter that also takes pages held once (``ref_count <= 1``)."""

    def try_free_blocks(self, num_required: int) -> bool:
        victims = [i for i in self.used_block_ids if self.blocks[i].ref_count <= 1]
        for block_id in victims[: max(num_required - len(self.free_block_ids), 1)]:
            if self.blocks[block_id].ref_count:
                self.blocks[block_id].ref_count = 0
                self.num_referenced -= 1
            self._deallocate_block(block_id)
        return len(self.free_block_ids) >= num_required


class ReclaimWithoutEvictOne(BlockManager):
    """PR #578 hazard: ``limit = required - free`` without the ``max(.., 1)`` loses quirk A."""

    def try_free_blocks(self, num_required: int) -> bool:
        if num_required < 0:
            return super().try_free_blocks(num_required)
        if len(self.free_block_ids) >= num_required:
            return True
        return super().try_free_blocks(num_required)


class ReclaimInIdOrder(BlockManager):
    """A plausible "deterministic" rewrite: evict in ascending id order instead of set order (§9.3)."""

    def try_free_blocks(self, num_required: int) -> bool:
        if num_required < 0:
            return super().try_free_blocks(num_required)
        candidates = sorted(i for i in self.used_block_ids if self.blocks[i].ref_count == 0)
        for block_id in candidates:
            self._deallocate_block(block_id)
            if len(self.free_block_ids) >= num_required:
                return True
        return len(self.free_block_ids) >= num_required


class LifoFreeList(BlockManager):
    """Free list reused LIFO (the vLLM CPU block pool's order) instead of InfiniLM's FIFO deque."""

    def _deallocate_block(self, block_id: int) -> None:
        super()._deallocate_block(block_id)
        self.free_block_ids.appendleft(self.free_block_ids.pop())


class HashIndexNotCleanedOnEviction(BlockManager):
    """Eviction clears the page's hash but leaves it in ``hash_to_block_ids`` (stale prefix hits)."""

    def _deallocate_block(self, block_id: int) -> None:
        self.blocks[block_id].hash = b""
        super()._deallocate_block(block_id)


class LookupIgnoresHitCap(BlockManager):
    """Lookup ignoring ``max_cache_hit_tokens``: a block-aligned prompt would not recompute its last
    block (reference §3.1 / §9.7, the P-1 cap)."""

    def get_computed_blocks(
        self, block_hashes: Sequence[bytes], max_cache_hit_tokens: int
    ) -> tuple[list[int], int]:
        return super().get_computed_blocks(block_hashes, len(block_hashes) * self.block_size)


class ReleaseReturnsPagesToFreeList(BlockManager):
    """Release that frees a page at ref 0 at once, losing the cached prefix (reference §3.7)."""

    def free_blocks(self, block_table: Sequence[int]) -> None:
        super().free_blocks(block_table)
        for block_id in reversed(block_table):
            if block_id in self.used_block_ids and self.blocks[block_id].ref_count == 0:
                self._deallocate_block(block_id)


class PublishDeduplicates(BlockManager):
    """Publishing skips pages whose hash is already indexed — the duplicate-hash dedup that vLLM
    #21357's inverted check shows is easy to get wrong; InfiniLM never dedups (reference §3.6)."""

    def publish_computed_blocks(
        self,
        block_table: Sequence[int],
        block_hashes: Sequence[bytes],
        start_block: int,
        num_computed_tokens: int,
    ) -> int:
        end = min(num_computed_tokens // self.block_size, len(block_table), len(block_hashes))
        keep = [
            i
            for i in range(max(start_block, 0), end)
            if block_hashes[i] not in self.hash_to_block_ids
        ]
        if len(keep) == end - start_block:
            return super().publish_computed_blocks(
                block_table, block_hashes, start_block, num_computed_tokens
            )
        return end


class TruncateNotValidatedFirst(BlockManager):
    """Truncation that frees discarded pages while it validates them (upstream's docstring warns
    that a bad id would crash half-way): a rejected rollback leaves a partial mutation."""

    def truncate_blocks(self, block_table: Sequence[int], keep_num_tokens: int) -> list[int]:
        size = self.block_size
        if keep_num_tokens <= 0 or keep_num_tokens > len(block_table) * size:
            return super().truncate_blocks(block_table, keep_num_tokens)
        keep_blocks = -(-keep_num_tokens // size)
        for block_id in block_table[keep_blocks:]:
            self._check_exclusive(block_id, "discarded")
            self.blocks[block_id].ref_count = 0
            self.num_referenced -= 1
            self._deallocate_block(block_id)
        if keep_num_tokens % size:
            self._check_exclusive(block_table[keep_blocks - 1], "retained")
        return list(block_table[:keep_blocks])


# ============================================================================ scheduler mutants
class RunningReservationReusedAcrossSteps(Scheduler):
    """PR #579 hazard: the per-step running reservation must be recomputed on the next step; a
    value cached on the scheduler goes stale as requests generate and finish."""

    _cached: int | None = None

    def _running_required_blocks(self) -> int:
        if self._cached is None:
            self._cached = super()._running_required_blocks()
        return self._cached


class CounterNotDecrementedOnDequeue(Scheduler):
    """Exact-reservation PR hazard: the decode loop must take a dequeued request's reservation
    out of ``num_reserved_decode_blocks`` (before its is_finished check)."""

    def _unreserve(self, req: InferenceRequest) -> None:
        return None


class LegacyFormulaInExactMode(Scheduler):
    """The exact PR's counter fed with the legacy ``ceil((M - g) / B)`` formula."""

    def _reserve(self, req: InferenceRequest) -> None:
        self._num_reserved += legacy_running_blocks(req, self.block_size)

    def _unreserve(self, req: InferenceRequest) -> None:
        self._num_reserved -= legacy_running_blocks(req, self.block_size)


class TightCounterUsesExactFormula(Scheduler):
    """kvspec's tight variant computed with the exact PR's P+M (one page too many at boundaries)."""

    def _reserve(self, req: InferenceRequest) -> None:
        self._num_reserved += exact_blocks(req, self.block_size)

    def _unreserve(self, req: InferenceRequest) -> None:
        self._num_reserved -= exact_blocks(req, self.block_size)


class PendingRemoteNotReleasedOnFailure(Scheduler):
    """A failed remote receive must release its pending decode reservation (reference §5.6);
    forgetting it leaks ``pending_kv_decode_blocks`` and starves admission."""

    def update_waiting_for_remote_kv(self, req: InferenceRequest) -> None:
        failed = req.request_id in self.failed_receiving_kv_req_ids
        super().update_waiting_for_remote_kv(req)
        if failed:
            self.pending_kv_decode_blocks += remote_reservation(
                self.reservation, req, self.block_size
            )


class CandidatePinnedPagesCountedAsUsable(Scheduler):
    """Admission must read the usable count after the candidate's prefix pages are pinned
    (reference §5.4); counting the pinned pages as still usable over-admits."""

    def can_accept_request(
        self,
        req: InferenceRequest,
        num_local_computed_tokens: int,
        current_prefill_extra_blocks: int = 0,
        *,
        running_required_blocks: int | None = None,
    ) -> bool:
        if num_local_computed_tokens == 0:
            return super().can_accept_request(
                req,
                0,
                current_prefill_extra_blocks,
                running_required_blocks=running_required_blocks,
            )
        running = (
            self.num_reserved_decode_blocks
            if running_required_blocks is None or self._incremental
            else running_required_blocks
        )
        own = ceil_div(
            req.prompt_length - num_local_computed_tokens + req.sampling_params.max_tokens,
            self.block_size,
        )
        usable = (
            self.cache_manager.get_total_usable_blocks()
            + num_local_computed_tokens // self.block_size
        )
        need = running + own + self.pending_kv_decode_blocks + current_prefill_extra_blocks
        return need <= usable


class _FrontRequeueQueue(RequestQueue):
    def __init__(self) -> None:
        super().__init__()
        self.last_popped: InferenceRequest | None = None

    def get_nowait(self) -> InferenceRequest | None:
        self.last_popped = super().get_nowait()
        return self.last_popped

    def put(self, item: InferenceRequest) -> None:
        if item is self.last_popped:
            self._items.appendleft(item)
            self.last_popped = None
        else:
            super().put(item)


class DeferredHeadRequeuedAtFront(Scheduler):
    """A FIFO-preserving "fix" of quirk §9.5: the deferred head goes back to the *front*."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.waiting_queue = _FrontRequeueQueue()


class DecodeMixedIntoPrefillStep(Scheduler):
    """Quirk §9.6 lost: a running request is decoded in the same step as a prefill."""

    def schedule(self) -> SchedulerOutput | None:
        out = super().schedule()
        if out is not None and out.is_prefill and len(out.scheduled_requests) < self.max_batch_size:
            req = self.running_queue.get_nowait()
            if req is not None:
                if self._incremental:
                    self._unreserve(req)
                if req.is_finished():
                    self.complete_requests([req])
                else:
                    req.block_table, slot = self.cache_manager.append_slot(
                        req.block_table, req.get_total_length()
                    )
                    req.slot_mapping = [slot]
                    out.scheduled_requests.append(req)
        return out


class PromotionContinuesPastFullBatch(Scheduler):
    """Quirk §9.9 lost: remote promotion ``continue``s past a full batch instead of ``break``."""

    def _promote_remote(self, batch: list[InferenceRequest]) -> None:
        from spec.infinilm.request import RequestStatus

        for request_id in list(self.remote_kv_requests):
            req = self.remote_kv_requests[request_id]
            if req.is_finished():
                self.complete_requests((req,))
            elif request_id in self.failed_receiving_kv_req_ids:
                self.update_waiting_for_remote_kv(req)
                req.status = RequestStatus.WAITING
                self.waiting_queue.put(req)
            elif (
                request_id in self.finished_receiving_kv_req_ids
                and len(batch) < self.max_batch_size
            ):
                self.update_waiting_for_remote_kv(req)
                req.status = RequestStatus.RUNNING
                batch.append(req)


# ----------------------------------------------------------------------------- vLLM CPU offload
# Origins O1-O10: shared/reference/vllm.md §7.1 (and §2.3, §2.6, §1.2).


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


class _DecrementOnT2PickPolicy(_OnePassARC):
    decrement_on_t2_pick = True


BM = "infinilm-block-manager"
SCHED = "infinilm-scheduler"
ARC = "vllm-arc"
LRU = "vllm-lru"
CATALOGUE: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "counter_not_decremented_in_truncate",
            BM,
            "InfiniLM PR #576 (counter updates)",
            CounterNotDecrementedInTruncate,
            "referenced_count_matches_live_pages",
        ),
        Mutant(
            "counter_decremented_on_eviction",
            BM,
            "InfiniLM PR #576 (no change on eviction)",
            CounterDecrementedOnEviction,
            "referenced_count_matches_live_pages",
        ),
        Mutant(
            "pin_does_not_count_revived_page",
            BM,
            "InfiniLM PR #576 (0->1 on prefix hit)",
            PinDoesNotCountRevivedPage,
            "referenced_count_matches_live_pages",
        ),
        Mutant(
            "reclaim_evicts_referenced_page",
            BM,
            "InfiniLM PR #578 (candidate filter)",
            ReclaimEvictsReferencedPage,
            "no_live_eviction",
        ),
        Mutant(
            "reclaim_without_evict_one",
            BM,
            "InfiniLM PR #578 (limit >= 1 keeps quirk A)",
            ReclaimWithoutEvictOne,
            "identical_eviction_order",
        ),
        Mutant(
            "reclaim_in_id_order",
            BM,
            "InfiniLM reference §9.3 (set-iteration order)",
            ReclaimInIdOrder,
            "identical_eviction_order",
        ),
        Mutant(
            "lifo_free_list",
            BM,
            "InfiniLM reference §1.2 (FIFO free deque)",
            LifoFreeList,
            "identical_eviction_order",
        ),
        Mutant(
            "hash_index_not_cleaned_on_eviction",
            BM,
            "InfiniLM reference §3.0 _remove_block_hash",
            HashIndexNotCleanedOnEviction,
            "prefix_index_consistent",
        ),
        Mutant(
            "lookup_ignores_hit_cap",
            BM,
            "InfiniLM reference §3.1/§9.7 (P-1 hit cap)",
            LookupIgnoresHitCap,
            "return_value",
        ),
        Mutant(
            "release_returns_pages_to_free_list",
            BM,
            "InfiniLM reference §3.7 (release keeps cache)",
            ReleaseReturnsPagesToFreeList,
            "identical_eviction_order",
        ),
        Mutant(
            "publish_deduplicates",
            BM,
            "vLLM #21357 / InfiniLM reference §3.6 (no dedup)",
            PublishDeduplicates,
            "prefix_index_consistent",
        ),
        Mutant(
            "truncate_not_validated_first",
            BM,
            "InfiniLM reference §3.5 (validate all first)",
            TruncateNotValidatedFirst,
            "atomic_failure",
        ),
        Mutant(
            "running_reservation_reused_across_steps",
            SCHED,
            "InfiniLM PR #579 (per-step value recomputed next step)",
            RunningReservationReusedAcrossSteps,
            "snapshot",
            "legacy",
        ),
        Mutant(
            "counter_not_decremented_on_dequeue",
            SCHED,
            "exact-reservation PR (decrement at decode dequeue)",
            CounterNotDecrementedOnDequeue,
            "reservation_counter_matches_scan",
            "exact",
        ),
        Mutant(
            "legacy_formula_in_exact_mode",
            SCHED,
            "exact-reservation PR (R_exact formula)",
            LegacyFormulaInExactMode,
            "reservation_counter_matches_scan",
            "exact",
        ),
        Mutant(
            "tight_counter_uses_exact_formula",
            SCHED,
            "kvspec tight variant (reference §7.1)",
            TightCounterUsesExactFormula,
            "reservation_counter_matches_scan",
            "tight",
        ),
        Mutant(
            "pending_remote_not_released_on_failure",
            SCHED,
            "InfiniLM reference §5.6 (update_waiting_for_remote_kv)",
            PendingRemoteNotReleasedOnFailure,
            "pending_counter_matches_scan",
            None,
            True,
        ),
        Mutant(
            "candidate_pinned_pages_counted_as_usable",
            SCHED,
            "InfiniLM reference §5.4 (usable read after pinning)",
            CandidatePinnedPagesCountedAsUsable,
            "return_value",
            None,
        ),
        Mutant(
            "deferred_head_requeued_at_front",
            SCHED,
            "InfiniLM reference §9.5 (head to tail)",
            DeferredHeadRequeuedAtFront,
            "snapshot",
            None,
        ),
        Mutant(
            "decode_mixed_into_prefill_step",
            SCHED,
            "InfiniLM reference §9.6 (prefill priority)",
            DecodeMixedIntoPrefillStep,
            "return_value",
            None,
        ),
        Mutant(
            "promotion_continues_past_full_batch",
            SCHED,
            "InfiniLM reference §9.9 (promotion break)",
            PromotionContinuesPastFullBatch,
            "snapshot",
            None,
            True,
        ),
        Mutant(
            "arc_touch_promotes_pending_block",
            ARC,
            "vLLM PR #34576 (O1: not-ready T1 entry in touch)",
            ARCTouchPromotesPendingBlock,
            "snapshot",
        ),
        Mutant(
            "arc_touch_keyerror_on_pending_block",
            ARC,
            "vLLM PR #34576, #27039 code (O1: KeyError in touch)",
            ARCTouchKeyErrorOnPendingBlock,
            "no_live_eviction",
        ),
        Mutant(
            "store_protects_nothing",
            ARC,
            "vLLM PR #35846 (O2: protected = set())",
            StoreProtectsNothing,
            "no_live_eviction",
        ),
        Mutant(
            "store_protects_only_new_keys",
            LRU,
            "vLLM PR #35846 (O2: protected = set(keys_to_store))",
            StoreProtectsOnlyNewKeys,
            "no_live_eviction",
        ),
        Mutant(
            "arc_eviction_not_atomic",
            ARC,
            "vLLM #27039 code, fixed by #37874 (O3)",
            ARCEvictionNotAtomic,
            "atomic_failure",
        ),
        Mutant(
            "failed_store_drops_ready_keys",
            ARC,
            "vLLM #27039 code, fixed by #37874 (O4)",
            FailedStoreDropsReadyKeys,
            "no_live_eviction",
        ),
        Mutant(
            "arc_iterator_restarted_after_t2_pick",
            ARC,
            "vLLM PR #50992 hazard (O5: restarted iterator)",
            ARCIteratorRestartedAfterT2Pick,
            "atomic_failure",
        ),
        Mutant(
            "arc_stop_iteration_on_exhausted_list",
            ARC,
            "vLLM PR #50992 hazard (O5: StopIteration)",
            ARCStopIterationOnExhaustedList,
            "exception",
        ),
        Mutant(
            "arc_missing_t1_fallback",
            ARC,
            "vLLM PR #55461 (O6: no T1 fallback)",
            ARCMissingT1Fallback,
            "return_value",
            "t1_fallback",
        ),
        Mutant(
            "arc_fallback_restarts_t1_iterator",
            ARC,
            "vLLM PR #55461 (O5/O6: fallback rescans T1)",
            ARCFallbackRestartsT1Iterator,
            "atomic_failure",
            "t1_fallback",
        ),
        Mutant(
            "evictable_counter_not_incremented_on_store",
            LRU,
            "vLLM PR #45757 (O8: missing increment)",
            EvictableCounterNotIncrementedOnStore,
            "evictable_counter_matches_scan",
        ),
        Mutant(
            "evictable_counter_decremented_on_second_load",
            ARC,
            "vLLM PR #45757 (O8: double decrement)",
            EvictableCounterDecrementedOnSecondLoad,
            "evictable_counter_matches_scan",
        ),
        Mutant(
            "lru_missing_mark_evictable_after_last_load",
            LRU,
            "vLLM PR #46216 (O9: missing mark_evictable)",
            LRUMissingMarkEvictableAfterLastLoad,
            "lru_order_consistent",
            "v2",
        ),
        Mutant(
            "lru_missing_mark_non_evictable",
            LRU,
            "vLLM PR #46216 (O9: missing mark_non_evictable)",
            LRUMissingMarkNonEvictable,
            "lru_order_consistent",
            "v2",
        ),
        Mutant(
            "lookup_reports_pending_as_miss",
            LRU,
            "vLLM PR #41795 (O10: pending reported as miss)",
            LookupReportsPendingAsMiss,
            "return_value",
        ),
    )
}


class ARCVirtualSizeDecrementedOnT2Pick(_ManagerWithPolicy):
    """O5, vLLM PR #50992 "hazard": the virtual T1 size also drops on T2 picks. EQUIVALENT, not a
    bug: once a victim comes from T2, either the virtual size is already below ``int(target)`` (and
    only falls further) or T1's iterator is exhausted (and stays exhausted), so no selection
    changes (vllm.md §2.3; a 200,000-state comparison found no difference). Kept out of
    :data:`CATALOGUE`: no checker can or should kill it."""

    arc_cls = _DecrementOnT2PickPolicy


EQUIVALENT_MUTANTS: dict[str, Mutant] = {
    "arc_virtual_size_decremented_on_t2_pick": Mutant(
        "arc_virtual_size_decremented_on_t2_pick",
        ARC,
        "vLLM PR #50992 hazard (O5), proved equivalent",
        ARCVirtualSizeDecrementedOnT2Pick,
        "none (equivalent)",
    )
}
"""Planted changes that are provably not bugs: the checkers must let them pass."""
