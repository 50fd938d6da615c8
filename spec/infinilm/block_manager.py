"""InfiniLM v0.2.9c paged-KV ``BlockManager`` and ``MambaCacheManager`` — the executable spec.

Source of truth: docs/infinilm.md §1–§4, §8, §9 (legacy = upstream ``main@df1a1fd``,
believed identical to release ``270feb3`` for this module). Every return value, exception, the free
deque order, the used set's *history* (it drives eviction order) and the prefix index are
reproduced; so are the legacy quirks, each named where it happens:

* quirk A (§3.8): ``try_free_blocks`` evicts one page even when capacity already suffices;
* quirk B (§3.8): a failed reclamation still evicts every candidate (flushes the prefix cache);
* eviction order is the iteration order of the Python set ``used_block_ids`` (§9.3);
* the free deque is FIFO: ``popleft`` to allocate, ``append`` to return (§1.2);
* publishing never deduplicates: one hash may index several pages (§3.6, §9.8);
* ``free_blocks`` only decrements: released pages linger in ``used`` until evicted (§3.7, §9.4),
  and a failed release leaves the entries after the bad one decremented (§8.3);
* ``append_slot`` trusts the caller's table length (§9.19).

Where upstream silently misbehaves on bad input, kvspec is stricter (and says so with a specific
exception from :mod:`spec.errors`): an operation never *reads* page metadata outside
``[0, num_blocks)`` (upstream aliases negative ids to the end of the pool), counts must be
non-negative ints, publishing rejects duplicate pages, pages not in use and empty hashes, and a
truncation rejects duplicate page ids before mutating (upstream crashes half-way). Ids that an
operation only copies or uses in slot arithmetic are trusted, as upstream does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from spec.errors import (
    DoubleFreeError,
    InvalidArgument,
    InvalidPageId,
    OutOfBlocksError,
    PageStateError,
    RehashError,
    TableTooShort,
)
from spec.infinilm.kernels import legacy_reclaim
from spec.infinilm.prefix_cache import EMPTY_BLOCK_HASH
from spec.infinilm.snapshot import BlockManagerSnapshot, read_block_manager

__all__ = ["EMPTY_BLOCK_HASH", "Block", "BlockManager", "MambaCacheManager"]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``b > 0`` in integer arithmetic."""
    return (a + b - 1) // b


def check_count(name: str, value: int) -> None:
    """Raise unless ``value`` is a non-negative int (bool excluded)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")


class Block:
    """One physical KV page: id, live reference count (multiplicity counts) and prefix hash."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = EMPTY_BLOCK_HASH

    def reset(self) -> None:
        """On allocation: one reference, no hash."""
        self.ref_count = 1
        self.hash = EMPTY_BLOCK_HASH

    def free(self) -> None:
        """On deallocation: no reference, no hash."""
        self.ref_count = 0
        self.hash = EMPTY_BLOCK_HASH

    def __repr__(self) -> str:
        return f"Block(id={self.block_id}, ref={self.ref_count}, hash={self.hash.hex() or '-'})"


