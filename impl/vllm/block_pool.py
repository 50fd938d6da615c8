"""vLLM's GPU ``BlockPool`` — the fast implementation (same API and observables as
:mod:`spec.vllm.block_pool`).

Optimisations, each guarded by the lockstep checkers and measured by ``kvspec bench prefix-pool``:

* the free queue is an intrusive doubly linked list through the blocks (fake head and tail, a
  counter): ``remove`` (a prefix hit on a free block) is O(1) instead of a list scan, ``popleft_n``
  / ``append_n`` / ``prepend_n`` are O(k) instead of O(N) list copies;
* a map entry with one block holds the block itself (the common case: no ``{id: block}`` dict per
  cached block), a dict only for duplicates;
* ``free_blocks`` validates while it decrements and undoes the decrements when a count would go
  negative, instead of counting occurrences first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spec.errors import DoubleFreeError, InvalidArgument, UnknownBlockId
from spec.vllm.block_pool import (
    FREE_ORDERS,
    AllBlocksCleared,
    BlockHash,
    BlockHashWithGroupId,
    BlockRemoved,
    BlockStored,
    FreeOrder,
    KVCacheEvent,
    RequestHashes,
)


class KVCacheBlock:
    """A block with the links of the free queue (``None``/``None``: not in the queue)."""

    __slots__ = (
        "_block_hash",
        "block_id",
        "is_null",
        "next_free_block",
        "prev_free_block",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHashWithGroupId | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    def set_block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        if self._block_hash is not None:
            raise AssertionError("The block already has a hash. This should not happen.")
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """The free blocks in eviction order as a linked list between two fake blocks."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.num_free_blocks = 0
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if not 0 <= n <= self.num_free_blocks:
            raise AssertionError(f"cannot pop {n} of {self.num_free_blocks} free blocks")
        taken = []
        block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert block is not None
            taken.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        assert block is not None
        self.fake_free_list_head.next_free_block = block
        block.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        # relies on free_and_used_partition_pool: a block has links iff it is in the queue
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._link(self.fake_free_list_tail.prev_free_block, blocks, self.fake_free_list_tail)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._link(self.fake_free_list_head, blocks, self.fake_free_list_head.next_free_block)

    def _link(
        self,
        before: KVCacheBlock | None,
        blocks: Sequence[KVCacheBlock],
        after: KVCacheBlock | None,
    ) -> None:
        """Splice ``blocks`` (in order) between two adjacent queue members; the counter is
        updated after the links (#24228: a counter bumped before linking goes out of sync)."""
        assert before is not None and after is not None
        for block in blocks:
            before.next_free_block, block.prev_free_block = block, before
            before = block
        before.next_free_block, after.prev_free_block = after, before
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out = []
        block = self.fake_free_list_head.next_free_block
        tail = self.fake_free_list_tail
        while block is not None and block is not tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockHashToBlockMap:
    """Cache key -> one block, or ``{block_id: block}`` (insertion order) for duplicates."""

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        entry = self._cache.get(key)
        if entry is None or type(entry) is KVCacheBlock:
            return entry
        # relies on prefix_index_consistent: no empty entries, so the dict has a first block
        return next(iter(entry.values()))  # type: ignore[union-attr]

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        entry = self._cache.get(key)
        if entry is None:
            self._cache[key] = block
        elif type(entry) is KVCacheBlock:
            self._cache[key] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block  # type: ignore[index]

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if type(entry) is KVCacheBlock:
            if entry.block_id != block_id:
                return None
            del self._cache[key]
            return entry
        block = entry.pop(block_id, None)  # type: ignore[union-attr]
        if not entry:
            del self._cache[key]
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """The fast pool; see :class:`spec.vllm.block_pool.BlockPool` for the contract."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        free_order: FreeOrder = "unhashed_first",
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 1:
            raise InvalidArgument(f"num_gpu_blocks must be an int >= 1, got {num_gpu_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise InvalidArgument(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.free_order: FreeOrder = free_order
        self._unhashed_to_head = free_order == "unhashed_first"
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        found = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(
                block_hash + group_id.to_bytes(4, "big")
            )
            if block is None:
                return None
            found.append(block)
        return found

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
        if num_cached_blocks >= num_full_blocks:
            return
        suffix = kv_cache_group_id.to_bytes(4, "big")
        hashes = request.block_hashes
        insert = self.cached_block_hash_to_block.insert
        stored: list[BlockHash] = []
        for i, block in enumerate(blocks[num_cached_blocks:num_full_blocks], num_cached_blocks):
            if block.is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            block_hash = hashes[i]
            key = block_hash + suffix
            block.set_block_hash(key)
            insert(key, block)
            stored.append(block_hash)
        if self.enable_kv_cache_events:
            parent = hashes[num_cached_blocks - 1] if num_cached_blocks else None
            start, end = num_cached_blocks * block_size, num_full_blocks * block_size
            self.kv_event_queue.append(
                BlockStored(
                    stored,
                    parent,
                    list(request.all_token_ids[start:end]),
                    block_size,
                    kv_cache_group_id,
                )
            )

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks < 0:
            raise InvalidArgument(f"cannot get a negative number of blocks ({num_blocks})")
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        taken = self.free_block_queue.popleft_n(num_blocks)
        caching = self.enable_caching
        for block in taken:
            if caching and block._block_hash is not None:
                self._maybe_evict_cached_block(block)
            if block.ref_cnt != 0:
                raise AssertionError(f"free block {block.block_id} has ref_cnt {block.ref_cnt}")
            block.ref_cnt = 1
        return taken

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block._block_hash
        if key is None:
            return False
        removed = self.cached_block_hash_to_block.pop(key, block.block_id) is not None
        block._block_hash = None
        if removed and self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved([key[:-4]], int.from_bytes(key[-4:], "big")))
        return removed

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        remove = self.free_block_queue.remove
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                remove(block)  # O(1): relies on free_and_used_partition_pool (ref 0 <=> queued)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        ordered = [b for b in ordered_blocks if not b.is_null]
        unhashed: list[KVCacheBlock] = []
        hashed: list[KVCacheBlock] = []
        to_head = self._unhashed_to_head
        caching = self.enable_caching
        for done, block in enumerate(ordered):
            block.ref_cnt -= 1
            if block.ref_cnt < 0:  # validate-first by undoing (atomic_failure): nothing changed
                for earlier in ordered[: done + 1]:
                    earlier.ref_cnt += 1
                over = sorted({b.block_id for b in ordered if ordered.count(b) > b.ref_cnt})
                raise DoubleFreeError(f"blocks {over} would be freed more often than referenced")
            if block.ref_cnt == 0:
                if to_head and (block._block_hash is None or not caching):
                    unhashed.append(block)
                else:
                    hashed.append(block)
        if unhashed:
            self.free_block_queue.prepend_n(unhashed)
        if hashed:
            self.free_block_queue.append_n(hashed)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        n = self.num_gpu_blocks
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise UnknownBlockId(f"Invalid block ids {bad}: the pool has {n}")
        for block_id in ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        if self.num_gpu_blocks - self.free_block_queue.num_free_blocks != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block._block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        usable = self.num_gpu_blocks - 1
        return 0.0 if not usable else 1.0 - self.free_block_queue.num_free_blocks / usable

    def take_events(self) -> list[KVCacheEvent]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
