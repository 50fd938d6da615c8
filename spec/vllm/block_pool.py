"""vLLM v1's GPU prefix-cache ``BlockPool`` (``vllm/v1/core/block_pool.py``) — the executable spec.

Source of truth: docs/vllm.md §5.1–§5.2 and docs/vllm-kv-cache-manager.md §2–§4 (releases 0.28.0 to
0.33.0). The three data structures are the obvious ones: the free queue is a Python list (head =
index 0 = evicted first), the hash map is a dict of dicts (``{key: {block_id: block}}``, inner
dicts in insertion order, duplicates kept), blocks are small records.

Exact-order rules reproduced (docs/vllm.md §5.2, §8):

* eviction is lazy and LRU from the head: ``get_new_blocks`` pops the head and only then drops the
  popped blocks' hashes;
* ``free_blocks(ordered)`` gives back references in the order given (the first is evicted
  first); with ``free_order="unhashed_first"`` (#42656, every release 0.28–0.33) blocks reaching
  ref 0 without a hash go to the *head* (in the order given), hashed ones to the tail;
  ``"classic"`` (before #42656) sends all of them to the tail;
* a block keeps its hash while it is free, so a prefix hit can take it back (``touch``).

Where kvspec is stricter than upstream (bad input only; docs/vllm-kv-cache-manager.md §6):

* ``free_blocks`` rejects a call that would take a block's ref count below 0 (``DoubleFreeError``,
  nothing changes); upstream decrements to -1 silently;
* ``evict_blocks`` rejects any id outside ``[0, N)`` before evicting anything (``UnknownBlockId``,
  an ``AssertionError`` like upstream's own check for ids >= N; upstream evicts the ids met before
  the bad one, and a negative id aliases a block counted from the end);
* ``get_new_blocks`` rejects a negative count (upstream's queue then *raises* its counter).

Not modelled: KV-cache metrics, partial (sub-block) hash entries and ``move_block_hashes`` (only
reachable with a hash block size below the block size), ``unpin_blocks`` and the reuse watchers
(0.30+, not used by the manager), multi-pool frees, multimodal/LoRA extra keys in events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from spec.errors import DoubleFreeError, InvalidArgument, UnknownBlockId

FreeOrder = Literal["unhashed_first", "classic"]
FREE_ORDERS: tuple[FreeOrder, ...] = ("unhashed_first", "classic")

BlockHash = bytes
"""The hash of one full block of tokens (upstream ``BlockHash``: bytes)."""
BlockHashWithGroupId = bytes
"""A map key: the block hash followed by the KV-cache group id as 4 big-endian bytes."""


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    return key[:-4]


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """One GPU block: id, reference count, cache key (``None``: not cached), null flag."""

    block_id: int
    ref_cnt: int = 0
    _block_hash: BlockHashWithGroupId | None = None
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    def set_block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        """Pre: the block has no hash (upstream asserts). Post: it has ``block_hash``."""
        if self._block_hash is not None:
            raise AssertionError("The block already has a hash. This should not happen.")
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None


class RequestHashes(Protocol):
    """What the pool reads of a request: its full-block hashes and its tokens."""

    @property
    def block_hashes(self) -> Sequence[BlockHash]: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class BlockStored:
    """Blocks cached for a request (hashes without group ids, parent = the hash before them)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    group_idx: int = 0


@dataclass(frozen=True)
class BlockRemoved:
    """Cache entries dropped (one event per removed key)."""

    block_hashes: list[BlockHash]
    group_idx: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