class BlockManager:
    """Pages with reference counts, a FIFO free deque, a used set and a prefix-hash index.

    Data model (upstream names): ``blocks`` (page metadata), ``free_block_ids`` (deque, initially
    ``0..N-1``), ``used_block_ids`` (set: live pages *and* unreferenced cached pages),
    ``hash_to_block_ids`` (hash -> set of pages; never an empty set).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        """Pre: both sizes are positive ints. Post: every page free, in id order; nothing indexed."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            check_count(name, value)
            if value == 0:
                raise InvalidArgument(f"{name} must be > 0, got 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.hash_to_block_ids: dict[bytes, set[int]] = {}

    # ----------------------------------------------------------------- helpers
    def snapshot(self) -> BlockManagerSnapshot:
        """All observable state (see :mod:`spec.infinilm.snapshot`)."""
        return read_block_manager(self)

    def _check_page_id(self, block_id: int) -> None:
        if not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise InvalidPageId(f"page id {block_id!r} is not in [0, {self.num_blocks})")

    def _slots(self, block_table: Sequence[int], start: int, stop: int) -> list[int]:
        """Physical slots of token indices ``[start, stop)`` through ``block_table``."""
        size = self.block_size
        return [block_table[t // size] * size + t % size for t in range(start, stop)]

    def _allocate_block(self) -> Block:
        """Pre: a free page exists. Post: the leftmost free page is used, ref 1, unhashed."""
        block = self.blocks[self.free_block_ids.popleft()]
        assert block.ref_count == 0, f"free page {block.block_id} has references"
        block.reset()
        self.used_block_ids.add(block.block_id)
        return block

    def _remove_block_hash(self, block: Block) -> None:
        """Drop ``block`` from the prefix index (its duplicate-hash peers stay indexed)."""
        if block.hash == EMPTY_BLOCK_HASH:
            return
        ids = self.hash_to_block_ids.get(block.hash)
        if ids is None or block.block_id not in ids:
            raise PageStateError(f"page {block.block_id} is missing from the prefix index")
        ids.remove(block.block_id)
        if not ids:
            del self.hash_to_block_ids[block.hash]
        block.hash = EMPTY_BLOCK_HASH

    def _deallocate_block(self, block_id: int) -> None:
        """Evict: Pre: ref 0 and used. Post: unindexed, unhashed, appended to the free deque."""
        block = self.blocks[block_id]
        assert block.ref_count == 0, f"page {block_id} evicted while referenced"
        self._remove_block_hash(block)
        block.free()
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    # -------------------------------------------------------- capacity queries
    def can_allocate(self, num_required_blocks: int) -> bool:
        """True iff at least ``num_required_blocks`` pages are on the free deque."""
        check_count("num_required_blocks", num_required_blocks)
        return len(self.free_block_ids) >= num_required_blocks

    def get_num_free_blocks(self) -> int:
        """Length of the free deque (understates capacity: cached pages are not counted)."""
        return len(self.free_block_ids)

    def get_total_usable_blocks(self) -> int:
        """Free pages plus unreferenced used pages (legacy: a full scan of ``used``)."""
        unreferenced = sum(1 for i in self.used_block_ids if self.blocks[i].ref_count == 0)
        return len(self.free_block_ids) + unreferenced

    # -------------------------------------------------------- prefix lookup
    def get_computed_blocks(
        self, block_hashes: Sequence[bytes], max_cache_hit_tokens: int
    ) -> tuple[list[int], int]:
        """Pin the longest indexed prefix of ``block_hashes`` (reference §3.1).

        Pre: none (a negative cap means no hit). Post: at most ``max(0, cap) // B`` leading hashes
        are looked up, stopping at the first miss; each hit pins (ref += 1, also 0 -> 1 for cached
        pages) the *first* page of its index set in iteration order. Returns the pinned table and
        ``len(table) * B`` hit tokens. The scheduler passes ``P - 1`` (the P-1 hit cap, §9.7).
        """
        max_hit = min(len(block_hashes), max(0, max_cache_hit_tokens) // self.block_size)
        table: list[int] = []
        for i in range(max_hit):
            ids = self.hash_to_block_ids.get(block_hashes[i])
            if not ids:
                break  # longest consecutive prefix only
            block_id = next(iter(ids))  # duplicate-hash pages: first in set order wins
            assert self.blocks[block_id].hash == block_hashes[i] and block_id in self.used_block_ids
            self.blocks[block_id].ref_count += 1
            table.append(block_id)
        return table, len(table) * self.block_size

    # -------------------------------------------------------- allocation
    def allocate_slots(
        self,
        num_new_tokens: int,
        num_computed_tokens: int = 0,
        cached_block_table: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]] | None:
        """Prefill allocation (reference §3.2).

        Pre: counts are non-negative and ``num_computed_tokens >= len(cached) * B`` (validated
        first, no change on failure). Post: a *new* table = cached pages + fresh pages covering
        ``num_computed_tokens + num_new_tokens`` tokens, and the slots of the tokens from
        ``num_computed_tokens`` on. Returns ``None`` if pages cannot be found even after
        reclamation; evictions done by that reclamation stay done (quirk B) and the caller's pins
        are *not* released here.
        """
        check_count("num_new_tokens", num_new_tokens)
        check_count("num_computed_tokens", num_computed_tokens)
        table = list(cached_block_table or [])
        if num_computed_tokens < len(table) * self.block_size:
            raise InvalidArgument(
                f"num_computed_tokens={num_computed_tokens} is less than the "
                f"{len(table) * self.block_size} tokens of the {len(table)} cached pages"
            )
        total = num_computed_tokens + num_new_tokens
        need = ceil_div(total, self.block_size) - len(table)
        if not self.can_allocate(need) and not self.try_free_blocks(need):
            return None
        for _ in range(need):
            table.append(self._allocate_block().block_id)
        return table, self._slots(table, num_computed_tokens, total)

    def append_slot(self, block_table: list[int], num_tokens: int) -> tuple[list[int], int]:
        """Decode: the slot of token ``num_tokens - 1`` (reference §3.3).

        Pre: ``num_tokens >= 1``; the table is trusted to hold ``ceil((L-1)/B)`` pages (quirk,
        §9.19: not checked). Post: if token L-1 starts a page, one fresh page is appended *in
        place* (after reclaiming one if the free deque is empty). Raises ``OutOfBlocksError`` if no
        page can be found; evictions done on the way stay done.
        """
        check_count("num_tokens", num_tokens)
        if num_tokens == 0:
            raise InvalidArgument("num_tokens must be >= 1 (it counts the new token)")
        offset = (num_tokens - 1) % self.block_size
        if offset == 0:
            if not self.free_block_ids and not self.try_free_blocks(1):
                raise OutOfBlocksError("No available cache blocks")
            block_table.append(self._allocate_block().block_id)
        elif not block_table:
            raise TableTooShort(f"empty block table has no page for token {num_tokens - 1}")
        return block_table, block_table[-1] * self.block_size + offset

    def append_slots(
        self, block_table: list[int], start_num_tokens: int, num_slots: int
    ) -> tuple[list[int], list[int]]:
        """Speculative provisional slots (reference §3.4).

        Pre (validated first): ``num_slots >= 0``; if it is 0 nothing else is checked and the same
        list comes back with no slots; ``start_num_tokens >= 1`` and the table holds exactly
        ``ceil((start - 1) / B)`` pages. Post: fresh pages appended in place so that token indices
        ``[start - 1, start - 1 + num_slots)`` have pages; their slots are returned. Raises
        ``OutOfBlocksError`` if pages cannot be found (evictions stay done).
        """
        check_count("num_slots", num_slots)
        if num_slots == 0:
            return block_table, []
        if not isinstance(start_num_tokens, int) or start_num_tokens <= 0:
            raise InvalidArgument(f"start_num_tokens must be >= 1, got {start_num_tokens!r}")
        expected = (start_num_tokens + self.block_size - 2) // self.block_size
        if len(block_table) != expected:
            raise InvalidArgument(
                f"block table has {len(block_table)} pages, expected {expected} for "
                f"start_num_tokens={start_num_tokens}"
            )
        last = start_num_tokens + num_slots - 1
        add = max(ceil_div(last, self.block_size) - len(block_table), 0)
        if not self.can_allocate(add) and not self.try_free_blocks(add):
            raise OutOfBlocksError("No available cache blocks")
        for _ in range(add):
            block_table.append(self._allocate_block().block_id)
        return block_table, self._slots(block_table, start_num_tokens - 1, last)

    # -------------------------------------------------------- rollback, publish, release
    def _check_exclusive(self, block_id: int, role: str) -> None:
        """Truncation precondition: the page is in use, held once, and unhashed."""
        if not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise PageStateError(f"{role} page id {block_id!r} is not in [0, {self.num_blocks})")
        block = self.blocks[block_id]
        if block_id not in self.used_block_ids or block.ref_count != 1 or block.hash:
            raise PageStateError(
                f"cannot truncate {role} page {block_id}: it must be in use with ref_count 1 and "
                f"no prefix hash (in use={block_id in self.used_block_ids}, "
                f"ref_count={block.ref_count}, hashed={bool(block.hash)})"
            )

    def truncate_blocks(self, block_table: Sequence[int], keep_num_tokens: int) -> list[int]:
        """Speculative rollback to ``keep_num_tokens`` tokens (reference §3.5).

        Pre (all validated before any change): ``1 <= keep <= len(table) * B``; no page id repeats
        in the table; every discarded page and, if ``keep % B != 0``, the retained partial page are
        in use, held once and unhashed. Post: the discarded pages (in table order) go straight back
        to the free deque; returns a new list of the ``ceil(keep / B)`` kept pages. The input list
        is not changed.
        """
        check_count("keep_num_tokens", keep_num_tokens)
        if keep_num_tokens == 0 or keep_num_tokens > len(block_table) * self.block_size:
            raise InvalidArgument(
                f"keep_num_tokens={keep_num_tokens} is not in [1, {len(block_table) * self.block_size}]"
            )
        if len(set(block_table)) != len(block_table):  # upstream would crash half-way
            repeated = next(b for i, b in enumerate(block_table) if b in block_table[:i])
            raise PageStateError(f"page {repeated} appears twice in the block table")
        keep_blocks = ceil_div(keep_num_tokens, self.block_size)
        discarded = list(block_table[keep_blocks:])
        checked = (
            discarded
            if keep_num_tokens % self.block_size == 0
            else [block_table[keep_blocks - 1], *discarded]
        )
        for block_id in checked:
            self._check_exclusive(block_id, "discarded" if block_id in discarded else "retained")
        for block_id in discarded:
            self.blocks[block_id].ref_count = 0
            self._deallocate_block(block_id)
        return list(block_table[:keep_blocks])

    def publish_computed_blocks(
        self,
        block_table: Sequence[int],
        block_hashes: Sequence[bytes],
        start_block: int,
        num_computed_tokens: int,
    ) -> int:
        """Index the computed full pages ``[start_block, end)`` under their hashes (§3.6).

        ``end = min(num_computed_tokens // B, len(table), len(hashes))``.
        Pre (validated first, no change on failure): ``0 <= start_block <= end``; each page in the
        range is a valid id, appears once, is in use, is not hashed yet (``RehashError``), and its
        hash is non-empty. Post: each page carries its hash and is added to that hash's index set
        (never deduplicated: another page may already hold the hash). Returns ``end``.
        """
        end = min(num_computed_tokens // self.block_size, len(block_table), len(block_hashes))
        if not isinstance(start_block, int) or not 0 <= start_block <= end:
            raise InvalidArgument(f"start_block={start_block!r} is not in [0, {end}]")
        for i in range(start_block, end):
            block_id = block_table[i]
            self._check_page_id(block_id)
            if block_id in block_table[start_block:i]:
                raise InvalidArgument(f"page {block_id} appears twice in the published range")
            if block_id not in self.used_block_ids:
                raise PageStateError(f"cannot publish page {block_id}: it is not in use")
            if self.blocks[block_id].hash:
                raise RehashError(
                    f"page {block_id} is already published; cannot change its prefix hash"
                )
            if not isinstance(block_hashes[i], bytes) or not block_hashes[i]:
                raise InvalidArgument(f"block hash {i} must be non-empty bytes")
        for i in range(start_block, end):
            block_id, block_hash = block_table[i], block_hashes[i]
            self.blocks[block_id].hash = block_hash
            self.hash_to_block_ids.setdefault(block_hash, set()).add(block_id)
        return end

    def free_blocks(self, block_table: Sequence[int]) -> None:
        """Release one reference to each page of the table, last entry first (reference §3.7).

        Pages are *not* returned to the free deque: they stay in ``used`` (cached, hashed or not)
        until evicted. Not validated first (upstream asserts per page): a bad entry raises
        ``InvalidPageId`` or ``DoubleFreeError`` after the entries behind it were decremented.
        """
        for block_id in reversed(block_table):
            self._check_page_id(block_id)
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise DoubleFreeError(f"page {block_id} released with ref_count {block.ref_count}")
            block.ref_count -= 1

    def try_free_blocks(self, num_required: int) -> bool:
        """Evict unreferenced used pages until ``num_required`` are free (reference §3.8).

        Legacy algorithm (the pure kernel :func:`spec.infinilm.kernels.legacy_reclaim`): collect
        every ref-0 used page in set iteration order, then evict them one by one, testing capacity
        *after* each eviction. Hence quirk A (one page is evicted even if capacity already
        suffices, when a candidate exists) and quirk B (on failure every candidate has been
        evicted). Returns whether ``num_required`` pages are free at the end.
        """
        check_count("num_required", num_required)
        victims, enough = legacy_reclaim(
            self.used_block_ids, self.blocks, len(self.free_block_ids), num_required
        )
        for block_id in victims:  # quirk A: at least one if any; quirk B: all of them on failure
            self._deallocate_block(block_id)
        return enough

    def update_blocks_slot(
        self, block_table: Sequence[int], num_computed_tokens: int, total_tokens: int
    ) -> list[int]:
        """Slots of token indices ``[num_computed_tokens, total_tokens)`` (reference §3.9).

        Pre: non-negative counts; the table covers ``total_tokens`` when the range is non-empty.
        Post: no state change; ``[]`` when ``num_computed_tokens >= total_tokens``.
        """
        check_count("num_computed_tokens", num_computed_tokens)
        check_count("total_tokens", total_tokens)
        if num_computed_tokens >= total_tokens:
            return []
        if total_tokens > len(block_table) * self.block_size:
            raise TableTooShort(
                f"table of {len(block_table)} pages cannot map token {total_tokens - 1}"
            )
        return self._slots(block_table, num_computed_tokens, total_tokens)


ZERO_STATE_INDEX = 0


class MambaCacheManager:
    """Recurrent-state rows for hybrid models (reference §1.3); row 0 is a permanent zero state."""

    def __init__(self, num_blocks: int) -> None:
        """Pre: ``num_blocks >= 2``. Post: rows ``1..N-1`` free in order, none used."""
        check_count("num_blocks", num_blocks)
        if num_blocks < 2:
            raise InvalidArgument(f"num_blocks must be >= 2 (row 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_block_ids: deque[int] = deque(range(1, num_blocks))
        self.used_block_ids: set[int] = set()

    def can_allocate(self) -> bool:
        """True iff a row is free."""
        return bool(self.free_block_ids)

    def allocate(self) -> int | None:
        """The leftmost free row, now used; ``None`` when none is free."""
        if not self.free_block_ids:
            return None
        row = self.free_block_ids.popleft()
        self.used_block_ids.add(row)
        return row

    def free(self, block_id: int | None) -> None:
        """Return a used row to the right of the free deque; ``None``, 0 and unused ids are ignored."""
        if block_id is None or block_id == ZERO_STATE_INDEX or block_id not in self.used_block_ids:
            return
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def snapshot(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Free deque order and used set iteration order."""
        return tuple(self.free_block_ids), tuple(self.used_block_ids)
