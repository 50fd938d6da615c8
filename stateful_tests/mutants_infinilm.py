"""Planted bugs in the InfiniLM block manager and scheduler impls (the bug-injection catalogue).

Each mutant is a small subclass of an impl class, never an edit of the impl source; where the impl
inlines the helper a bug lives in, the subclass carries the impl method's own source with one
substitution (:func:`stateful_tests.planting.method_with`). Its docstring names its origin (an
upstream PR or issue from docs/infinilm.md, or the hazard a seed PR states). The registry
(``kvspec.components``) attaches :data:`BLOCK_MANAGER_MUTANTS` and :data:`SCHEDULER_MUTANTS` to
their components; every checker must kill every mutant that applies to it, and ``kvspec check
COMPONENT --target mutant:NAME`` runs one.
"""

from __future__ import annotations

from collections.abc import Sequence

from impl.infinilm.block_manager import BlockManager
from impl.infinilm.scheduler import Scheduler
from spec.infinilm.block_manager import ceil_div
from spec.infinilm.request import InferenceRequest
from spec.infinilm.scheduler import (
    RequestQueue,
    SchedulerOutput,
    exact_blocks,
    legacy_running_blocks,
    remote_reservation,
)
from stateful_tests.checker import Mutant
from stateful_tests.planting import method_with


class CounterNotDecrementedInTruncate(BlockManager):
    """PR #576 hazard: every 1->0 transition must decrement ``num_referenced``; truncation forgets."""

    def truncate_blocks(self, block_table: Sequence[int], keep_num_tokens: int) -> list[int]:
        before = self.num_referenced
        result = super().truncate_blocks(block_table, keep_num_tokens)
        self.num_referenced = before
        return result


class CounterDecrementedOnEviction(BlockManager):
    """PR #576 hazard: eviction touches only ref-0 pages, so the counter must not move there (in
    the deallocation helper and in ``try_free_blocks``, which inlines its eviction)."""

    def _deallocate_block(self, block_id: int) -> None:
        super()._deallocate_block(block_id)
        self.num_referenced -= 1

    try_free_blocks = method_with(
        BlockManager.try_free_blocks,
        "used.remove(page)",
        "used.remove(page)\nself.num_referenced -= 1  # planted",
    )


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
    """Free list reused LIFO (the vLLM CPU block pool's order) instead of InfiniLM's FIFO deque
    (in the deallocation helper and in ``try_free_blocks``' inlined eviction)."""

    def _deallocate_block(self, block_id: int) -> None:
        super()._deallocate_block(block_id)
        self.free_block_ids.appendleft(self.free_block_ids.pop())

    try_free_blocks = method_with(
        BlockManager.try_free_blocks, "free.append(page)", "free.appendleft(page)  # planted"
    )


class HashIndexNotCleanedOnEviction(BlockManager):
    """Eviction clears the page's hash but leaves it in ``hash_to_block_ids`` (stale prefix hits):
    in the helper that truncation uses and in ``try_free_blocks``, which inlines its eviction."""

    def _deallocate_block(self, block_id: int) -> None:
        self.blocks[block_id].hash = b""
        super()._deallocate_block(block_id)

    try_free_blocks = method_with(
        BlockManager.try_free_blocks, "ids.remove(page)", "pass  # planted: the index keeps it"
    )


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


