"""Planted bugs in the SGLang radix-cache impl (``RadixCache`` + its KV-slot allocators).

Each mutant is a small subclass of an impl class — never an edit of the impl source — that
reproduces a bug from SGLang's history (or from a port of SGLang's radix cache) in the part of the
cache this component models: lock-reference leaks, eviction of locked nodes, split bookkeeping,
page-size off-by-ones and double frees; its docstring names the origin. The registry attaches
:data:`RADIX_CACHE_MUTANTS` to the component.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import chain
from typing import Any

from impl.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from impl.sglang.radix_cache import RadixCache, TreeNode
from stateful_tests.checker import Mutant


class SplitForgetsLockRef(RadixCache):
    """Split bookkeeping: the new upper node of a split starts unlocked while the lower half keeps
    its holders. SGLang PR #38480 fixed this for HiCache's host lock ("host_lock_ref wasn't
    propagated during splits"); here for the device lock: the upper half counts as evictable
    while a request still holds it."""

    def _split(self, child: TreeNode, cut: int, t: int) -> TreeNode:
        upper = super()._split(child, cut, t)
        if upper.lock_ref:
            self.evictable_size_ += len(upper.key)
            self.protected_size_ -= len(upper.key)
            upper.lock_ref = 0
        return upper


class MatchWithoutSplit(RadixCache):
    """A match that ends inside a node returns that whole node instead of splitting it, so the
    lock a request takes pins more than it matched — the lock-reference leak of the Rust port of
    SGLang's ``RadixCache`` (bytedance-iaas/sglang PR #508, "Fix Radix Cache Prefix Match Lock
    Leak")."""

    def match_prefix(self, key: Sequence[int]) -> tuple[list[int], Any]:
        ps = self.page_size
        k = tuple(key[: len(key) // ps * ps])
        if not k:
            return [], self.root_node
        t, node, pos = self._tick(), self.root_node, 0
        while pos < len(k):
            child = node.children.get(k[pos : pos + ps])
            if child is None:
                break
            child.last_access_time = t
            n = 0
            while n < min(len(child.key), len(k) - pos) and child.key[n] == k[pos + n]:
                n += 1
            n = n // ps * ps
            if n < len(child.key):
                return self.path_slots(node) + child.value[:n], child  # no split
            pos, node = pos + n, child
        return self.path_slots(node), node


class LockSkipsAnchor(RadixCache):
    """``inc_lock_ref`` steps to the parent before locking, so the matched node itself stays
    unlocked and evictable (mini-sglang PR #52, "Missed lock/unlock of current node in
    RadixCacheManager")."""

    def inc_lock_ref(self, node: Any) -> int:
        if node is self.root_node or node.parent is None:
            return super().inc_lock_ref(node)
        delta = super().inc_lock_ref(node.parent)
        return delta


class EvictsLockedParent(RadixCache):
    """Eviction of a locked node: a parent left childless joins the eviction heap whatever its
    lock count. SGLang PR #28161 fixed the same class of fault in the unified cache's cascade
    eviction ("Full-locked leaves stranded in the SWA LRU … assert cd.lock_ref == 0 fires")."""

    def evict(self, num_tokens: int) -> int:
        saved = [(n, n.lock_ref) for n in self._locked_nodes()]
        for n, _ in saved:
            n.lock_ref = 0  # the heap starts right; the childless-parent check now reads 0
        try:
            return super().evict(num_tokens)
        finally:
            for n, ref in saved:
                n.lock_ref = ref

    def _locked_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root_node.children.values())
        while stack:
            n = stack.pop()
            if n.lock_ref:
                out.append(n)
            stack += n.children.values()
        return out


class UnlockMovesSizesEveryTime(RadixCache):
    """Size accounting: ``dec_lock_ref`` moves a node's tokens from protected to evictable on
    every release, not only on the last one (SGLang PR #10637, "radix cache memory accounting":
    the evictable counter drifted from the tree)."""

    def dec_lock_ref(self, node: Any) -> int:
        n, extra = node, 0
        while n is not self.root_node and n is not None:
            if n.lock_ref > 1:
                extra += len(n.key)
            n = n.parent
        delta = super().dec_lock_ref(node)
        self.evictable_size_ += extra
        self.protected_size_ -= extra
        return delta + extra


class NoUnderflowCheck(RadixCache):
    """SGLang 0.5.23's own ``dec_lock_ref``: no check that the node is locked, so a double
    unlock leaves ``lock_ref = -1`` (kvspec's audit of the real release, docs/getting-started.md;
    mllm PR #656's review of a copy of SGLang's cache). Reached by the bad-input alphabet only."""

    def dec_lock_ref(self, node: Any) -> int:
        n, delta = self._known(node), 0
        while n is not self.root_node:
            if n.lock_ref == 1:
                self.evictable_size_ += len(n.key)
                self.protected_size_ -= len(n.key)
                delta += len(n.key)
                if not n.children:
                    self.evictable_leaves.add(n)
            n.lock_ref -= 1
            n = n.parent  # type: ignore[assignment]  # below the root: never None
        return delta


class _SlotwisePageFree(PagedTokenToKVPoolAllocator):
    def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
        pages = [s // self.page_size for s in free_index]  # one page per slot: no dedup
        self.free_pages.extendleft(reversed(pages))
        self._free.update(pages)


class PageFreedOncePerSlot(RadixCache):
    """Double free with pages: freeing a row piece releases the page of every slot, so a page
    goes back ``page_size`` times (the duplicate pages behind SGLang's page-granular free path,
    RFC PR #13023, and the ``page_size > 1`` leak reports, issue #7130)."""

    paged_allocator_cls = _SlotwisePageFree


class _DecodeNewPageOffByOne(PagedTokenToKVPoolAllocator):
    def alloc_decode(self, seq_len: int, last_loc: int) -> list[int] | None:
        return super().alloc_decode(seq_len - 1, last_loc - 1) if seq_len > 1 else None


class DecodePageBoundaryOffByOne(RadixCache):
    """Page-size off-by-one: decode opens a new page one token late (tests ``seq_len %
    page_size == 0`` where ``(seq_len - 1) % page_size == 0`` is meant), writing past the
    request's last page — the decode case of SGLang's ``get_num_new_pages`` (``seq_lens %
    page_size == 1``), whose paged-decode accounting issue #7130 reports leaking."""

    paged_allocator_cls = _DecodeNewPageOffByOne


class _GroupEndKeepsPageIds(PagedTokenToKVPoolAllocator):
    def free_group_end(self) -> None:
        page_ids = self.free_page_ids_group
        super().free_group_end()
        self.free_page_ids_group = page_ids  # the list is left as it was


class GroupEndKeepsPending(RadixCache):
    """Planted (issue 30): the paged allocator's ``free_group_end`` releases the pages deferred
    by ``free_segment`` but does not empty their list, so a second ``free_group_end`` (which
    upstream allows with no group open) releases the same pages again — a double free; the
    hazard the release's own debug check after a group names ("the no-double-free contract can
    only break across a group's calls")."""

    paged_allocator_cls = _GroupEndKeepsPageIds


def _merge_keeping_staging(a: TokenToKVPoolAllocator) -> None:
    if a.staged_pages:
        a.free_pages = deque(sorted(chain(a.free_pages, a.staged_pages)))  # staging not emptied


class _TokenMergeKeepsStaging(TokenToKVPoolAllocator):
    def merge_and_sort_free(self) -> None:
        _merge_keeping_staging(self)


class _PagedMergeKeepsStaging(PagedTokenToKVPoolAllocator):
    def merge_and_sort_free(self) -> None:
        _merge_keeping_staging(self)


class MergeKeepsStaging(RadixCache):
    """Planted (issue 30): ``need_sort``'s merge sorts the staged pages into the free list but
    leaves them staged, so they are counted twice as available and listed twice at the next
    merge (the paged allocator keeps a staged list and its count side by side, and a merge must
    reset both)."""

    token_allocator_cls = _TokenMergeKeepsStaging
    paged_allocator_cls = _PagedMergeKeepsStaging


RADIX_CACHE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("split_forgets_lock_ref", "SGLang PR #38480 (split lock propagation)",
           SplitForgetsLockRef, "referenced_count_matches_live_pages"),
    Mutant("match_without_split", "bytedance-iaas/sglang PR #508 (Rust port lock leak)",
           MatchWithoutSplit, "return_value"),
    Mutant("lock_skips_anchor", "mini-sglang PR #52", LockSkipsAnchor,
           "referenced_count_matches_live_pages"),
    Mutant("evicts_locked_parent", "SGLang PR #28161 (locked-node eviction)",
           EvictsLockedParent, "no_live_eviction"),
    Mutant("unlock_moves_sizes_every_time", "SGLang PR #10637 (size accounting)",
           UnlockMovesSizesEveryTime, "evictable_plus_protected_is_tree_size"),
    Mutant("no_underflow_check", "SGLang 0.5.23 dec_lock_ref (audit finding)",
           NoUnderflowCheck, "exception"),
    Mutant("page_freed_once_per_slot", "SGLang RFC PR #13023 / issue #7130",
           PageFreedOncePerSlot, "free_and_used_partition_pool", options={"page_size": 2}),
    Mutant("decode_page_boundary_off_by_one", "SGLang issue #7130 (paged decode)",
           DecodePageBoundaryOffByOne, "return_value", options={"page_size": 2}),
    Mutant("group_end_keeps_pending", "planted (issue 30)", GroupEndKeepsPending,
           "free_and_used_partition_pool", variant="lru", options={"page_size": 2, "groups": True}),
    Mutant("merge_keeps_staging", "planted (issue 30)", MergeKeepsStaging,
           "free_and_used_partition_pool", variant="lru", options={"need_sort": True}),
)  # fmt: skip
