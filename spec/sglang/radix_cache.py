"""SGLang's ``RadixCache`` as a dict of token paths (docs/sglang.md §2–§4).

The tree is kept as ``{path: Node}``: ``path`` is every token from the root to a node's end, and
``node.start`` says where the node's own tokens begin, so the parent of ``path`` is the node whose
path is ``path[:start]`` (``()`` is the root). No parent or child pointers: every question (the
children of a node, the leaves, a lookup) is a scan over the dict, which is slow and obviously
right. A node handle is its path; a split keeps the lower half's path, so a request's lock handle
survives later splits.

Clock (§2.4): every call that touches access times takes a fresh base ``T``; the nodes on its path
get ``T``, the upper half of a split ``T+1`` and a new leaf ``T+2``; creation times likewise. Only
the order of the times is observable (eviction order); the snapshot carries their dense ranks.

The ``unified-*`` variants are ``UnifiedRadixCache``'s tree with one ``FULL`` component
(docs/sglang.md §8): every stamp is one tick of a counter, in upstream's order (a match stamps its
path after the walk, deepest last; an insert stamps each node it walks into; a split's upper half
keeps the lower half's creation time and the lower half is stamped after it), and
``insert_result(key, value, prev_prefix_len)`` frees the caller's duplicate slots from
``prev_prefix_len`` on itself, one ``free_segment`` per tree node the key overlaps.

The plain API is upstream's method names with plain values in place of upstream's parameter
objects and tensors (``match_prefix(key)`` for ``match_prefix(MatchPrefixParams(RadixKey(key)))``);
``kvspec.engines.sglang.sglang_adapter`` translates for the real class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from spec.errors import InvalidArgument, LockRefUnderflow, UnknownNode
from spec.sglang.allocator import TokenToKVPoolAllocator, make_allocator

Path = tuple[int, ...]

EVICTION_POLICIES = ("lru", "fifo", "mru")
"""``RadixCache``'s named variants: which leaf ``evict`` frees first (§4.2)."""

UNIFIED_VARIANTS = ("unified-lru", "unified-fifo", "unified-mru")
"""``UnifiedRadixCache``'s (one ``FULL`` component; docs/sglang.md §8): the same policies, its
clock discipline and its checkpoint (duplicates freed per node inside ``insert``, no re-match)."""

VARIANTS = EVICTION_POLICIES + UNIFIED_VARIANTS


def parse_variant(variant: str) -> tuple[str, bool]:
    """(the eviction policy, whether the tree is ``UnifiedRadixCache``'s) of a variant name."""
    if variant not in VARIANTS:
        raise InvalidArgument(f"unknown eviction policy {variant!r}")
    return variant.removeprefix("unified-"), variant.startswith("unified-")


class NodeRow(NamedTuple):
    """One tree node in a snapshot: its path, where its tokens start, its slots, its lock count
    and the dense ranks of its access and creation times among the tree's nodes."""

    path: Path
    start: int
    value: tuple[int, ...]
    lock_ref: int
    access_rank: int
    created_rank: int


class RequestRow(NamedTuple):
    """A live request in a snapshot (the scheduler's side, filled in by the harness): its tokens,
    its row of slots, the tree-owned prefix length, the path of the node it locks and its prompt's
    length (the rest of its tokens were decoded)."""

    rid: str
    tokens: tuple[int, ...]
    row: tuple[int, ...]
    protected: int
    locked: Path | None
    prompt_len: int = 0


class RadixSnapshot(NamedTuple):
    """Everything observable of a cache, its allocator and (from a harness) its requests."""

    page_size: int
    num_pages: int
    free_pages: tuple[int, ...]
    nodes: tuple[NodeRow, ...]
    evictable_size: int
    protected_size: int
    requests: tuple[RequestRow, ...] = ()
    # need_sort's released pages not yet merged into the free list, in release order (§1.5)
    staged_pages: tuple[int, ...] = ()
    # whether a free group is open, and the pages the next ``free_group_end`` releases, in its
    # order (upstream releases the deferred page ids even with no group open, §1.4)
    group_open: bool = False
    free_group: tuple[int, ...] = ()

    def differing_fields(self, other: RadixSnapshot) -> list[str]:
        return [f for f, a, b in zip(self._fields, self, other, strict=True) if a != b]


