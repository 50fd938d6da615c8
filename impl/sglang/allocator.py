"""SGLang's KV-slot allocators over deques with a free-page set (spec: spec/sglang/allocator.py).

``_free`` answers "is this page free or staged" and ``_pending`` "is a free of this page pending
in the open group", each in O(1), for the validate-first checks; relies on
``free_and_used_partition_pool``: ``_free`` holds exactly the pages of the deque and the staging
list, ``_pending`` exactly those the open group will release.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import chain, islice

from spec.errors import DoubleFreeError, InvalidArgument, InvalidPageId, NestedFreeGroup


class TokenToKVPoolAllocator:
    page_size = 1

    def __init__(self, size: int, need_sort: bool = False) -> None:
        if size < 1:
            raise InvalidArgument(f"pool size must be positive, got {size}")
        self.size = size
        self.need_sort = need_sort
        self.free_pages: deque[int] = deque(range(1, self.num_pages + 1))
        self._free = set(self.free_pages)
        self.staged_pages: list[int] = []
        self.free_group: list[int] | None = None
        self.free_page_ids_group: list[int] = []
        self._pending: set[int] = set()

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    def available_size(self) -> int:
        return (len(self.free_pages) + len(self.staged_pages)) * self.page_size

    def merge_and_sort_free(self) -> None:
        if self.staged_pages:
            self.free_pages = deque(sorted(chain(self.free_pages, self.staged_pages)))
            self.staged_pages = []

    def _take(self, n: int) -> list[int]:
        q, free = self.free_pages, self._free
        out = [q.popleft() for _ in range(n)]
        free.difference_update(out)
        return out

    def alloc(self, need_size: int) -> list[int] | None:
        if need_size < 0:
            raise InvalidArgument(f"need_size must be >= 0, got {need_size}")
        n = need_size // self.page_size
        if n > len(self.free_pages):
            self.merge_and_sort_free()
            if n > len(self.free_pages):
                return None
        pages = self._take(n)
        if self.page_size == 1:
            return pages
        ps = self.page_size
        return [p * ps + i for p in pages for i in range(ps)]

    def _check(self, pages: Sequence[int], slots: Sequence[int], dedup: bool = False) -> None:
        top, free, pending = self.num_pages, self._free, self._pending
        for s, p in zip(slots, pages, strict=True):
            if not 1 <= p <= top:
                raise InvalidPageId(f"slot {s} is outside the pool (page {p})")
            if p in free:
                raise DoubleFreeError(f"slot {s} is already free")
            if p in pending:
                raise DoubleFreeError(f"slot {s} is already freed in the open free group")
        if not dedup and len(set(pages)) < len(pages):
            raise DoubleFreeError(f"a page is freed twice in one call: {list(slots)}")

    def _release(self, pages: list[int]) -> None:
        if self.need_sort:
            self.staged_pages.extend(pages)
        else:
            self.free_pages.extend(pages)
        self._free.update(pages)

    def _defer(self, slots: list[int], pages: Sequence[int]) -> None:
        assert self.free_group is not None
        self.free_group.extend(slots)
        self._pending.update(pages)

    def free(self, free_index: Sequence[int]) -> None:
        pages = list(free_index)
        self._check(pages, pages)
        if self.free_group is not None:
            self._defer(pages, pages)
        else:
            self._release(pages)

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        self.free(free_index)

    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise NestedFreeGroup("free groups cannot be nested")
        self.free_group = []
        self.free_page_ids_group = []

    def _release_slots(self, slots: list[int]) -> None:
        """Releases the slots of a closed group (validated when they were deferred)."""
        self._release(slots)

    def free_group_end(self) -> None:
        slots, self.free_group = self.free_group, None
        self._pending.clear()
        if slots:
            self._release_slots(slots)
        if self.free_page_ids_group:
            self._release(self.free_page_ids_group)
            self.free_page_ids_group = []


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    def __init__(self, size: int, page_size: int, need_sort: bool = False) -> None:
        if page_size < 2:
            raise InvalidArgument(f"a paged allocator needs page_size >= 2, got {page_size}")
        self.page_size = page_size
        super().__init__(size, need_sort)

    def alloc_extend(self, prefix_len: int, seq_len: int, last_loc: int) -> list[int] | None:
        ps = self.page_size
        if not 0 <= prefix_len <= seq_len:
            raise InvalidArgument(f"need 0 <= prefix_len <= seq_len, got {prefix_len}, {seq_len}")
        if (seq_len - prefix_len) // ps + 2 > len(self.free_pages):  # upstream's upper bound
            self.merge_and_sort_free()
        first_new = -(-prefix_len // ps) * ps
        new_pages = -(-seq_len // ps) - -(-prefix_len // ps)
        if new_pages > len(self.free_pages):
            return None
        head = min(seq_len, first_new)
        out = list(range(last_loc + 1, last_loc + 1 + head - prefix_len))
        for page in self._take(new_pages):
            out.extend(range(page * ps, page * ps + ps))
        return out[: seq_len - prefix_len]

    def alloc_decode(self, seq_len: int, last_loc: int) -> list[int] | None:
        if seq_len < 1:
            raise InvalidArgument(f"seq_len must be >= 1, got {seq_len}")
        if not self.free_pages:
            self.merge_and_sort_free()
        if (seq_len - 1) % self.page_size:
            return [last_loc + 1]
        if not self.free_pages:
            return None
        return [self._take(1)[0] * self.page_size]

    def _release(self, pages: list[int]) -> None:
        if self.need_sort:
            self.staged_pages.extend(pages)
        else:
            self.free_pages.extendleft(reversed(pages))
        self._free.update(pages)

    def _release_slots(self, slots: list[int]) -> None:
        self._release(sorted({s // self.page_size for s in slots}))

    def free(self, free_index: Sequence[int]) -> None:
        slots = list(free_index)
        pages = [s // self.page_size for s in slots]
        self._check(pages, slots, dedup=True)
        if self.free_group is not None:
            self._defer(slots, pages)
        else:
            self._release_slots(slots)

    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        ps = self.page_size
        if start_pos % ps:
            raise InvalidArgument(f"segment start {start_pos} is not page aligned")
        reps = list(islice(free_index, 0, None, ps))
        pages = [s // ps for s in reps]
        self._check(pages, reps)
        if self.free_group is not None:
            self.free_page_ids_group.extend(pages)
            self._pending.update(pages)
        else:
            self._release(pages)
