"""SGLang's ``RadixCache`` as a real radix tree (spec: spec/sglang/radix_cache.py).

Nodes carry upstream's attribute names (``children`` keyed by a node's first page, ``key``,
``value``, ``lock_ref``, ``last_access_time``, ``creation_time``, ``parent``), the cache keeps
upstream's counters (``evictable_size_``, ``protected_size_``) and its set of evictable leaves, and
``evict`` runs one heap per call, so the spec's snapshot reader reads this tree as it reads
upstream's. The ``unified-*`` variants follow ``UnifiedRadixCache``'s clock and duplicate frees
(docs/sglang.md §8), as the spec does.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from impl.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from spec.errors import InvalidArgument, LockRefUnderflow, UnknownNode
from spec.sglang.radix_cache import Path, parse_variant


class TreeNode:
    __slots__ = (
        "children",
        "creation_time",
        "key",
        "last_access_time",
        "lock_ref",
        "parent",
        "value",
    )  # fmt: skip

    def __init__(self, parent: TreeNode | None, key: Path, value: list[int], t: int) -> None:
        self.children: dict[Path, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access_time = t
        self.creation_time = t

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time


class RadixCache:
    # the allocator classes, overridable (a planted bug in an allocator is a subclass here)
    token_allocator_cls: type[TokenToKVPoolAllocator] = TokenToKVPoolAllocator
    paged_allocator_cls: type[PagedTokenToKVPoolAllocator] = PagedTokenToKVPoolAllocator

    def __init__(
        self, size: int, page_size: int = 1, eviction_policy: str = "lru", need_sort: bool = False
    ) -> None:
        self.eviction_policy, self.unified = parse_variant(eviction_policy)
        self.page_size = page_size
        self.token_to_kv_pool_allocator: TokenToKVPoolAllocator = (
            self.token_allocator_cls(size, need_sort)
            if page_size == 1
            else self.paged_allocator_cls(size, page_size, need_sort)
        )
        self.root_node = TreeNode(None, (), [], 0)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: set[TreeNode] = set()
        self.clock = 0

    def _tick(self) -> int:
        self.clock += 3
        return self.clock

    def _stamp(self) -> int:
        self.clock += 1
        return self.clock

    def _split(self, child: TreeNode, cut: int, t: int) -> TreeNode:
        ps = self.page_size
        parent = child.parent
        assert parent is not None
        upper = TreeNode(parent, child.key[:cut], child.value[:cut], t)
        upper.lock_ref = child.lock_ref
        if self.unified:  # stamped, the lower node's creation time, the lower node after it
            upper.last_access_time, upper.creation_time = self._stamp(), child.creation_time
            child.last_access_time = self._stamp()
        child.key, child.value, child.parent = child.key[cut:], child.value[cut:], upper
        upper.children[child.key[:ps]] = child
        parent.children[upper.key[:ps]] = upper
        return upper

    def _common(self, child: TreeNode, key: Path, pos: int) -> int:
        ckey, n, ps = child.key, 0, self.page_size
        top = min(len(ckey), len(key) - pos)
        while n < top and ckey[n] == key[pos + n]:
            n += 1
        return n // ps * ps

    def _walk(self, key: Path, t: int | None) -> tuple[int, TreeNode]:
        """Down ``key``, splitting where it leaves a node; each node walked into is stamped
        ``t`` (``None``: the unified match, which stamps nothing on the way down)."""
        ps, node, pos = self.page_size, self.root_node, 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + ps])
            if child is None:
                break
            if t is not None:
                child.last_access_time = t
            n = self._common(child, key, pos)
            if n < len(child.key):
                return pos + n, self._split(child, n, 0 if t is None else t + 1)
            pos, node = pos + n, child
        return pos, node

    def match_prefix(self, key: Sequence[int]) -> tuple[list[int], TreeNode]:
        ps = self.page_size
        k = tuple(key[: len(key) // ps * ps])
        if not k:
            return [], self.root_node
        if self.unified:  # the path stamped after the walk, deepest last
            _, node = self._walk(k, None)
            path, n = [], node
            while n is not self.root_node:
                path.append(n)
                n = n.parent  # type: ignore[assignment]  # below the root: never None
            for n in reversed(path):
                n.last_access_time = self._stamp()
            return self.path_slots(node), node
        _, node = self._walk(k, self._tick())
        return self.path_slots(node), node

    def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
        return self.insert_result(key, value)[0]

    def insert_result(
        self, key: Sequence[int], value: Sequence[int], prev_prefix_len: int | None = None
    ) -> tuple[int, TreeNode]:
        ps = self.page_size
        k = tuple(key[: len(key) // ps * ps])
        v = list(value[: len(k)])
        if len(v) < len(k):
            raise InvalidArgument(f"{len(v)} slots for a key of {len(k)} tokens")
        if prev_prefix_len is not None and not self.unified:
            raise InvalidArgument("prev_prefix_len: only the unified tree frees duplicates")
        if not k:
            return 0, self.root_node
        if self.unified:
            matched, node = self._unified_walk(k, v, prev_prefix_len)
            t = self._stamp()
        else:
            t = self._tick()
            matched, node = self._walk(k, t)
            t += 2
        if matched < len(k):
            leaf = TreeNode(node, k[matched:], v[matched:], t)
            if self.unified:
                leaf.creation_time = self._stamp()
            node.children[leaf.key[:ps]] = leaf
            self.evictable_size_ += len(leaf.key)
            self.evictable_leaves.discard(node)
            self.evictable_leaves.add(leaf)
            node = leaf
        return matched, node

    def _unified_walk(self, k: Path, v: list[int], prev: int | None) -> tuple[int, TreeNode]:
        """The unified insert's walk: each node stamped on entry, the split where the key leaves
        a node, the duplicates from ``prev`` on freed one node at a time (after the walk)."""
        ps, node, pos, frees = self.page_size, self.root_node, 0, []
        while pos < len(k):
            child = node.children.get(k[pos : pos + ps])
            if child is None:
                break
            child.last_access_time = self._stamp()
            n = self._common(child, k, pos)
            whole = n == len(child.key)
            node = child if whole else self._split(child, n, 0)
            if prev is not None and max(pos, prev) < pos + n:
                frees.append(v[max(pos, prev) : pos + n])
            pos += n
            if not whole:
                break
        for slots in frees:
            self.token_to_kv_pool_allocator.free_segment(slots, 0)
        return pos, node

    def _priority(self, n: TreeNode) -> int:
        if self.eviction_policy == "fifo":
            return n.creation_time
        return -n.last_access_time if self.eviction_policy == "mru" else n.last_access_time

    def evict(self, num_tokens: int) -> int:
        heap = [(self._priority(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        evicted, ps = 0, self.page_size
        free = self.token_to_kv_pool_allocator.free_segment
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            free(x.value, 0)
            evicted += len(x.value)
            parent = x.parent
            assert parent is not None
            del parent.children[x.key[:ps]]
            self.evictable_size_ -= len(x.key)
            self.evictable_leaves.discard(x)
            if not parent.children and parent.lock_ref == 0:
                self.evictable_leaves.add(parent)
                heapq.heappush(heap, (self._priority(parent), parent))
        return evicted

    def _known(self, node: Any) -> TreeNode:
        if not isinstance(node, TreeNode):
            raise UnknownNode(f"not a node of this tree: {node!r}")
        n = node
        while n.parent is not None:
            if n.parent.children.get(n.key[: self.page_size]) is not n:
                raise UnknownNode("the node is no longer in the tree")
            n = n.parent
        if n is not self.root_node:
            raise UnknownNode("the node belongs to another tree")
        return node

    def inc_lock_ref(self, node: Any) -> int:
        n, delta = self._known(node), 0
        while n is not self.root_node:
            if n.lock_ref == 0:
                size = len(n.key)
                self.evictable_size_ -= size
                self.protected_size_ += size
                delta -= size
                self.evictable_leaves.discard(n)
            n.lock_ref += 1
            assert n.parent is not None
            n = n.parent
        return delta

    def dec_lock_ref(self, node: Any) -> int:
        n, delta = self._known(node), 0
        while n is not self.root_node:
            if n.lock_ref < 1:
                raise LockRefUnderflow(f"node {list(self.node_path(n))} is not locked")
            assert n.parent is not None
            n = n.parent
        n = node
        while n is not self.root_node:
            if n.lock_ref == 1:
                size = len(n.key)
                self.evictable_size_ += size
                self.protected_size_ -= size
                delta += size
                if not n.children:
                    self.evictable_leaves.add(n)
            n.lock_ref -= 1
            n = n.parent  # type: ignore[assignment]  # below the root: never None
        return delta

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return self.evictable_size_ + self.protected_size_  # relies on the sizes invariant

    def path_slots(self, node: TreeNode) -> list[int]:
        parts = []
        while node is not self.root_node:
            parts.append(node.value)
            assert node.parent is not None
            node = node.parent
        return [s for part in reversed(parts) for s in part]

    def node_path(self, node: TreeNode) -> Path:
        parts = []
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    def snapshot(self) -> Any:
        from spec.sglang.radix_cache import read_radix_cache

        return read_radix_cache(self)
