"""SGLang's KV-slot allocators as lists (docs/sglang.md §1).

Slots are the rows of the KV pool; slot 0 (page 0) is reserved for padded tokens and never handed
out. ``TokenToKVPoolAllocator`` hands out single slots from the head of its free list and appends
freed ones at the tail (FIFO reuse). ``PagedTokenToKVPoolAllocator`` keeps a list of free *pages*
(page ``p`` is slots ``p*page_size .. p*page_size+page_size-1``), hands out from the head and puts
freed pages back at the head (LIFO reuse).

``need_sort=True`` (§1.5): released pages wait in ``staged_pages`` (upstream: the token
allocator's ``release_pages``, the paged one's ``staged_pages``), counted as available, and join
the free list, sorted, only when an allocation finds the list short. A *free group* (§1.4) defers
every free between ``free_group_begin`` and ``free_group_end``: ``free_group`` holds the slots
given to ``free``, ``free_page_ids_group`` (paged) the pages given to ``free_segment``.

Upstream validates nothing on ``free``: a slot freed twice is listed twice, an id past the pool is
listed too (§1.3). The spec rejects both before changing anything, and also a page freed while a
free of it is already pending in the open group.
"""

from __future__ import annotations

from collections.abc import Sequence

from spec.errors import DoubleFreeError, InvalidArgument, InvalidPageId, NestedFreeGroup


