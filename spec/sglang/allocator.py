"""SGLang's KV-slot allocators as lists (docs/sglang.md §1).

Slots are the rows of the KV pool; slot 0 (page 0) is reserved for padded tokens and never handed
out. ``TokenToKVPoolAllocator`` hands out single slots from the head of its free list and appends
freed ones at the tail (FIFO reuse). ``PagedTokenToKVPoolAllocator`` keeps a list of free *pages*
(page ``p`` is slots ``p*page_size .. p*page_size+page_size-1``), hands out from the head and puts
freed pages back at the head (LIFO reuse). Both model ``need_sort=False``.

Upstream validates nothing on ``free``: a slot freed twice is listed twice, an id past the pool is
listed too (§1.3). The spec rejects both before changing anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from spec.errors import DoubleFreeError, InvalidArgument, InvalidPageId


class TokenToKVPoolAllocator:
    """Page size 1: the free list holds slot ids ``1..size`` (§1.1)."""

    page_size = 1

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InvalidArgument(f"pool size must be positive, got {size}")
        self.size = size
        self.free_pages: list[int] = list(range(1, size + 1))

    @property
    def num_pages(self) -> int:
        return self.size

    def available_size(self) -> int:
        """Free slots (pages times page size)."""
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> list[int] | None:
        """Post: the first ``need_size`` free slots, in free-list order, leave the list; ``None``
        (nothing changes) when fewer are free."""
        if need_size < 0:
            raise InvalidArgument(f"need_size must be >= 0, got {need_size}")
        if need_size > len(self.free_pages):
            return None
        out = self.free_pages[:need_size]
        del self.free_pages[:need_size]
        return out

    def _pages_of(self, slots: Sequence[int]) -> list[int]:
        """The pages ``slots`` cover; validates first (no page out of range or already free)."""
        pages = [s // self.page_size for s in slots]
        for s, p in zip(slots, pages, strict=True):
            if not 1 <= p <= self.num_pages:
                raise InvalidPageId(f"slot {s} is outside the pool (page {p})")
            if p in self.free_pages:
                raise DoubleFreeError(f"slot {s} is already free")
        return pages

    def free(self, free_index: Sequence[int]) -> None:
        """Pre: every slot is in use (``DoubleFreeError``, ``InvalidPageId``; nothing changes).
        Post: the slots are appended to the free list in the given order (§1.1)."""
        pages = self._pages_of(free_index)
        if len(set(pages)) < len(pages):
            raise DoubleFreeError(f"a slot is freed twice in one call: {list(free_index)}")
        self.free_pages += pages

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        """A page-aligned piece of one request's row (``start_pos`` its position): ``free``."""
        self.free(free_index)


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    """Page size > 1: the free list holds page ids ``1..size // page_size`` (§1.2)."""

    def __init__(self, size: int, page_size: int) -> None:
        if page_size < 2:
            raise InvalidArgument(f"a paged allocator needs page_size >= 2, got {page_size}")
        super().__init__(size)
        self.page_size = page_size
        self.free_pages = list(range(1, size // page_size + 1))

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    def _slots(self, page: int) -> list[int]:
        return [page * self.page_size + i for i in range(self.page_size)]

    def alloc(self, need_size: int) -> list[int] | None:
        """Post: ``need_size // page_size`` whole pages from the head, as slots (§1.2)."""
        if need_size < 0:
            raise InvalidArgument(f"need_size must be >= 0, got {need_size}")
        n = need_size // self.page_size
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
        if (seq_len - 1) % self.page_size:
            return [last_loc + 1]
        if not self.free_pages:
            return None
        return [self.free_pages.pop(0) * self.page_size]

    def free(self, free_index: Sequence[int]) -> None:
        """Post: the distinct pages of the slots go to the head of the list, ascending."""
        pages = sorted(set(self._pages_of(free_index)))
        self.free_pages[:0] = pages

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        """Pre: ``start_pos`` is page aligned and the slots are a row piece (one slot per position).
        Post: the page of every ``page_size``-th slot goes to the head, in that order (§1.2)."""
        if start_pos % self.page_size:
            raise InvalidArgument(f"segment start {start_pos} is not page aligned")
        pages = self._pages_of(list(free_index)[:: self.page_size])
        if len(set(pages)) < len(pages):
            raise DoubleFreeError(f"a page is freed twice in one call: {list(free_index)}")
        self.free_pages[:0] = pages


def make_allocator(size: int, page_size: int) -> TokenToKVPoolAllocator:
    """The allocator SGLang picks for ``page_size``."""
    if page_size == 1:
        return TokenToKVPoolAllocator(size)
    return PagedTokenToKVPoolAllocator(size, page_size)
