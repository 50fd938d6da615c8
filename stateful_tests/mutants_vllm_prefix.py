"""Planted bugs in the vLLM GPU prefix-cache impl (``KVCacheManager`` + ``BlockPool``).

Each mutant is a small subclass of an impl class — never an edit of the impl source — that
reproduces a real upstream bug of docs/vllm.md §7.2 which applies to one full-attention group;
its docstring names the origin. Not applicable there (and so not planted): G2 (#19031, null blocks
are never prefix hits with full attention), G9/G10 (hash content and seed: the request computes
its hashes, outside the manager), G17 (unconfirmed). The registry attaches
:data:`PREFIX_CACHE_MUTANTS` to the component.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from impl.vllm.block_pool import BlockHashToBlockMap, BlockPool, KVCacheBlock
from impl.vllm.kv_cache_manager import (
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    KVCacheManager,
    MambaManager,
    SlidingWindowManager,
)
from spec.errors import DoubleFreeError
from spec.vllm.block_pool import BlockHashWithGroupId, BlockStored, RequestHashes
from spec.vllm.kv_cache_manager import KVCacheBlocks, Request
from stateful_tests.checker import Mutant


# ----------------------------------------------------------------------------- G1
class TouchBeforeCapacityCheck(KVCacheManager):
    """G1, vLLM issue #11562 / PR #11565: ``allocate_slots`` touched the prefix hits (one more
    reference each, out of the free queue) *before* checking that the rest fits; when it did not,
    ``None`` was returned with the references leaked, and the pool slowly ran dry."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> KVCacheBlocks | None:
        hits = new_computed_blocks.blocks[0] if new_computed_blocks is not None else ()
        rid, single = request.request_id, self._single
        external = args[1] if len(args) > 1 else kwargs.get("num_external_computed_tokens", 0)
        fresh = rid not in single.num_cached_block and not single.req_to_blocks.get(rid)
        if not hits or not fresh or external or request.num_computed_tokens:
            return super().allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                *args, **kwargs,
            )  # fmt: skip
        self._adopt(rid, hits, 0, 0)  # touched first ...
        request.num_computed_tokens += num_new_computed_tokens
        try:  # ... then the capacity check, as for a request holding the hits
            return super().allocate_slots(request, num_new_tokens, 0, None, *args, **kwargs)
        finally:
            request.num_computed_tokens -= num_new_computed_tokens


# ----------------------------------------------------------------------------- G3
class _WholesaleDeleteMap(BlockHashToBlockMap):
    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        entry = self._cache.get(key)
        if entry is None or type(entry) is KVCacheBlock:
            return super().pop(key, block_id)
        del self._cache[key]
        block = entry.pop(block_id, None)  # type: ignore[union-attr]
        if not entry:  # inverted: put back only when no block is left
            self._cache[key] = entry
        return block