# ----------------------------------------------------------------------------- free queue
@dataclass
class FreeKVCacheBlockQueue:
    """The free blocks in eviction order: a plain list, head (index 0) evicted first."""

    blocks: list[KVCacheBlock] = field(default_factory=list)

    @property
    def num_free_blocks(self) -> int:
        return len(self.blocks)

    def popleft(self) -> KVCacheBlock:
        """Pre: not empty (``ValueError`` otherwise). Post: the head is removed and returned."""
        if not self.blocks:
            raise ValueError("No free blocks available")
        return self.blocks.pop(0)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pre: ``0 <= n <= num_free_blocks``. Post: the first ``n`` blocks, in order, removed."""
        if not 0 <= n <= len(self.blocks):
            raise AssertionError(f"cannot pop {n} of {len(self.blocks)} free blocks")
        taken, self.blocks = self.blocks[:n], self.blocks[n:]
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        """Pre: ``block`` is in the queue (``RuntimeError`` otherwise, as upstream)."""
        if not any(b is block for b in self.blocks):
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        self.blocks = [b for b in self.blocks if b is not block]

    def append(self, block: KVCacheBlock) -> None:
        self.blocks.append(block)

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Post: ``blocks`` at the tail, in the order given."""
        self.blocks.extend(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Post: ``blocks`` at the head, in the order given (``[x, y]`` -> ``x, y, old head…``)."""
        self.blocks[:0] = blocks

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return list(self.blocks)


# ----------------------------------------------------------------------------- hash map
class BlockHashToBlockMap:
    """Cache key -> the blocks cached under it, ``{block_id: block}`` in insertion order. Identical
    content may be cached in several blocks (no de-duplication: block tables stay append-only)."""

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The first block cached under ``key`` (insertion order), or ``None``."""
        blocks = self._cache.get(key)
        return next(iter(blocks.values())) if blocks else None

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Post: ``block_id`` is no longer under ``key`` (the key goes with its last block);
        returns the removed block, ``None`` if it was not there (nothing changes then)."""
        blocks = self._cache.get(key)
        if blocks is None or block_id not in blocks:
            return None
        block = blocks.pop(block_id)
        if not blocks:
            del self._cache[key]
        return block

    def __len__(self) -> int:
        return len(self._cache)


# ----------------------------------------------------------------------------- the pool
class BlockPool:
    """``num_gpu_blocks`` blocks; block 0 is the null block (a placeholder, never handed out)."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        free_order: FreeOrder = "unhashed_first",
    ) -> None:
        """Pre: ``num_gpu_blocks >= 1``, a known ``free_order`` (``InvalidArgument``)."""
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 1:
            raise InvalidArgument(f"num_gpu_blocks must be an int >= 1, got {num_gpu_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise InvalidArgument(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.free_order: FreeOrder = free_order
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(list(self.blocks))
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """For each group, the first block cached under ``block_hash``; ``None`` if a group
        misses."""
        found = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            block = self.cached_block_hash_to_block.get_one_block(key)
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
        """Pre: ``blocks[num_cached_blocks:num_full_blocks]`` are full and unhashed (upstream
        asserts). Post: each of them (null blocks, and those ``block_mask`` leaves out, skipped)
        carries the request's hash of its position and is in the map; one ``BlockStored`` event
        when events are on (even if every block was skipped). The slice may be shorter than asked
        (a request past ``max_model_len``): only the blocks there are cached."""
        if num_cached_blocks >= num_full_blocks:
            return
        new_full = blocks[num_cached_blocks:num_full_blocks]
        stored: list[BlockHash] = []
        for i, block in enumerate(new_full):
            if block.is_null or (block_mask is not None and not block_mask[i]):
                continue
            block_hash = request.block_hashes[num_cached_blocks + i]
            key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
            block.set_block_hash(key)
            self.cached_block_hash_to_block.insert(key, block)
            stored.append(block_hash)
        if self.enable_kv_cache_events:
            parent = request.block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
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
        """Pre: ``0 <= num_blocks <= free`` (``ValueError``). Post: the first ``num_blocks`` of
        the queue, each with its cache entry dropped (lazy eviction) and ``ref_cnt == 1``."""
        if num_blocks < 0:
            raise InvalidArgument(f"cannot get a negative number of blocks ({num_blocks})")
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        taken = self.free_block_queue.popleft_n(num_blocks)
        for block in taken:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            if block.ref_cnt != 0:
                raise AssertionError(f"free block {block.block_id} has ref_cnt {block.ref_cnt}")
            block.ref_cnt = 1
        return taken

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Post: ``block`` is out of the map and has no hash; ``True`` (and a ``BlockRemoved``
        event) iff its map entry was removed."""
        key = block.block_hash
        if key is None:
            return False
        removed = self.cached_block_hash_to_block.pop(key, block.block_id) is not None
        block.reset_hash()
        if removed and self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved([get_block_hash(key)], _group(key)))
        return removed

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Post: each block gains one reference; a free one leaves the queue (a prefix hit takes
        a cached free block back). The null block is skipped (0.33; its count is meaningless)."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Pre: no block would drop below 0 references (``DoubleFreeError``, nothing changes).
        Post: one reference fewer per occurrence; blocks reaching 0 join the queue once, in the
        order given — ``unhashed_first``: unhashed ones at the head, hashed ones at the tail;
        ``classic``: all at the tail. The null block is skipped."""
        ordered = [b for b in ordered_blocks if not b.is_null]
        over = sorted(b.block_id for b, n in Counter(ordered).items() if n > b.ref_cnt)
        if over:
            raise DoubleFreeError(f"blocks {over} would be freed more often than referenced")
        unhashed: list[KVCacheBlock] = []
        hashed: list[KVCacheBlock] = []
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                cached = block.block_hash is not None and self.enable_caching
                (hashed if cached or self.free_order == "classic" else unhashed).append(block)
        self.free_block_queue.prepend_n(unhashed)
        self.free_block_queue.append_n(hashed)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Pre: every id in ``[0, N)`` (``UnknownBlockId``, nothing changes). Post: the given
        blocks are no longer cached (reference counts and the queue untouched)."""
        ids = list(block_ids)
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.num_gpu_blocks]
        if bad:
            raise UnknownBlockId(f"Invalid block ids {bad}: the pool has {self.num_gpu_blocks}")
        for block_id in ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """``False`` (no change) while any block but the null block is held; else every hash
        and map entry goes, one ``AllBlocksCleared`` event, ``True``."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """``1 - free / (N - 1)``: the null block counts neither as free nor as usable."""
        usable = self.num_gpu_blocks - 1
        return 0.0 if not usable else 1.0 - self.get_num_free_blocks() / usable

    def take_events(self) -> list[KVCacheEvent]:
        """The pending events, oldest first; the queue is emptied (``[]`` with events off)."""
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events


def _group(key: BlockHashWithGroupId) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)