BLOCK_MANAGER_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "counter_not_decremented_in_truncate",
        "InfiniLM PR #576 (counter updates)",
        CounterNotDecrementedInTruncate,
        "referenced_count_matches_live_pages",
    ),
    Mutant(
        "counter_decremented_on_eviction",
        "InfiniLM PR #576 (no change on eviction)",
        CounterDecrementedOnEviction,
        "referenced_count_matches_live_pages",
    ),
    Mutant(
        "pin_does_not_count_revived_page",
        "InfiniLM PR #576 (0->1 on prefix hit)",
        PinDoesNotCountRevivedPage,
        "referenced_count_matches_live_pages",
    ),
    Mutant(
        "reclaim_evicts_referenced_page",
        "InfiniLM PR #578 (candidate filter)",
        ReclaimEvictsReferencedPage,
        "no_live_eviction",
    ),
    Mutant(
        "reclaim_without_evict_one",
        "InfiniLM PR #578 (limit >= 1 keeps quirk A)",
        ReclaimWithoutEvictOne,
        "identical_eviction_order",
    ),
    Mutant(
        "reclaim_in_id_order",
        "docs/infinilm.md §9.3 (set-iteration order)",
        ReclaimInIdOrder,
        "identical_eviction_order",
    ),
    Mutant(
        "lifo_free_list",
        "docs/infinilm.md §1.2 (FIFO free deque)",
        LifoFreeList,
        "identical_eviction_order",
    ),
    Mutant(
        "hash_index_not_cleaned_on_eviction",
        "docs/infinilm.md §3.0 _remove_block_hash",
        HashIndexNotCleanedOnEviction,
        "prefix_index_consistent",
    ),
    Mutant(
        "lookup_ignores_hit_cap",
        "docs/infinilm.md §3.1/§9.7 (P-1 hit cap)",
        LookupIgnoresHitCap,
        "return_value",
    ),
    Mutant(
        "release_returns_pages_to_free_list",
        "docs/infinilm.md §3.7 (release keeps cache)",
        ReleaseReturnsPagesToFreeList,
        "identical_eviction_order",
    ),
    Mutant(
        "publish_deduplicates",
        "vLLM #21357 / docs/infinilm.md §3.6 (no dedup)",
        PublishDeduplicates,
        "prefix_index_consistent",
    ),
    Mutant(
        "truncate_not_validated_first",
        "docs/infinilm.md §3.5 (validate all first)",
        TruncateNotValidatedFirst,
        "atomic_failure",
    ),
)

SCHEDULER_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "running_reservation_reused_across_steps",
        "InfiniLM PR #579 (per-step value recomputed next step)",
        RunningReservationReusedAcrossSteps,
        "snapshot",
        variant="legacy",
    ),
    Mutant(
        "counter_not_decremented_on_dequeue",
        "exact-reservation PR (decrement at decode dequeue)",
        CounterNotDecrementedOnDequeue,
        "reservation_counter_matches_scan",
        variant="exact",
    ),
    Mutant(
        "legacy_formula_in_exact_mode",
        "exact-reservation PR (R_exact formula)",
        LegacyFormulaInExactMode,
        "reservation_counter_matches_scan",
        variant="exact",
    ),
    Mutant(
        "tight_counter_uses_exact_formula",
        "kvspec tight variant (reference §7.1)",
        TightCounterUsesExactFormula,
        "reservation_counter_matches_scan",
        variant="tight",
    ),
    Mutant(
        "pending_remote_not_released_on_failure",
        "docs/infinilm.md §5.6 (update_waiting_for_remote_kv)",
        PendingRemoteNotReleasedOnFailure,
        "pending_counter_matches_scan",
        options={"connector": True},
    ),
    Mutant(
        "candidate_pinned_pages_counted_as_usable",
        "docs/infinilm.md §5.4 (usable read after pinning)",
        CandidatePinnedPagesCountedAsUsable,
        "return_value",
    ),
    Mutant(
        "deferred_head_requeued_at_front",
        "docs/infinilm.md §9.5 (head to tail)",
        DeferredHeadRequeuedAtFront,
        "snapshot",
    ),
    Mutant(
        "decode_mixed_into_prefill_step",
        "docs/infinilm.md §9.6 (prefill priority)",
        DecodeMixedIntoPrefillStep,
        "return_value",
    ),
    Mutant(
        "promotion_continues_past_full_batch",
        "docs/infinilm.md §9.9 (promotion break)",
        PromotionContinuesPastFullBatch,
        "snapshot",
        options={"connector": True},
    ),
)
