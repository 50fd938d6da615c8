"""The single-type managers of vLLM's KV cache groups — the executable spec: full attention
(every block kept), a sliding window and chunked local attention (blocks wholly before the
attention span of the next token become the null block and are freed). Upstream's
``single_type_kv_cache_manager.py``; the coordinator and the manager that drive them are in
:mod:`spec.vllm.kv_cache_manager` (docs/vllm-hybrid-groups.md §2).

Every rule is written once, in :class:`FullAttentionManager`, over ``get_num_skipped_tokens``
(0 for full attention, so there the window rules are no-ops); the other managers only say how
many tokens they skip and how they find a hit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from spec.errors import RequestStateError
from spec.vllm.block_pool import BlockHash, BlockPool, KVCacheBlock


class Request(Protocol):
    """What a manager reads of a request (``spec.vllm.kv_cache_manager.Request`` has it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def block_hashes(self) -> Sequence[BlockHash]: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...
    @property
    def num_prompt_tokens(self) -> int: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- one group
class FullAttentionManager:
    """The blocks of each request (``req_to_blocks``) and how many of them are cached
    (``num_cached_block``, only for requests that cached or adopted blocks)."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int = 0
    ) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.kv_cache_group_id = group_id
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens attention no longer reads (none for full attention)."""
        return 0

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The cached blocks of the longest cached prefix of at most ``max_length`` tokens
        (whole blocks; with eagle the last hit is dropped so that it is recomputed)."""
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            cached = self.block_pool.get_cached_block(block_hash, [self.kv_cache_group_id])
            if cached is None:
                break
            hits.append(cached[0])
        return hits[:-1] if self.use_eagle and hits else hits

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int = 0,
        main_tokens: int | None = None,
    ) -> int:
        """Blocks ``get_new_blocks`` and ``touch`` will take from the free queue to give the
        request ``num_tokens`` slots: missing blocks, plus the free blocks among the hits — for a
        new request, those wholly before an attention window (``get_num_skipped_tokens`` of
        ``total_computed_tokens``) neither needed nor taken. (``main_tokens``, the slots less
        the lookahead ones, is what a Mamba group counts.)"""
        needed = cdiv(num_tokens, self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(needed - held, 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        missing = max(needed - max(skipped, len(new_computed_blocks) + held), 0)
        kept = new_computed_blocks[max(0, skipped - held) :]
        return missing + sum(1 for b in kept if b.ref_cnt == 0 and not b.is_null)

    def add_local_computed_blocks(
        self, request_id: str, hits: Sequence[KVCacheBlock], total_computed_tokens: int = 0
    ) -> None:
        """Pre: the request holds no block. Post: null blocks for the hits wholly before an
        attention window (none for full attention), then the other hits (one more reference
        each), all counted as cached."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        if req_blocks:
            raise RequestStateError(f"request {request_id} already holds blocks")
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = hits[skipped:]
        if self.block_pool.enable_caching:
            self.block_pool.touch(kept)
        req_blocks.extend([self.block_pool.null_block] * skipped)
        req_blocks.extend(kept)
        self.num_cached_block[request_id] = len(req_blocks)

    def allocate_external_computed_blocks(
        self, request_id: str, num_total_tokens: int, num_external_tokens: int
    ) -> None:
        """Pre: every group's hits were touched (#33775). Post: the request holds
        ``cdiv(num_total_tokens, block_size)`` blocks — taken only if some external token is
        still inside the attention span of the next token."""
        skipped = self.get_num_skipped_tokens(num_total_tokens)
        if skipped > 0:
            num_external_tokens = min(num_total_tokens - skipped, num_external_tokens)
        if num_external_tokens <= 0:
            return
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        needed = max(0, cdiv(num_total_tokens, self.block_size) - len(req_blocks))
        req_blocks.extend(self.block_pool.get_new_blocks(needed))

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, main_tokens: int | None = None
    ) -> list[KVCacheBlock]:
        """Post: the request holds at least ``cdiv(num_tokens, block_size)`` blocks; the new ones."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        missing = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if missing <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(missing)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Post: the request's full blocks among its first ``num_tokens`` tokens are cached, from
        where the last call stopped (``num_cached_block``)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        blocks = self.req_to_blocks.setdefault(rid, [])
        self.block_pool.cache_full_blocks(
            request, blocks, num_cached, num_full, self.block_size, self.kv_cache_group_id,
            self.cache_mask(num_full - num_cached),
        )  # fmt: skip
        self.num_cached_block[rid] = num_full

    def cache_mask(self, count: int) -> list[bool] | None:
        """Which of ``count`` newly full blocks can ever serve a hit (``None``: all of them)."""
        return None

    def new_step_starts(self) -> None:
        """A scheduler step begins (only a Mamba group keeps per-step state)."""

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """The request's blocks in allocation order after its leading null blocks, forgotten
        (``[]`` for an unknown id)."""
        self.num_cached_block.pop(request_id, None)
        blocks = self.req_to_blocks.pop(request_id, [])
        skip = 0
        while skip < len(blocks) and blocks[skip].is_null:
            skip += 1
        return blocks[skip:]

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Post: the request's blocks wholly before the attention span of its next token
        (``get_num_skipped_tokens``) are null blocks; the ones nulled now are freed in one call,
        last first (quirk *skip-creates-entry*: with tokens to skip, an id without blocks gets
        an empty list, as upstream's ``defaultdict``)."""
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        blocks = self.req_to_blocks.setdefault(request_id, [])
        freed: list[KVCacheBlock] = []
        for i in range(min(skipped // self.block_size, len(blocks)) - 1, -1, -1):
            if blocks[i].is_null:
                break  # the earlier ones were nulled by an earlier step
            freed.append(blocks[i])
            blocks[i] = self.block_pool.null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks of the request referenced by every request holding blocks (quirk
        *common-prefix-creates-entry*: an unknown id gets an empty entry)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        count = 0
        for block in blocks:
            if block.ref_cnt != len(self.req_to_blocks):
                break
            count += 1
        return count


class SlidingWindowManager(FullAttentionManager):
    """A sliding-window group (window ``W`` tokens; docs/vllm-hybrid-groups.md §2.1): a token
    attends to the ``W - 1`` before it, so the blocks wholly before that are replaced in the
    request's list by the null block and freed (:meth:`remove_skipped_blocks`), and a prefix hit
    needs only the last ``cdiv(W - 1, block_size)`` blocks before its end to be cached (the
    earlier positions are null blocks)."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int, window: int
    ) -> None:
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.sliding_window = window

    def contiguous_blocks_for_hit(self, drop_eagle: bool) -> int:
        """Cached blocks a hit needs before its end (one more when EAGLE drops the last)."""
        return cdiv(self.sliding_window - 1, self.block_size) + (1 if drop_eagle else 0)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def find_window_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, drop_eagle: bool
    ) -> list[KVCacheBlock]:
        """The longest prefix of at most ``max_length`` tokens whose last ``need`` blocks are
        cached, as null blocks then those blocks; found scanning from the end. Without such a
        run, the cached run that starts at block 0 (possibly empty) is the hit. EAGLE then drops
        the last block."""
        need = self.contiguous_blocks_for_hit(drop_eagle)
        null = self.block_pool.null_block
        found: list[KVCacheBlock] = [null] * (max_length // self.block_size)
        run = 0
        for i in range(len(found) - 1, -1, -1):
            cached = self.block_pool.get_cached_block(block_hashes[i], [self.kv_cache_group_id])
            if cached is None:
                run = 0
                continue
            found[i] = cached[0]
            run += 1
            if run >= need:
                del found[i + run :]
                break
        else:
            del found[run:]
        if drop_eagle and found:
            found.pop()
        return found

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, drop_eagle: bool
    ) -> list[KVCacheBlock]:
        """The coordinator's lookup of this group (:meth:`find_window_hit`)."""
        return self.find_window_hit(block_hashes, max_length, drop_eagle)

    def cache_mask(self, count: int) -> list[bool] | None:
        """With a window of one token no hit can use a block (it needs none before its end):
        every block is masked out (the event, empty, still comes)."""
        return None if self.contiguous_blocks_for_hit(self.use_eagle) >= 1 else [False] * count


class ChunkedLocalAttentionManager(FullAttentionManager):
    """A chunked-local group (chunks of ``C`` tokens; docs/vllm-hybrid-groups.md §2): a token
    attends only to the tokens of its own chunk, so every block wholly before the current chunk
    is replaced by the null block and freed, and a hit is null blocks up to the chunk start of
    its end, then the cached blocks from there (left to right, up to the first miss)."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int, chunk: int
    ) -> None:
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.attention_chunk_size = chunk

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, drop_eagle: bool
    ) -> list[KVCacheBlock]:
        """Pre: no EAGLE drop (upstream asserts it; kvspec refuses the configuration). Post:
        null blocks for the blocks wholly before the chunk that holds token ``max_length``,
        then the cached blocks from there up to ``max_length // block_size``, stopping at the
        first miss."""
        assert not drop_eagle, "chunked local attention has no EAGLE drop"
        start = self.get_num_skipped_tokens(max_length) // self.block_size
        found = [self.block_pool.null_block] * start
        for i in range(start, max_length // self.block_size):
            cached = self.block_pool.get_cached_block(block_hashes[i], [self.kv_cache_group_id])
            if cached is None:
                break
            found.append(cached[0])
        return found


class MambaManager(FullAttentionManager):
    """A Mamba group in 0.34's ``"align"`` mode, with no speculative blocks and no prefill
    checkpoints, of full attention's block size (docs/vllm-hybrid-groups.md §2.2): each step
    writes the state of its last token into one new block at the end of the request's list
    (the positions before it padded with the null block); the state block of the step before
    is freed one step later, when the next step no longer reads it. A hit is the last cached
    block of the prefix alone, behind null blocks.

    Quirks reproduced: *count-creates-entry* (counting blocks adds an empty list for an unknown
    request, upstream's ``defaultdict``); *same-step-refusal* (a hit whose last block was cached
    in the current step counts as more blocks than the pool has, so the admission waits for
    the next step, :meth:`new_step_starts`); a negative count (a list longer than needed)
    lowers the total of the other groups."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int
    ) -> None:
        super().__init__(block_pool, block_size, use_eagle, group_id)
        self.last_state_block_idx: dict[str, int] = {}  # the state block of the step before
        self.num_retired_blocks: dict[str, int] = {}  # positions already nulled, from the left
        self.allocated_block_reqs: set[str] = set()  # requests that allocated at least once
        self.cached_blocks_this_step: set[BlockHash] = set()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1  # only the last computed token's state is read

    def local_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int, drop_eagle: bool
    ) -> list[KVCacheBlock]:
        """The last cached block among the first ``max_length // block_size``, found scanning
        from the end, behind null blocks (no EAGLE drop: draft models have no Mamba layers)."""
        for i in range(max_length // self.block_size - 1, -1, -1):
            cached = self.block_pool.get_cached_block(block_hashes[i], [self.kv_cache_group_id])
            if cached is not None:
                return [self.block_pool.null_block] * i + [cached[0]]
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int = 0,
        main_tokens: int | None = None,
    ) -> int:
        """Blocks the step takes: at most one new state block (the list is padded with null
        blocks up to it; lookahead slots get none), plus the free blocks among the hits."""
        hits = new_computed_blocks
        if hits and hits[-1].block_hash in self.cached_blocks_this_step:
            return self.block_pool.num_gpu_blocks + 1
        tokens = num_tokens if main_tokens is None else main_tokens
        held = len(self.req_to_blocks.setdefault(request_id, []))
        new = cdiv(tokens, self.block_size) - len(hits) - held
        return min(new, 1) + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, main_tokens: int | None = None
    ) -> list[KVCacheBlock]:
        """Post: the list reaches ``cdiv(main_tokens, block_size)`` entries: null blocks, then
        one new state block; returns the entries added (nulls included). The block that held
        the state so far is remembered, to be freed by :meth:`remove_skipped_blocks`."""
        tokens = num_tokens if main_tokens is None else main_tokens
        blocks = self.req_to_blocks.setdefault(request_id, [])
        required = cdiv(tokens, self.block_size)
        if required <= len(blocks):
            self.allocated_block_reqs.add(request_id)
            return []
        prev = len(blocks)
        if request_id in self.allocated_block_reqs or prev > 0:
            self.last_state_block_idx[request_id] = prev - 1
        blocks.extend([self.block_pool.null_block] * max(0, required - 1 - prev))
        new = self.block_pool.get_new_blocks(required - len(blocks))
        added = blocks[prev:] + new
        blocks.extend(new)
        self.allocated_block_reqs.add(request_id)
        return added

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Post: every position before the last computed token's block is null (those not yet
        retired are walked last first, nulls skipped), and the state block of the step before
        is freed once a later block holds the state."""
        if num_computed_tokens - 1 > 0:
            blocks = self.req_to_blocks.setdefault(request_id, [])
            first = self.num_retired_blocks.get(request_id, 0)
            last = min((num_computed_tokens - 1) // self.block_size, len(blocks))
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if not blocks[i].is_null:
                        freed.append(blocks[i])
                        blocks[i] = self.block_pool.null_block
                if freed:
                    self.block_pool.free_blocks(freed)
                self.num_retired_blocks[request_id] = last
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(num_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks.setdefault(request_id, [])
            if not blocks[idx].is_null:
                self.block_pool.free_blocks([blocks[idx]])
                blocks[idx] = self.block_pool.null_block

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """As full attention's, then the prompt's last reusable state (the block ending at the
        last block boundary before the prompt's last token) is cached again if it lost its
        hash (a connector evicted it); the blocks cached now are remembered for the step."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        blocks = self.req_to_blocks.get(rid, [])
        boundary = (request.num_prompt_tokens - 1) // self.block_size * self.block_size
        idx = num_tokens // self.block_size - 1
        if (
            num_tokens > 0 and num_tokens % self.block_size == 0 and num_tokens == boundary
            and idx < len(blocks) and not blocks[idx].is_null and blocks[idx].block_hash is None
        ):  # fmt: skip
            self.block_pool.cache_full_blocks(
                request, blocks, idx, idx + 1, self.block_size, self.kv_cache_group_id
            )
            self.cached_blocks_this_step.add(blocks[idx].block_hash)  # type: ignore[arg-type]
        for block in blocks[before : self.num_cached_block.get(rid, 0)]:
            if not block.is_null and block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)


LocalManager = SlidingWindowManager | ChunkedLocalAttentionManager | MambaManager
GROUP_KINDS: tuple[str, ...] = ("sliding_window", "chunked_local", "mamba")
"""The further KV cache groups kvspec models, each with its size (window or chunk, tokens;
0 for Mamba, which has no span)."""


def local_manager(
    kind: str, size: int, block_pool: BlockPool, block_size: int, use_eagle: bool, group_id: int
) -> LocalManager:
    """The manager of a further group ``(kind, size)`` (kinds: :data:`GROUP_KINDS`)."""
    if kind == "sliding_window":
        return SlidingWindowManager(block_pool, block_size, use_eagle, group_id, size)
    if kind == "mamba":
        return MambaManager(block_pool, block_size, use_eagle, group_id)
    return ChunkedLocalAttentionManager(block_pool, block_size, use_eagle, group_id, size)