@dataclass
class Node:
    start: int
    value: list[int]
    lock_ref: int
    last_access_time: int
    creation_time: int


class RadixCache:
    """The radix prefix cache over its own allocator (SGLang ``RadixCache`` + allocator)."""

    def __init__(
        self, size: int, page_size: int = 1, eviction_policy: str = "lru", need_sort: bool = False
    ) -> None:
        self.eviction_policy, self.unified = parse_variant(eviction_policy)
        self.page_size = page_size
        self.token_to_kv_pool_allocator: TokenToKVPoolAllocator = make_allocator(
            size, page_size, need_sort
        )
        self.nodes: dict[Path, Node] = {}
        self.clock = 0

    # ------------------------------------------------------------------ reading the tree
    def _aligned(self, key: Sequence[int]) -> Path:
        return tuple(key[: len(key) // self.page_size * self.page_size])

    def _child(self, key: Path, pos: int) -> Path | None:
        """The child at ``pos`` whose first page is ``key[pos:pos+page_size]`` (parents agree
        because paths do)."""
        head = key[: pos + self.page_size]
        for path, node in self.nodes.items():
            if node.start == pos and path[: pos + self.page_size] == head:
                return path
        return None

    def children(self, path: Path) -> list[Path]:
        return [p for p, n in self.nodes.items() if n.start == len(path) and p[: len(path)] == path]

    def _ancestry(self, path: Path) -> list[Path]:
        """``path`` and its ancestors up to (without) the root."""
        out = []
        while path:
            out.append(path)
            path = path[: self.nodes[path].start]
        return out

    def _tick(self) -> int:
        self.clock += 3
        return self.clock

    def _stamp(self) -> int:
        """The unified tree's clock: one tick per reading (§8.2)."""
        self.clock += 1
        return self.clock

    def _split(self, path: Path, at: int, t: int) -> Path:
        """Split node ``path`` so that a node ends at token ``at``; the new upper node takes the
        lock count, time ``t`` (§2.3). Unified (§8.2): the upper node is stamped, keeps the lower
        one's creation time, and the lower one is stamped after it (``t`` unused)."""
        low = self.nodes[path]
        cut = at - low.start
        upper = Node(low.start, low.value[:cut], low.lock_ref, t, t)
        if self.unified:
            upper.last_access_time, upper.creation_time = self._stamp(), low.creation_time
            low.last_access_time = self._stamp()
        low.start, low.value = at, low.value[cut:]
        self.nodes[path[:at]] = upper
        return path[:at]

    def _common(self, a: Path, b: Path) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n // self.page_size * self.page_size

    def _walk(self, key: Path, t: int) -> tuple[int, Path]:
        """Follow ``key`` down the tree, stamping every node on the way with ``t``; split the
        node the key leaves in the middle. Returns (matched tokens, last node's path)."""
        pos, node = 0, Path()
        while pos < len(key):
            child = self._child(key, pos)
            if child is None:
                break
            self.nodes[child].last_access_time = t
            end = self._common(child, key)
            if end < len(child):
                return end, self._split(child, end, t + 1)
            pos, node = len(child), child
        return pos, node

    # ------------------------------------------------------------------ the API
    def match_prefix(self, key: Sequence[int]) -> tuple[list[int], Path]:
        """The longest cached page-aligned prefix of ``key``: its slots and the last node.
        Post: the nodes on the path are the most recently used; a match ending inside a node
        splits it (§2.2). An empty (aligned) key touches nothing."""
        key = self._aligned(key)
        if not key:
            return [], ()
        if self.unified:  # no stamps on the way down; the path afterwards, deepest last (§8.2)
            pos, node = 0, Path()
            while pos < len(key) and (child := self._child(key, pos)) is not None:
                end = self._common(child, key)
                if end < len(child):
                    node = self._split(child, end, 0)
                    break
                pos, node = len(child), child
            for path in reversed(self._ancestry(node)):
                self.nodes[path].last_access_time = self._stamp()
            return self.path_slots(node), node
        _, node = self._walk(key, self._tick())
        return self.path_slots(node), node

    def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
        """Cache ``key`` (page-aligned) with ``value``'s slots; the part already cached keeps its
        slots (the caller frees its own duplicates). Returns the length already cached (§2.3)."""
        return self.insert_result(key, value)[0]

    def insert_result(
        self, key: Sequence[int], value: Sequence[int], prev_prefix_len: int | None = None
    ) -> tuple[int, Path]:
        """``insert``, also returning the node the key ends on (upstream's ``InsertResult``).
        Unified (§8.3): with ``prev_prefix_len``, the caller's slots of the cached part from there
        on are freed here, one ``free_segment`` per tree node the key overlaps, root first."""
        key = self._aligned(key)
        value = list(value[: len(key)])
        if len(value) < len(key):
            raise InvalidArgument(f"{len(value)} slots for a key of {len(key)} tokens")
        if prev_prefix_len is not None and not self.unified:
            raise InvalidArgument("prev_prefix_len: only the unified tree frees duplicates")
        if not key:
            return 0, ()
        if not self.unified:
            t = self._tick()
            matched, node = self._walk(key, t)
            if matched < len(key):
                self.nodes[key] = Node(matched, value[matched:], 0, t + 2, t + 2)
                node = key
            return matched, node
        pos, node, frees = 0, Path(), []
        while pos < len(key) and (child := self._child(key, pos)) is not None:
            self.nodes[child].last_access_time = self._stamp()
            end = self._common(child, key)
            node = self._split(child, end, 0) if end < len(child) else child
            start = pos if prev_prefix_len is None else max(pos, prev_prefix_len)
            if prev_prefix_len is not None and start < end:
                frees.append(value[start:end])
            pos = end
            if end < len(child):
                break
        for slots in frees:
            self.token_to_kv_pool_allocator.free_segment(slots, 0)
        if pos < len(key):
            access = self._stamp()
            self.nodes[key] = Node(pos, value[pos:], 0, access, self._stamp())
            node = key
        return pos, node

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, first by the policy's order, until ``num_tokens`` slots are freed
        or none is left; a whole leaf goes at once (it can overshoot) and a parent left childless
        and unlocked becomes a candidate. Returns the slots freed (§4)."""
        evicted = 0
        while evicted < num_tokens:
            leaves = [p for p, n in self.nodes.items() if n.lock_ref == 0 and not self.children(p)]
            if not leaves:
                break
            victim = min(leaves, key=self._priority)
            node = self.nodes.pop(victim)
            self.token_to_kv_pool_allocator.free_segment(node.value, 0)
            evicted += len(node.value)
        return evicted

    def _priority(self, path: Path) -> int:
        n = self.nodes[path]
        if self.eviction_policy == "fifo":
            return n.creation_time
        return -n.last_access_time if self.eviction_policy == "mru" else n.last_access_time

    def inc_lock_ref(self, node: Path) -> int:
        """Lock ``node`` and its ancestors (one more holder each). Returns the change of the
        evictable size (minus the tokens of the nodes that went 0 -> 1) (§3)."""
        self._known(node)
        delta = 0
        for path in self._ancestry(node):
            n = self.nodes[path]
            if n.lock_ref == 0:
                delta -= len(n.value)
            n.lock_ref += 1
        return delta

    def dec_lock_ref(self, node: Path) -> int:
        """Pre: every node on the path is locked (``LockRefUnderflow``, nothing changes; upstream
        does not check, §3.2). Post: one holder fewer each; returns the evictable-size change."""
        self._known(node)
        for path in self._ancestry(node):
            if self.nodes[path].lock_ref < 1:
                raise LockRefUnderflow(f"node {list(path)} is not locked")
        delta = 0
        for path in self._ancestry(node):
            n = self.nodes[path]
            if n.lock_ref == 1:
                delta += len(n.value)
            n.lock_ref -= 1
        return delta

    def _known(self, node: Path) -> None:
        if node and node not in self.nodes:
            raise UnknownNode(f"no node {list(node)} in the tree")

    def evictable_size(self) -> int:
        return sum(len(n.value) for n in self.nodes.values() if n.lock_ref == 0)

    def protected_size(self) -> int:
        return sum(len(n.value) for n in self.nodes.values() if n.lock_ref > 0)

    def total_size(self) -> int:
        return sum(len(n.value) for n in self.nodes.values())

    def path_slots(self, node: Path) -> list[int]:
        """The slots from the root to ``node``'s end."""
        return [s for p in reversed(self._ancestry(node)) for s in self.nodes[p].value]

    def node_path(self, node: Path) -> Path:
        return node

    def snapshot(self) -> RadixSnapshot:
        return read_radix_cache(self)


def dense_ranks(values: Sequence[Any]) -> list[int]:
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


def _tokens(key: Any) -> tuple[int, ...]:
    """A node key as a tuple: upstream's ``RadixKey`` (``token_ids``) or a plain sequence."""
    return tuple(int(t) for t in getattr(key, "token_ids", key))


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in (value.tolist() if hasattr(value, "tolist") else value))


def _flat(pieces: Any) -> tuple[int, ...]:
    """Ints, a tensor, or a list of pieces (upstream keeps staged and deferred frees as a list
    of tensors), as one tuple; ``None`` as empty."""
    if pieces is None:
        return ()
    if hasattr(pieces, "tolist"):
        return _ints(pieces)
    return tuple(v for p in pieces for v in (_flat(p) if hasattr(p, "tolist") else (int(p),)))


def read_allocator_groups(alloc: Any) -> tuple[tuple[int, ...], bool, tuple[int, ...]]:
    """(staged pages, whether a group is open, the pages the next ``free_group_end`` releases)
    of an allocator of upstream's shape: ``staged_pages`` (paged) or ``release_pages`` (token),
    ``free_group`` (``None``, or the slots deferred by ``free``: their distinct pages, ascending
    with pages, in order without) and ``free_page_ids_group`` (pages deferred by
    ``free_segment``, released after them)."""
    staged = getattr(alloc, "staged_pages", None)
    if staged is None:
        staged = getattr(alloc, "release_pages", None)
    group = getattr(alloc, "free_group", None)
    ps = int(alloc.page_size)
    slots = _flat(group)
    pages = slots if ps == 1 else tuple(sorted({s // ps for s in slots}))
    later = _flat(getattr(alloc, "free_page_ids_group", None))
    return _flat(staged), group is not None, pages + later


def read_radix_cache(cache: Any) -> RadixSnapshot:
    """The snapshot of the spec (its dict) or of any tree of upstream's shape: ``root_node``,
    nodes with ``children``, ``key``, ``value``, ``lock_ref``, ``last_access_time``,
    ``creation_time``; ``evictable_size()``/``protected_size()``; the allocator's
    ``free_pages`` (and ``page_size``/``size``), its staging and open free group
    (:func:`read_allocator_groups`)."""
    tree = getattr(cache, "tree", cache)  # the adapter keeps upstream's cache as ``tree``
    alloc = cache.token_to_kv_pool_allocator
    rows: list[tuple[Path, int, tuple[int, ...], int, Any, Any]] = []
    if isinstance(tree, RadixCache):
        for path, n in tree.nodes.items():
            rows.append((path, n.start, tuple(n.value), n.lock_ref, n.last_access_time,
                         n.creation_time))  # fmt: skip
    else:
        stack: list[tuple[Path, Any]] = [((), tree.root_node)]
        while stack:
            prefix, node = stack.pop()
            for child in node.children.values():
                path = prefix + _tokens(child.key)
                rows.append((path, len(prefix), _ints(child.value), int(child.lock_ref),
                             child.last_access_time, child.creation_time))  # fmt: skip
                stack.append((path, child))
    access = dense_ranks([r[4] for r in rows])
    created = dense_ranks([r[5] for r in rows])
    nodes = sorted(NodeRow(*r[:4], a, c) for r, a, c in zip(rows, access, created, strict=True))
    ps = int(alloc.page_size)
    staged, group_open, group = read_allocator_groups(alloc)
    return RadixSnapshot(
        page_size=ps,
        num_pages=int(alloc.size) // ps,
        free_pages=_ints(alloc.free_pages),
        nodes=tuple(nodes),
        evictable_size=int(tree.evictable_size()),
        protected_size=int(tree.protected_size()),
        staged_pages=staged,
        group_open=group_open,
        free_group=group,
    )
