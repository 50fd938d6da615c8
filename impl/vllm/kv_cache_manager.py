"""vLLM's ``KVCacheManager`` (one full-attention group, and 0.34's further window and chunk
groups) — the fast implementation (same API and
observables as :mod:`spec.vllm.kv_cache_manager`, on the linked-list pool of
:mod:`impl.vllm.block_pool`).

Optimisations beyond the pool's (each guarded by the lockstep checkers, measured by ``kvspec bench
prefix-cache``):

* the prefix lookup probes the map's dict directly with the group suffix precomputed, and stops at
  the first miss (chained hashes: every later block misses too);
* a running request's step (decode, the next prefill chunk) takes a fast path: no hit bookkeeping,
  the block count from its own list, no ``KVCacheBlocks`` object when no block is new;
* ``cache_blocks`` returns before any work when no new block became full.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from impl.vllm.block_pool import BlockPool, KVCacheBlock
from spec.errors import InvalidArgument, RequestStateError
from spec.vllm.block_pool import BlockHash, FreeOrder, KVCacheEvent
from spec.vllm.kv_cache_manager import (
    CommonPrefix,
    KVCacheBlocks,
    KVCacheCoordinator,
    Request,
    RequestStatus,
    further_groups,
)

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class FullAttentionManager:
    """Per-request block lists and cached-block counts (``req_to_blocks``, ``num_cached_block``)."""

    def __init__(self, block_pool: BlockPool, block_size: int, use_eagle: bool) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.kv_cache_group_id = 0
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        entries = self.block_pool.cached_block_hash_to_block._cache
        suffix = self.kv_cache_group_id.to_bytes(4, "big")
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            entry = entries.get(block_hash + suffix)
            if entry is None:
                break  # chained hashes: no later block can hit either
            # relies on prefix_index_consistent: a duplicate entry is a non-empty {id: block}
            hits.append(entry if type(entry) is KVCacheBlock else next(iter(entry.values())))  # type: ignore[union-attr]
        if self.use_eagle and hits:
            hits.pop()
        return hits

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, hits: Sequence[KVCacheBlock]
    ) -> int:
        needed = -(-num_tokens // self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(needed - held, 0)
        missing = max(needed - (len(hits) + held), 0)
        return missing + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        num_full = num_tokens // self.block_size
        num_cached = self.num_cached_block.get(rid, 0)
        if num_cached >= num_full:
            return
        blocks = self.req_to_blocks.setdefault(rid, [])
        mask = self.cache_mask(num_full - num_cached)
        if mask is None:  # (the planted-bug pools take the upstream arguments only)
            self.block_pool.cache_full_blocks(
                request, blocks, num_cached, num_full, self.block_size, self.kv_cache_group_id
            )
        else:
            self.block_pool.cache_full_blocks(
                request, blocks, num_cached, num_full, self.block_size, self.kv_cache_group_id,
                mask,
            )  # fmt: skip
        self.num_cached_block[rid] = num_full

    def cache_mask(self, count: int) -> list[bool] | None:
        """Which of ``count`` newly full blocks can ever serve a hit (``None``: all of them)."""
        return None


class _LocalManager(FullAttentionManager):
    """A further KV cache group whose attention span ends (a sliding window, a chunk): per-request
    lists whose leading entries become the null block once wholly before that span."""

    def __init__(self, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int):
        super().__init__(block_pool, block_size, use_eagle)
        self.kv_cache_group_id = group_id
        self.suffix = group_id.to_bytes(4, "big")
        self.null_block = block_pool.null_block

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        raise NotImplementedError

    def skipped_blocks(self, num_computed_tokens: int) -> int:
        return self.skipped_tokens(num_computed_tokens) // self.block_size

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        raise NotImplementedError

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        hits: Sequence[KVCacheBlock],
        computed: int = 0,
        main: int | None = None,
    ) -> int:
        needed = -(-num_tokens // self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(needed - held, 0)
        skipped = self.skipped_blocks(computed)
        missing = max(needed - max(skipped, len(hits) + held), 0)
        return missing + sum(
            1 for b in hits[max(0, skipped - held) :] if b.ref_cnt == 0 and not b.is_null
        )

    def adopt(self, rid: str, hits: Sequence[KVCacheBlock], num_total: int, caching: bool) -> None:
        """Null blocks for the hits wholly before the span, then the others, touched."""
        blocks = self.req_to_blocks.setdefault(rid, [])
        if blocks:
            raise RequestStateError(f"request {rid} already holds blocks")
        skipped = self.skipped_blocks(num_total)
        kept = hits[skipped:]
        if caching:
            self.block_pool.touch(kept)
        blocks.extend([self.null_block] * skipped)
        blocks.extend(kept)
        self.num_cached_block[rid] = len(blocks)

    def allocate_new(self, rid: str, slots: int, main: int) -> list[KVCacheBlock]:
        """Blocks up to ``slots`` tokens; the new ones."""
        table = self.req_to_blocks.setdefault(rid, [])
        missing = -(-slots // self.block_size) - len(table)
        got = self.block_pool.get_new_blocks(missing) if missing > 0 else []
        table.extend(got)
        return got

    def new_step_starts(self) -> None:
        pass

    def allocate_external(self, rid: str, num_total: int, num_external: int) -> None:
        """Blocks up to ``num_total`` tokens, if an external token is still inside the span."""
        skipped = self.skipped_tokens(num_total)
        if skipped > 0:
            num_external = min(num_total - skipped, num_external)
        if num_external > 0:
            blocks = self.req_to_blocks[rid]
            blocks.extend(
                self.block_pool.get_new_blocks(
                    max(0, -(-num_total // self.block_size) - len(blocks))
                )
            )

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        if self.skipped_tokens(num_computed_tokens) <= 0:
            return
        blocks = self.req_to_blocks.setdefault(request_id, [])  # upstream's defaultdict
        end = min(self.skipped_blocks(num_computed_tokens), len(blocks))
        start = end
        null = self.null_block
        while start > 0 and blocks[start - 1] is not null:
            start -= 1
        if start < end:
            freed = blocks[start:end]
            blocks[start:end] = [null] * (end - start)
            self.block_pool.free_blocks(freed[::-1])

    def pop(self, rid: str) -> list[KVCacheBlock]:
        """The request's blocks after its leading null blocks, forgotten."""
        self.num_cached_block.pop(rid, None)
        blocks = self.req_to_blocks.pop(rid, [])
        lead = 0
        while lead < len(blocks) and blocks[lead].is_null:
            lead += 1
        return blocks[lead:]