class TokenToKVPoolAllocator:
    """Page size 1: the free list holds slot ids ``1..size`` (§1.1)."""

    page_size = 1

    def __init__(self, size: int, need_sort: bool = False) -> None:
        if size < 1:
            raise InvalidArgument(f"pool size must be positive, got {size}")
        self.size = size
        self.need_sort = need_sort
        self.free_pages: list[int] = list(range(1, size + 1))
        self.staged_pages: list[int] = []  # need_sort: released, not yet merged
        self.free_group: list[int] | None = None  # None: no group open; else the deferred slots
        self.free_page_ids_group: list[int] = []  # deferred pages of free_segment (paged only)

    @property
    def num_pages(self) -> int:
        return self.size

    def available_size(self) -> int:
        """Free slots, staged ones included (pages times page size); pending frees are not."""
        return (len(self.free_pages) + len(self.staged_pages)) * self.page_size

    def merge_and_sort_free(self) -> None:
        """Post: if anything is staged, the free list is the sorted union of itself and the
        staged pages, and nothing is staged (§1.5)."""
        if self.staged_pages:
            self.free_pages = sorted(self.free_pages + self.staged_pages)
            self.staged_pages = []

    def alloc(self, need_size: int) -> list[int] | None:
        """Post: the first ``need_size`` free slots, in free-list order, leave the list; ``None``
        when fewer are free. A short list is merged with the staged pages first (§1.5)."""
        if need_size < 0:
            raise InvalidArgument(f"need_size must be >= 0, got {need_size}")
        if need_size > len(self.free_pages):
            self.merge_and_sort_free()  # (nothing is ever staged without need_sort)
        if need_size > len(self.free_pages):
            return None
        out = self.free_pages[:need_size]
        del self.free_pages[:need_size]
        return out

    def _pending_pages(self) -> set[int]:
        """The pages the open group will release (empty when none is open)."""
        if self.free_group is None:
            return set()
        return {s // self.page_size for s in self.free_group} | set(self.free_page_ids_group)

    def _pages_of(self, slots: Sequence[int]) -> list[int]:
        """The pages ``slots`` cover; validates first (no page out of range, already free or
        staged, or already pending in the open group)."""
        pages = [s // self.page_size for s in slots]
        free, pending = set(self.free_pages) | set(self.staged_pages), self._pending_pages()
        for s, p in zip(slots, pages, strict=True):
            if not 1 <= p <= self.num_pages:
                raise InvalidPageId(f"slot {s} is outside the pool (page {p})")
            if p in free:
                raise DoubleFreeError(f"slot {s} is already free")
            if p in pending:
                raise DoubleFreeError(f"slot {s} is already freed in the open free group")
        return pages

    def _release(self, pages: list[int]) -> None:
        """Pages back: staged with ``need_sort``, else at the tail of the free list."""
        if self.need_sort:
            self.staged_pages += pages
        else:
            self.free_pages += pages

    def free(self, free_index: Sequence[int]) -> None:
        """Pre: every slot is in use (``DoubleFreeError``, ``InvalidPageId``; nothing changes).
        Post: with a group open the slots are deferred; else released in the given order
        (§1.1)."""
        pages = self._pages_of(free_index)
        if len(set(pages)) < len(pages):
            raise DoubleFreeError(f"a slot is freed twice in one call: {list(free_index)}")
        if self.free_group is not None:
            self.free_group += free_index
        else:
            self._release(pages)

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        """A page-aligned piece of one request's row (``start_pos`` its position): ``free``."""
        self.free(free_index)

    def free_group_begin(self) -> None:
        """Pre: no group is open (``NestedFreeGroup``, nothing changes). Post: frees are
        deferred until ``free_group_end`` (§1.4)."""
        if self.free_group is not None:
            raise NestedFreeGroup("free groups cannot be nested")
        self.free_group = []
        self.free_page_ids_group = []

    def free_group_end(self) -> None:
        """Post: the group is closed and its deferred frees are released as one ``free`` of all
        the deferred slots, then (paged) the deferred pages in their order. Quirk: with no
        group open it does nothing (§1.4)."""
        if self.free_group is None:
            return  # legacy quirk: an unmatched end is a no-op, reference sglang.md §1.4
        slots, page_ids = self.free_group, self.free_page_ids_group
        self.free_group, self.free_page_ids_group = None, []
        if slots:
            self.free(slots)  # validated when deferred: still in use
        if page_ids:
            self._release(page_ids)


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    """Page size > 1: the free list holds page ids ``1..size // page_size`` (§1.2)."""

    def __init__(self, size: int, page_size: int, need_sort: bool = False) -> None:
        if page_size < 2:
            raise InvalidArgument(f"a paged allocator needs page_size >= 2, got {page_size}")
        super().__init__(size, need_sort)
        self.page_size = page_size
        self.free_pages = list(range(1, size // page_size + 1))

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    def _slots(self, page: int) -> list[int]:
        return [page * self.page_size + i for i in range(self.page_size)]

    def _release(self, pages: list[int]) -> None:
        """Pages back: staged with ``need_sort``, else at the head of the free list."""
        if self.need_sort:
            self.staged_pages += pages
        else:
            self.free_pages[:0] = pages

    def alloc(self, need_size: int) -> list[int] | None:
        """Post: ``need_size // page_size`` whole pages from the head, as slots (§1.2)."""
        if need_size < 0:
            raise InvalidArgument(f"need_size must be >= 0, got {need_size}")
        n = need_size // self.page_size
        if n > len(self.free_pages):
            self.merge_and_sort_free()
        if n > len(self.free_pages):
            return None
        pages = self.free_pages[:n]
        del self.free_pages[:n]
        return [s for p in pages for s in self._slots(p)]

    def alloc_extend(self, prefix_len: int, seq_len: int, last_loc: int) -> list[int] | None:
        """Slots for positions ``prefix_len..seq_len-1`` of one request whose slot at position
        ``prefix_len-1`` is ``last_loc`` (-1 for none). Positions in the partly filled last page
        continue it (``last_loc+1, …``); each later page takes a free page from the head in
        order. ``None`` (nothing changes) when the new pages are not free (§1.2)."""
        ps = self.page_size
        if not 0 <= prefix_len <= seq_len:
            raise InvalidArgument(f"need 0 <= prefix_len <= seq_len, got {prefix_len}, {seq_len}")
        # legacy quirk: the merge is decided on an upper bound (a batch of one request), so it
        # happens even when the exact need fits the list, reference sglang.md §1.5
        if (seq_len - prefix_len) // ps + 2 > len(self.free_pages):
            self.merge_and_sort_free()
        first_new = -(-prefix_len // ps) * ps  # the first position on a new page
        new_pages = -(-seq_len // ps) - -(-prefix_len // ps)
        if new_pages > len(self.free_pages):
            return None
        out = []
        for pos in range(prefix_len, seq_len):
            if pos < first_new:
                out.append(last_loc + 1 + pos - prefix_len)
            else:
                out.append(self.free_pages[(pos - first_new) // ps] * ps + pos % ps)
        del self.free_pages[:new_pages]
        return out

    def alloc_decode(self, seq_len: int, last_loc: int) -> list[int] | None:
        """The slot of position ``seq_len-1``: ``last_loc+1``, or the head page's first slot when
        the position starts a page (``None`` when no page is free)."""
        if seq_len < 1:
            raise InvalidArgument(f"seq_len must be >= 1, got {seq_len}")
        # legacy quirk: an empty list is merged even when this position needs no new page,
        # reference sglang.md §1.5
        if not self.free_pages:
            self.merge_and_sort_free()
        if (seq_len - 1) % self.page_size:
            return [last_loc + 1]
        if not self.free_pages:
            return None
        return [self.free_pages.pop(0) * self.page_size]

    def free(self, free_index: Sequence[int]) -> None:
        """Post: deferred with a group open; else the distinct pages of the slots are released,
        ascending (to the head of the list)."""
        pages = self._pages_of(free_index)
        if self.free_group is not None:
            self.free_group += free_index
        else:
            self._release(sorted(set(pages)))

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        """Pre: ``start_pos`` is page aligned and the slots are a row piece (one slot per position).
        Post: the page of every ``page_size``-th slot is released in that order, or deferred to
        ``free_page_ids_group`` with a group open (§1.2)."""
        if start_pos % self.page_size:
            raise InvalidArgument(f"segment start {start_pos} is not page aligned")
        pages = self._pages_of(list(free_index)[:: self.page_size])
        if len(set(pages)) < len(pages):
            raise DoubleFreeError(f"a page is freed twice in one call: {list(free_index)}")
        if self.free_group is not None:
            self.free_page_ids_group += pages
        else:
            self._release(pages)


def make_allocator(size: int, page_size: int, need_sort: bool = False) -> TokenToKVPoolAllocator:
    """The allocator SGLang picks for ``page_size``."""
    if page_size == 1:
        return TokenToKVPoolAllocator(size, need_sort)
    return PagedTokenToKVPoolAllocator(size, page_size, need_sort)