class _WholesaleDeletePool(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cached_block_hash_to_block = _WholesaleDeleteMap()

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        if done:
            self.cached_block_hash_to_block = _WholesaleDeleteMap()
        return done


class DuplicateHashEntriesDeletedWholesale(KVCacheManager):
    """G3, vLLM PR #21281 -> #21357: evicting one of several blocks cached under the same hash
    dropped the whole entry (an inverted emptiness check), losing the other duplicates' cache hits;
    an emptied entry lingered instead."""

    pool_cls = _WholesaleDeletePool


# ----------------------------------------------------------------------------- G4
class CachingRestartsAtBlockZero(KVCacheManager):
    """G4, vLLM PR #14073: for a new request with prefix hits the cached-block count was not
    recorded (it defaulted to 0), so caching started again at block 0 — re-hashing hit blocks,
    which trips "block already has a hash"."""

    def _adopt(
        self, rid: str, hits: Sequence[KVCacheBlock], num_total: int, num_external: int
    ) -> list[KVCacheBlock]:
        blocks = super()._adopt(rid, hits, num_total, num_external)
        self._single.num_cached_block[rid] = 0
        return blocks


# ----------------------------------------------------------------------------- G5
class _ParentFromBlockPool(BlockPool):
    def cache_full_blocks(
        self,
        request: RequestHashes,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        before = len(self.kv_event_queue)
        super().cache_full_blocks(
            request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id,
            block_mask,
        )  # fmt: skip
        if len(self.kv_event_queue) > before and num_cached_blocks:
            event = self.kv_event_queue[-1]
            assert isinstance(event, BlockStored)
            parent_key = blocks[num_cached_blocks - 1].block_hash
            parent = parent_key[:-4]  # type: ignore[index]  # None once the parent was evicted
            self.kv_event_queue[-1] = BlockStored(
                event.block_hashes, parent, event.token_ids, event.block_size, event.group_idx
            )


class EventParentFromEvictedBlock(KVCacheManager):
    """G5, vLLM PR #11157: the parent hash of newly cached blocks was read from the previous
    *block* rather than from the request's hashes; after that block's cache entry was evicted the
    parent was ``None`` ("'NoneType' object has no attribute 'hash_value'")."""

    pool_cls = _ParentFromBlockPool


# ----------------------------------------------------------------------------- G6
class _CounterBeforeCheckPool(BlockPool):
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        ordered = [b for b in ordered_blocks if not b.is_null]
        for block in ordered:
            if block.ref_cnt <= 0:  # checked block by block, after the earlier ones changed
                raise DoubleFreeError(f"block {block.block_id} freed more often than referenced")
            block.ref_cnt -= 1
        for block in ordered:  # the check passed: the real release, as the impl does it
            block.ref_cnt += 1
        super().free_blocks(ordered)


class FreeQueueUpdatedBeforeCheck(KVCacheManager):
    """G6, vLLM PR #24228: state was updated before the check that could fail (``num_free_blocks``
    before the list walk's assertion), so a failed check left the pool inconsistent. Planted in
    ``free_blocks``: reference counts drop block by block, before the over-free check of a later
    block fails (a deferred block list freed twice) — the earlier blocks stay at their lowered
    counts, idle but not queued."""

    pool_cls = _CounterBeforeCheckPool


# ----------------------------------------------------------------------------- G7
class _UsageOverAllBlocks(BlockPool):
    def get_usage(self) -> float:
        return 1.0 - self.free_block_queue.num_free_blocks / self.num_gpu_blocks


class UsageCountsNullBlock(KVCacheManager):
    """G7, vLLM PR #22995: usage divided by all blocks, the null block included, so it never
    returned to 0 after every request finished."""

    pool_cls = _UsageOverAllBlocks


# ----------------------------------------------------------------------------- G8
class _TwoPassFree(BlockPool):
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        ordered = [b for b in ordered_blocks if not b.is_null]
        if any(b.ref_cnt < ordered.count(b) for b in ordered):
            return super().free_blocks(ordered)
        for block in ordered:
            block.ref_cnt -= 1
        idle = [b for b in ordered if b.ref_cnt == 0]  # a block freed twice is listed twice
        if self._unhashed_to_head:
            self.free_block_queue.prepend_n([b for b in idle if b.block_hash is None])
            idle = [b for b in idle if b.block_hash is not None]
        self.free_block_queue.append_n(idle)


class SameBlockTwiceInFreeQueue(KVCacheManager):
    """G8, vLLM issue #42571 (also vllm-ascend #14301): one ``free_blocks`` call holding the same
    block twice (two deferred frees batched) decremented first and then queued every input entry
    at 0 references — the block twice, ``num_free_blocks`` too high, a later ``popleft_n``
    assertion."""

    pool_cls = _TwoPassFree


# ----------------------------------------------------------------------------- G11
class CommonPrefixIgnoresSomeHolders(KVCacheManager):
    """G11, vLLM PR #23485: the common-prefix count compared ``ref_cnt`` with the number of
    requests the caller thought were sharing (the running ones) while other requests also held
    references; here: the requests with cached blocks, forgetting those that hold blocks without
    one (``count`` releases, up to 0.31)."""

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        if self.common_prefix_blocks == "deprecated" or not self.enable_caching:
            return [0]
        blocks = self._single.req_to_blocks.setdefault(running_request_id, [])
        sharing = len(self._single.num_cached_block)
        count = 0
        for block in blocks:
            if block.ref_cnt != sharing:
                break
            count += 1
        return [count]


# ----------------------------------------------------------------------------- G12, G13, G14
class FullSequenceNotChecked(KVCacheManager):
    """G12, vLLM PR #21809 (issue #18115): admission checked only the first chunk, ignoring
    ``full_sequence_must_fit`` — long prompts were admitted, preempted and re-admitted forever."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> KVCacheBlocks | None:
        if len(args) > 8:
            args = (*args[:8], False, *args[9:])
        kwargs.pop("full_sequence_must_fit", None)
        return super().allocate_slots(*args, **kwargs)


class ReservedBlocksIgnored(KVCacheManager):
    """G13, vLLM PR #44560: the admission check ignored ``reserved_blocks`` (blocks promised to
    in-flight async loads), so two loads could each take half the pool and deadlock."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> KVCacheBlocks | None:
        if len(args) > 9:
            args = (*args[:9], 0, *args[10:])
        kwargs.pop("reserved_blocks", None)
        return super().allocate_slots(*args, **kwargs)


class _HitsNotCounted(FullAttentionManager):
    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, hits: Sequence[KVCacheBlock]
    ) -> int:
        needed = -(-num_tokens // self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(needed - held, 0)
        return max(needed - (len(hits) + held), 0)  # the hits still in the free queue: forgotten


class PredictorIgnoresFreeHits(KVCacheManager):
    """G14 family, vLLM PRs #40946 / #41282 (issue #39734): the admission predictor and the
    allocator disagreed on a request's block count. Planted for full attention: the predictor does
    not count the hits that are still in the free queue (touching them consumes free blocks), so
    the allocation runs out half-way: "Cannot get N free blocks from the pool" after the hits were
    touched."""

    single_cls = _HitsNotCounted


# ----------------------------------------------------------------------------- G15
class _UnhashedToTail(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unhashed_to_head = False


class UnhashedFreedBlocksToTail(KVCacheManager):
    """G15, vLLM PR #42656: freed blocks without a hash (partial blocks, never a prefix hit) went to
    the tail like cache entries, so real cache entries were evicted before them."""

    pool_cls = _UnhashedToTail


# ----------------------------------------------------------------------------- G16
class FreeUnknownRequestCrashes(KVCacheManager):
    """G16, vLLM PR #18485: freeing a request that never got blocks (aborted while waiting)
    indexed ``req_to_blocks`` without a default — a ``KeyError`` that crashed the engine."""

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        rid = request.request_id
        self._single.num_cached_block.pop(rid, None)
        return self._single.req_to_blocks.pop(rid)


# ----------------------------------------------------------------------------- options (issue 30)
class CachingOffStillCaches(KVCacheManager):
    """Planted (issue 30), a bug only ``enable_caching=False`` shows: ``allocate_slots`` hashes
    full blocks into the prefix index without its ``enable_caching`` guard, so a pool with caching
    off keeps hashed blocks (and stored events) that nothing may read."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> KVCacheBlocks | None:
        caching = self.enable_caching
        self.enable_caching = True  # the guard is gone for this call only
        try:
            return super().allocate_slots(*args, **kwargs)
        finally:
            self.enable_caching = caching


class LookaheadNotClamped(KVCacheManager):
    """Planted (issue 30), a bug only lookahead tokens at the length cap show: the slots needed
    are no longer clamped to ``max_model_len`` when lookahead (speculative) tokens are asked for,
    so a request near the cap gets blocks past it. Played by lifting the cap by the lookahead for
    the call: on well-formed calls that removes exactly the clamp of the needed slots."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        *args: Any,
        **kwargs: Any,
    ) -> KVCacheBlocks | None:
        cap = self.max_model_len
        self.max_model_len = cap + max(num_lookahead_tokens, 0)
        try:
            return super().allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, *args, **kwargs,
            )  # fmt: skip
        finally:
            self.max_model_len = cap