class SlidingWindowManager(_LocalManager):
    """A sliding-window group: a hit needs only its last ``need`` blocks cached."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        use_eagle: bool,
        window: int,
        group_id: int = 1,
    ):
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.sliding_window = window
        # blocks a hit needs before its end (EAGLE looks one further); 0: none is ever cached
        self.need = -(-(window - 1) // block_size)

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        return self.find_window_hit(block_hashes, max_length, eagle)

    def find_window_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        lookup, suffix = self.block_pool.cached_block_hash_to_block.get_one_block, self.suffix
        need = self.need + eagle
        run = 0
        found: list[KVCacheBlock] = []
        start = -1
        for i in range(max_length // self.block_size - 1, -1, -1):
            block = lookup(block_hashes[i] + suffix)
            if block is None:
                run = 0
                found.clear()
                continue
            found.append(block)
            run += 1
            if run >= need:
                start = i
                break
        found.reverse()  # the run, first block first
        hits = [self.null_block] * start + found if start >= 0 else found
        if eagle and hits:
            hits.pop()
        return hits

    def cache_mask(self, count: int) -> list[bool] | None:
        # a one-token window: no block can serve a hit (the event still comes)
        return None if self.need or self.use_eagle else [False] * count


class ChunkedLocalAttentionManager(_LocalManager):
    """A chunked-local group: a hit is null blocks up to its chunk, then a cached run."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, chunk: int, group_id: int = 1
    ):
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.attention_chunk_size = chunk

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        lookup, suffix = self.block_pool.cached_block_hash_to_block.get_one_block, self.suffix
        start = self.skipped_tokens(max_length) // self.block_size
        hits = [self.null_block] * start
        for i in range(start, max_length // self.block_size):
            block = lookup(block_hashes[i] + suffix)
            if block is None:
                break
            hits.append(block)
        return hits


class MambaManager(_LocalManager):
    """A Mamba group ("align" mode): one state block per step at the end of the list."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, size: int, group_id: int = 1
    ):
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.last_state_block_idx: dict[str, int] = {}
        self.num_retired_blocks: dict[str, int] = {}
        self.allocated_block_reqs: set[str] = set()
        self.cached_blocks_this_step: set[bytes] = set()

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, eagle: bool
    ) -> list[KVCacheBlock]:
        lookup, suffix = self.block_pool.cached_block_hash_to_block.get_one_block, self.suffix
        for i in range(max_length // self.block_size - 1, -1, -1):
            block = lookup(block_hashes[i] + suffix)
            if block is not None:
                return [self.null_block] * i + [block]
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        hits: Sequence[KVCacheBlock],
        computed: int = 0,
        main: int | None = None,
    ) -> int:
        if hits and hits[-1].block_hash in self.cached_blocks_this_step:
            return self.block_pool.num_gpu_blocks + 1  # a hit cached this step waits
        tokens = num_tokens if main is None else main
        held = len(self.req_to_blocks.setdefault(request_id, []))  # upstream's defaultdict
        new = -(-tokens // self.block_size) - len(hits) - held
        return min(new, 1) + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def allocate_new(self, rid: str, slots: int, main: int) -> list[KVCacheBlock]:
        table = self.req_to_blocks.setdefault(rid, [])
        required = -(-main // self.block_size)
        prev = len(table)
        if required <= prev:
            self.allocated_block_reqs.add(rid)
            return []
        if prev or rid in self.allocated_block_reqs:
            self.last_state_block_idx[rid] = prev - 1
        if prev < required - 1:
            table.extend([self.null_block] * (required - 1 - prev))
        new = self.block_pool.get_new_blocks(required - len(table))
        added = table[prev:] + new
        table.extend(new)
        self.allocated_block_reqs.add(rid)
        return added

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        null = self.null_block
        if num_computed_tokens > 1:
            blocks = self.req_to_blocks.setdefault(request_id, [])
            first = self.num_retired_blocks.get(request_id, 0)
            last = min((num_computed_tokens - 1) // self.block_size, len(blocks))
            if first < last:
                freed = [b for b in blocks[first:last][::-1] if b is not null]
                blocks[first:last] = [null] * (last - first)
                if freed:
                    self.block_pool.free_blocks(freed)
                self.num_retired_blocks[request_id] = last
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < -(-num_computed_tokens // self.block_size) - 1:
            blocks = self.req_to_blocks.setdefault(request_id, [])
            if blocks[idx] is not null:
                self.block_pool.free_blocks([blocks[idx]])
                blocks[idx] = null

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        blocks = self.req_to_blocks.get(rid, [])
        bs = self.block_size
        idx = num_tokens // bs - 1
        if (
            num_tokens > 0 and num_tokens % bs == 0
            and num_tokens == (request.num_prompt_tokens - 1) // bs * bs
            and idx < len(blocks) and blocks[idx] is not self.null_block
            and blocks[idx].block_hash is None
        ):  # fmt: skip
            self.block_pool.cache_full_blocks(
                request, blocks, idx, idx + 1, bs, self.kv_cache_group_id
            )
            self.cached_blocks_this_step.add(blocks[idx].block_hash)  # type: ignore[arg-type]
        for block in blocks[before : self.num_cached_block.get(rid, 0)]:
            if block is not self.null_block and block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    def pop(self, rid: str) -> list[KVCacheBlock]:
        self.allocated_block_reqs.discard(rid)
        self.last_state_block_idx.pop(rid, None)
        self.num_retired_blocks.pop(rid, None)
        return super().pop(rid)


class KVCacheManager:
    """The fast manager; see :class:`spec.vllm.kv_cache_manager.KVCacheManager` for the contract."""

    pool_cls: ClassVar[type[BlockPool]] = BlockPool
    single_cls: ClassVar[type[FullAttentionManager]] = FullAttentionManager
    window_cls: ClassVar[type[SlidingWindowManager]] = SlidingWindowManager
    chunk_cls: ClassVar[type[ChunkedLocalAttentionManager]] = ChunkedLocalAttentionManager
    mamba_cls: ClassVar[type[MambaManager]] = MambaManager

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        free_order: FreeOrder = "unhashed_first",
        adopt_computed_tokens: bool = True,
        common_prefix_blocks: CommonPrefix = "deprecated",
        hit_length_cap: bool = True,
        hit_length_clamp: bool = False,
        sliding_window: int = 0,
        attention_groups: Sequence[tuple[str, int]] = (),
    ) -> None:
        if block_size < 1 or max_model_len < 1 or watermark < 0:
            raise InvalidArgument("block_size and max_model_len must be >= 1, watermark >= 0")
        further = further_groups(sliding_window, attention_groups, use_eagle)
        if common_prefix_blocks not in ("count", "deprecated", "removed"):
            raise InvalidArgument(f"unknown variant value {common_prefix_blocks!r}")
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.adopt_computed_tokens = adopt_computed_tokens
        self.common_prefix_blocks: CommonPrefix = common_prefix_blocks
        self.hit_length_clamp = hit_length_clamp
        self.hit_length_cap = hit_length_cap
        self.block_pool = self.pool_cls(
            num_blocks, enable_caching, block_size, enable_kv_cache_events, free_order
        )
        self._single = self.single_cls(self.block_pool, block_size, use_eagle)
        # the further KV cache groups (the hybrid paths below); (): one group
        kinds: dict[str, Callable[..., _LocalManager]] = {
            "sliding_window": self.window_cls,
            "chunked_local": self.chunk_cls,
            "mamba": self.mamba_cls,
        }
        self._locals: tuple[_LocalManager, ...] = tuple(
            kinds[kind](self.block_pool, block_size, use_eagle, size, g)
            for g, (kind, size) in enumerate(further, start=1)
        )
        managers = (self._single, *self._locals)
        self.coordinator = KVCacheCoordinator(self.block_pool, managers)  # type: ignore[arg-type]
        self.watermark_blocks = int(watermark * num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(((),) * len(managers))

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[Any], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        if max_cache_hit_length is not None:
            if not self.hit_length_cap:
                raise TypeError("get_computed_blocks() takes no max_cache_hit_length before 0.33")
            if max_cache_hit_length < 0:
                raise InvalidArgument(f"negative max_cache_hit_length {max_cache_hit_length}")
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        if self.hit_length_clamp:  # 0.34: an explicit bound only lowers the default one
            limit = min(limit, request.num_tokens - 1)
        if self._locals:
            return self._hybrid_hit(request.block_hashes, limit)
        hits = self._single.find_longest_cache_hit(request.block_hashes, limit)
        if not hits:
            return self.empty_kv_cache_blocks, 0, 0
        return KVCacheBlocks((hits,)), len(hits) * self.block_size, 0

    def _hybrid_hit(
        self, block_hashes: Sequence[BlockHash], limit: int
    ) -> tuple[KVCacheBlocks, int, int]:
        bs, eagle = self.block_size, self._single.use_eagle
        most = len(block_hashes) * bs
        full = self._single.find_longest_cache_hit(
            block_hashes, min(limit + bs, most) if eagle else limit
        )
        length = longest = len(full) * bs
        lists: list[list[KVCacheBlock]] = [full]
        lists += [[] for _ in self._locals]
        verified: set[int] = set()
        candidate = limit
        while True:  # the fixed point; one round with one further group
            for g, manager in enumerate(self._locals, start=1):
                drop = eagle and g not in verified
                margin = drop and not isinstance(manager, MambaManager)  # Mamba never drops
                ask = min(length + bs, most) if margin else length
                hits = manager.local_hit(block_hashes, ask, drop)
                lists[g] = hits
                found = len(hits) * bs
                if drop:
                    verified.add(g)
                elif found < length:
                    verified.clear()
                length = found
                if length > longest:
                    longest = length
            if length >= candidate or len(self._locals) == 1:
                break
            candidate = length
        del full[-(-length // bs) :]
        blocks = KVCacheBlocks(tuple(lists)) if any(lists) else self.empty_kv_cache_blocks
        return blocks, length, longest if longest > length else 0

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        if self._locals:
            return self._allocate_hybrid(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
            )  # fmt: skip
        rid = request.request_id
        single, pool = self._single, self.block_pool
        hits = new_computed_blocks.blocks[0] if new_computed_blocks is not None else ()
        if new_computed_blocks is not None and len(new_computed_blocks.blocks) != 1:
            raise InvalidArgument(f"{len(new_computed_blocks.blocks)} lists of hits for 1 group")
        if (
            num_new_tokens == 0
            and num_external_computed_tokens == 0
            and not (self.adopt_computed_tokens and num_new_computed_tokens > 0)
        ):
            raise InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        if (
            min(
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                num_external_computed_tokens,
                reserved_blocks,
            )
            < 0
            or request.num_tokens > self.max_model_len
            or hits
            or num_external_computed_tokens
            or request.num_computed_tokens + num_new_computed_tokens > request.num_tokens
        ):
            self._validate(request, hits, num_new_tokens, num_new_computed_tokens,
                           num_lookahead_tokens, num_external_computed_tokens, reserved_blocks)  # fmt: skip
        max_len = self.max_model_len
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local + num_external_computed_tokens, max_len)
        watermark = (
            self.watermark_blocks if has_scheduled_reqs and request.status in _WAITING else 0
        )
        free = pool.free_block_queue.num_free_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, max_len)
            if single.get_num_blocks_to_allocate(rid, full, hits) + watermark > free:
                return None
        need_slots = min(total + num_new_tokens + num_lookahead_tokens, max_len)
        req_blocks = single.req_to_blocks.get(rid)
        tracked = rid in single.num_cached_block
        bs = self.block_size
        if tracked:  # fast path, a running request: it has no hits (validated above)
            # relies on the bookkeeping cached_blocks_are_a_prefix reads: a request gets a cached
            # count only with a block list (adoption and cache_blocks create both; free pops both)
            assert req_blocks is not None
            missing = -(-need_slots // bs) - len(req_blocks)
            if max(missing, 0) + watermark > free - reserved_blocks:
                return None
        else:
            needed = single.get_num_blocks_to_allocate(rid, need_slots, hits)
            if needed + watermark > free - reserved_blocks:
                return None
            if hits or num_external_computed_tokens > 0:
                req_blocks = self._adopt(rid, hits, num_local + num_external_computed_tokens,
                                         num_external_computed_tokens)  # fmt: skip
            if req_blocks is None:
                req_blocks = single.req_to_blocks[rid] = []
            missing = -(-need_slots // bs) - len(req_blocks)
        new_blocks: list[KVCacheBlock] = []
        if missing > 0:
            new_blocks = pool.get_new_blocks(missing)
            req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            single.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new_blocks,)) if new_blocks else self.empty_kv_cache_blocks

    def _allocate_hybrid(
        self,
        request: Request,
        num_new: int,
        num_hit: int,
        computed_blocks: KVCacheBlocks | None,
        lookahead: int,
        num_external: int,
        delay: bool,
        must_fit: bool,
        reserved: int,
        has_scheduled_reqs: bool,
    ) -> KVCacheBlocks | None:
        """``allocate_slots`` with further groups: the same steps as the spec's, with their
        skipped blocks freed before the capacity check."""
        single, local, pool = self._single, self._locals, self.block_pool
        rid = request.request_id
        lists = computed_blocks.blocks if computed_blocks is not None else ((),) * (1 + len(local))
        if len(lists) != 1 + len(local):
            raise InvalidArgument(f"{len(lists)} lists of hits for {1 + len(local)} groups")
        hits, local_hits = lists[0], lists[1:]
        if num_new == 0 and num_external == 0 and not (self.adopt_computed_tokens and num_hit):
            raise InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        self._validate(request, hits, num_new, num_hit, lookahead, num_external, reserved)
        max_len, bs = self.max_model_len, self.block_size
        num_local = request.num_computed_tokens + num_hit
        total = min(num_local + num_external, max_len)
        watermark = (
            self.watermark_blocks if has_scheduled_reqs and request.status in _WAITING else 0
        )
        if must_fit:
            full = min(request.num_tokens, max_len)
            need = single.get_num_blocks_to_allocate(rid, full, hits)
            for m, h in zip(local, local_hits, strict=True):
                need += m.get_num_blocks_to_allocate(rid, full, h, total, full)
            if need + watermark > pool.free_block_queue.num_free_blocks:
                return None
        processed = max(0, total - request.num_in_flight_tokens)
        for m in local:
            m.remove_skipped_blocks(rid, processed)
        main = total + num_new
        slots = min(main + lookahead, max_len)
        need = single.get_num_blocks_to_allocate(rid, slots, hits)
        num_total = num_local + num_external
        for m, h in zip(local, local_hits, strict=True):
            need += m.get_num_blocks_to_allocate(rid, slots, h, num_total, main)
        if need + watermark > pool.free_block_queue.num_free_blocks - reserved:
            return None
        fresh = rid not in single.num_cached_block and all(
            rid not in m.num_cached_block for m in local
        )
        if fresh and (hits or any(local_hits) or num_external > 0):
            self._adopt(rid, hits, 0, 0)  # every group's hits touched before any new block
            for m, h in zip(local, local_hits, strict=True):
                m.adopt(rid, h, num_total, self.enable_caching)
            if num_external > 0:
                table = single.req_to_blocks[rid]
                table.extend(pool.get_new_blocks(max(0, -(-num_total // bs) - len(table))))
                for m in local:
                    m.allocate_external(rid, num_total, num_external)
        table = single.req_to_blocks.setdefault(rid, [])
        missing = -(-slots // bs) - len(table)
        got = pool.get_new_blocks(missing) if missing > 0 else []
        table.extend(got)
        new = [got] + [m.allocate_new(rid, slots, main) for m in local]
        if self.enable_caching and not delay:
            upto = min(total + num_new, request.num_tokens)
            single.cache_blocks(request, upto)
            aligned = upto // bs * bs  # each further group caches up to the hit alignment
            for m in local:  # (with EAGLE one block past it: all of upto)
                m.cache_blocks(request, upto if m.use_eagle and aligned else aligned)
        return KVCacheBlocks(tuple(new)) if any(new) else self.empty_kv_cache_blocks

    def _adopt(
        self, rid: str, hits: Sequence[KVCacheBlock], num_total: int, num_external: int
    ) -> list[KVCacheBlock]:
        """Touch and adopt the hits (and blocks for external tokens) of an untracked request."""
        single, pool = self._single, self.block_pool
        req_blocks = single.req_to_blocks.setdefault(rid, [])
        if req_blocks:
            raise RequestStateError(f"request {rid} already holds blocks")
        if self.enable_caching:
            pool.touch(hits)
        req_blocks.extend(hits)
        single.num_cached_block[rid] = len(req_blocks)
        if num_external > 0:
            missing = max(0, -(-num_total // self.block_size) - len(req_blocks))
            req_blocks.extend(pool.get_new_blocks(missing))
        return req_blocks

    def _validate(self, request: Request, hits: Sequence[KVCacheBlock], *counts: int) -> None:
        if any(n < 0 for n in counts):
            raise InvalidArgument(f"negative token or block count among {counts}")
        if request.num_tokens > self.max_model_len:
            raise InvalidArgument(
                f"request {request.request_id} has {request.num_tokens} tokens, more than "
                f"max_model_len={self.max_model_len}"
            )
        rid, single = request.request_id, self._single
        if hits and (rid in single.num_cached_block or single.req_to_blocks.get(rid)):
            raise RequestStateError(f"prefix hits for request {rid}, which already holds blocks")
        if request.num_computed_tokens + counts[1] + counts[3] > request.num_tokens:
            raise InvalidArgument(
                f"computed ({request.num_computed_tokens}), hit ({counts[1]}) and external "
                f"({counts[3]}) tokens exceed the {request.num_tokens} tokens of the request"
            )
        if not hits:
            return
        if counts[1] != len(hits) * self.block_size:
            raise InvalidArgument(
                f"{counts[1]} computed tokens for {len(hits)} hit blocks of {self.block_size}"
            )
        if request.num_computed_tokens:
            raise InvalidArgument(
                f"prefix hits for request {rid}, which already has computed tokens"
            )

    def free(self, request: Request) -> None:
        rid = request.request_id
        self._single.num_cached_block.pop(rid, None)
        blocks = self._single.req_to_blocks.pop(rid, [])
        if blocks:
            self.block_pool.free_blocks(blocks[::-1])
        for m in self._locals:  # group by group, one call each (as upstream)
            self.block_pool.free_blocks(m.pop(rid)[::-1])

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        rid = request.request_id
        self._single.num_cached_block.pop(rid, None)
        blocks = self._single.req_to_blocks.pop(rid, [])
        for m in self._locals:
            blocks = blocks + m.pop(rid)
        return blocks

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def new_step_starts(self) -> None:
        for m in self._locals:
            m.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        if self.common_prefix_blocks == "removed":
            raise InvalidArgument("get_num_common_prefix_blocks() does not exist in 0.34")
        if self.common_prefix_blocks == "deprecated" or not self.enable_caching:
            return [0]
        table = self._single.req_to_blocks
        blocks = table.setdefault(running_request_id, [])
        holders = len(table)
        count = 0
        for block in blocks:
            if block.ref_cnt != holders:
                break
            count += 1
        return [count]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        lists = [self._single.req_to_blocks.get(request_id) or []]
        lists += [m.req_to_blocks.get(request_id) or [] for m in self._locals]
        return self.create_kv_cache_blocks(tuple(lists))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