# ----------------------------------------------------------------------------- sliding window
# Planted in the hybrid path (issue 26): a full-attention group and a sliding-window group on
# 0.34, the release whose hybrid coordinator kvspec models (docs/vllm-hybrid-groups.md).
class _WindowKept(SlidingWindowManager):
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        return None


class WindowBlocksNeverFreed(KVCacheManager):
    """Planted: the blocks a sliding window has left are never nulled and freed, so a long
    request holds its whole history in the window group (the memory the window was for)."""

    window_cls = _WindowKept


class _WindowRunNotReset(SlidingWindowManager):
    def find_window_hit(
        self, block_hashes: Sequence[Any], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        # the cached blocks are counted as one run across a miss: a hit whose window has a hole
        lookup = self.block_pool.cached_block_hash_to_block.get_one_block
        found = [
            lookup(block_hashes[i] + self.suffix) for i in range(max_length // self.block_size)
        ]
        cached = [i for i, b in enumerate(found) if b is not None]
        if len(cached) < self.need + eagle or not cached:
            return super().find_window_hit(block_hashes, max_length, eagle)
        end = cached[-1] + 1
        hits = [self.null_block] * end
        for i in cached[-(self.need + eagle) :]:
            hits[i] = found[i]  # type: ignore[assignment]
        if eagle:
            hits.pop()
        return hits


class WindowRunNotReset(KVCacheManager):
    """Planted: the window hit does not restart its run of cached blocks at a miss, so a prefix
    whose window has an uncached block is a hit (its KV there is missing)."""

    window_cls = _WindowRunNotReset


class _WindowNullsEvictable(SlidingWindowManager):
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        hits: Sequence[KVCacheBlock],
        computed: int = 0,
        main: int | None = None,
    ) -> int:
        extra = sum(1 for b in hits if b.is_null) if request_id not in self.num_cached_block else 0
        return super().get_num_blocks_to_allocate(request_id, num_tokens, hits, computed) + extra


class WindowNullsCountedEvictable(KVCacheManager):
    """vLLM PR #19031's kind (G2): the null blocks that pad a window hit (reference count 0)
    are counted as free blocks the hit takes from the queue, so an admission that fits is
    refused."""

    window_cls = _WindowNullsEvictable


class _WindowFreedFirstFirst(SlidingWindowManager):
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None or num_computed_tokens - self.sliding_window + 1 <= 0:
            return super().remove_skipped_blocks(request_id, num_computed_tokens)
        end = min(self.skipped_blocks(num_computed_tokens), len(blocks))
        freed = [b for b in blocks[:end] if not b.is_null]
        blocks[:end] = [self.null_block] * end
        if freed:
            self.block_pool.free_blocks(freed)  # first block first: evicted first


class WindowFreedOldestFirst(KVCacheManager):
    """Planted: the blocks leaving the window are freed oldest first (upstream frees the newest
    first), so the eviction order of those cached blocks changes."""

    window_cls = _WindowFreedFirstFirst


# ----------------------------------------------------------------------------- chunked local
class _ChunkHitFromBlockZero(ChunkedLocalAttentionManager):
    def local_hit(
        self, block_hashes: Sequence[Any], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        # the lookup walks from block 0 instead of the chunk's start, so the blocks of earlier
        # chunks (freed, then evicted) cut the hit short
        lookup = self.block_pool.cached_block_hash_to_block.get_one_block
        hits: list[KVCacheBlock] = []
        for i in range(max_length // self.block_size):
            block = lookup(block_hashes[i] + self.suffix)
            if block is None:
                break
            hits.append(block)
        start = self.skipped_tokens(len(hits) * self.block_size) // self.block_size
        return [self.null_block] * start + hits[start:]


class ChunkHitFromBlockZero(KVCacheManager):
    """Planted: the chunked-local hit is looked up from block 0 rather than from the chunk that
    holds its end, so a prefix whose earlier chunks were evicted is no longer a hit."""

    chunk_cls = _ChunkHitFromBlockZero


class _ChunkSkipRoundsUp(ChunkedLocalAttentionManager):
    def skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = self.attention_chunk_size
        return -(-num_computed_tokens // chunk) * chunk


class ChunkCurrentChunkFreed(KVCacheManager):
    """Planted: the tokens a chunked-local group skips are rounded up to the next chunk
    boundary, so the blocks of the chunk the next token still attends to are freed."""

    chunk_cls = _ChunkSkipRoundsUp


# ----------------------------------------------------------------------------- several groups
class FixedPointOneRound(KVCacheManager):
    """Planted: the hybrid hit stops after one round with any number of groups (upstream
    stops early only with full attention and one other group), so with three or more a group
    that accepted a longer candidate keeps a list longer than the hit."""

    def _hybrid_hit(
        self, block_hashes: Sequence[Any], limit: int
    ) -> tuple[KVCacheBlocks, int, int]:
        groups = self._locals
        self._locals = groups[:1]  # the one-round exit
        try:
            head, length, boundary = super()._hybrid_hit(block_hashes, limit)
        finally:
            self._locals = groups
        lists = list(head.blocks) if head.blocks else [[]]
        lists += [m.local_hit(block_hashes, length, False) for m in groups[1:]]
        found = min([length] + [len(x) * self.block_size for x in lists[2:]])
        blocks = KVCacheBlocks(tuple(lists)) if any(lists) else self.empty_kv_cache_blocks
        return blocks, found, boundary


# ----------------------------------------------------------------------------- Mamba
class _MambaCountsEveryBlock(MambaManager):
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        hits: Sequence[KVCacheBlock],
        computed: int = 0,
        main: int | None = None,
    ) -> int:
        base = super().get_num_blocks_to_allocate(request_id, num_tokens, hits, computed, main)
        if base > self.block_pool.num_gpu_blocks:
            return base
        held = len(self.req_to_blocks.get(request_id, ()))
        missing = -(-(num_tokens if main is None else main) // self.block_size) - len(hits) - held
        return base + max(missing - 1, 0)  # every missing position, as full attention counts


class MambaCountsEveryPosition(KVCacheManager):
    """Planted: the Mamba group's admission count asks for a block per missing position, as
    full attention does, though it takes one state block per step (the rest is null
    padding), so a prefill that fits is refused."""

    mamba_cls = _MambaCountsEveryBlock


class _MambaSameStepForgotten(MambaManager):
    def new_step_starts(self) -> None:
        pass

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        super().cache_blocks(request, num_tokens)
        self.cached_blocks_this_step.clear()  # nothing is remembered as cached this step


class MambaSameStepHitAdmitted(KVCacheManager):
    """Planted: a Mamba state cached in the current step is a usable hit at once (upstream makes
    such an admission wait for the next step: the state is written only by this step's
    forward pass)."""

    mamba_cls = _MambaSameStepForgotten


class _MambaFirstHit(MambaManager):
    def local_hit(
        self, block_hashes: Sequence[Any], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        lookup = self.block_pool.cached_block_hash_to_block.get_one_block
        for i in range(max_length // self.block_size):  # left to right: the first cached state
            block = lookup(block_hashes[i] + self.suffix)
            if block is not None:
                return [self.null_block] * i + [block]
        return []


class MambaHitTakesFirstState(KVCacheManager):
    """Planted: the Mamba hit takes the first cached state of the prefix rather than the last,
    so hits are shorter than they could be (and full attention's is cut to them)."""

    mamba_cls = _MambaFirstHit


_MAMBA: dict[str, Any] = {"sliding_window": 0, "attention_groups": (("mamba", 0),)}
PREFIX_CACHE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("touch_before_capacity_check", "vLLM PR #11565 (G1)", TouchBeforeCapacityCheck,
           "atomic_failure"),
    Mutant("duplicate_hash_entries_deleted_wholesale", "vLLM PR #21357 (G3)",
           DuplicateHashEntriesDeletedWholesale, "prefix_index_consistent"),
    Mutant("caching_restarts_at_block_zero", "vLLM PR #14073 (G4)", CachingRestartsAtBlockZero,
           "exception"),
    Mutant("event_parent_from_evicted_block", "vLLM PR #11157 (G5)", EventParentFromEvictedBlock,
           "exception"),
    Mutant("free_queue_updated_before_check", "vLLM PR #24228 (G6)", FreeQueueUpdatedBeforeCheck,
           "atomic_failure"),
    Mutant("usage_counts_null_block", "vLLM PR #22995 (G7)", UsageCountsNullBlock,
           "free_counter_matches_queue"),
    Mutant("same_block_twice_in_free_queue", "vLLM issue #42571 (G8)", SameBlockTwiceInFreeQueue,
           "free_and_used_partition_pool"),
    Mutant("common_prefix_ignores_some_holders", "vLLM PR #23485 (G11)",
           CommonPrefixIgnoresSomeHolders, "return_value", variant="r0.31"),
    Mutant("full_sequence_not_checked", "vLLM PR #21809 (G12)", FullSequenceNotChecked,
           "return_value"),
    Mutant("reserved_blocks_ignored", "vLLM PR #44560 (G13)", ReservedBlocksIgnored,
           "return_value"),
    Mutant("predictor_ignores_free_hits", "vLLM PRs #40946/#41282 (G14)",
           PredictorIgnoresFreeHits, "exception"),
    Mutant("unhashed_freed_blocks_to_tail", "vLLM PR #42656 (G15)", UnhashedFreedBlocksToTail,
           "identical_eviction_order", variant="unhashed_first"),
    Mutant("free_unknown_request_crashes", "vLLM PR #18485 (G16)", FreeUnknownRequestCrashes,
           "exception"),
    Mutant("caching_off_still_caches", "planted (issue 30): caching off", CachingOffStillCaches,
           "snapshot"),
    Mutant("lookahead_not_clamped", "planted (issue 30): lookahead at max_model_len",
           LookaheadNotClamped, "snapshot"),
    Mutant("window_blocks_never_freed", "planted (issue 26): sliding window kept whole",
           WindowBlocksNeverFreed, "snapshot", variant="r0.34"),
    Mutant("window_run_not_reset", "planted (issue 26): window hit across a miss",
           WindowRunNotReset, "return_value", variant="r0.34",
           options={"sliding_window": 3, "block_size": 1}),
    Mutant("window_nulls_counted_evictable", "vLLM PR #19031 (G2) on a window hit",
           WindowNullsCountedEvictable, "return_value", variant="r0.34"),
    Mutant("window_freed_oldest_first", "planted (issue 26): window free order",
           WindowFreedOldestFirst, "identical_eviction_order", variant="r0.34"),
    Mutant("chunk_hit_from_block_zero", "planted (issue 26): chunked-local lookup start",
           ChunkHitFromBlockZero, "return_value", variant="r0.34",
           options={"use_eagle": False, "attention_groups": (("chunked_local", 2),)}),
    Mutant("chunk_current_chunk_freed", "planted (issue 26): chunked-local skip rounded up",
           ChunkCurrentChunkFreed, "snapshot", variant="r0.34",
           options={"use_eagle": False, "attention_groups": (("chunked_local", 3),)}),
    Mutant("mamba_counts_every_position", "planted (issue 26): Mamba admission count",
           MambaCountsEveryPosition, "return_value", variant="r0.34", options=_MAMBA),
    Mutant("mamba_same_step_hit_admitted", "planted (issue 26): Mamba same-step hit",
           MambaSameStepHitAdmitted, "return_value", variant="r0.34", options=_MAMBA),
    Mutant("mamba_hit_takes_first_state", "planted (issue 26): Mamba hit scan direction",
           MambaHitTakesFirstState, "return_value", variant="r0.34", options=_MAMBA),
    Mutant("fixed_point_one_round", "planted (issue 26): one round with three groups",
           FixedPointOneRound, "return_value", variant="r0.34",
           options={"use_eagle": False, "sliding_window": 2,
                    "attention_groups": (("sliding_window", 3), ("chunked_local", 2))}),
)  # fmt: skip
