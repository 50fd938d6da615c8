"""Invariants as pure predicates over snapshots — one name per invariant, used everywhere.

Each predicate returns ``None`` when it holds and a message naming the offending pages otherwise.
The same names appear in the stateful machines, the proofs and the mutant catalogue
(docs/design.md "Invariants"); :data:`INVARIANT_NAMES` lists every one. A predicate that checks
a hidden counter of the target (a production-only cache, not part of any snapshot) takes the
counter's value and what the scan needs as explicit arguments. References:
docs/infinilm.md §5, §8 (block manager, scheduler), docs/vllm.md §1, §2,
§3, §8 (CPU offload manager, ARC, LRU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import dropwhile
from typing import Any, Protocol, Self, TypeVar

from spec.infinilm.request import TERMINAL, InferenceRequest
from spec.infinilm.scheduler import remote_reservation, running_reservation
from spec.infinilm.snapshot import BlockManagerSnapshot, SchedulerSnapshot
from spec.sglang.radix_cache import RadixSnapshot
from spec.vllm import Key
from spec.vllm.arc import ARCSnapshot
from spec.vllm.kv_cache_manager import PrefixCacheSnapshot
from spec.vllm.lru import LRUSnapshot
from spec.vllm.offload_manager import OffloadManagerSnapshot

Violation = str | None


class Snapshot(Protocol):
    """Any model's snapshot: a comparable value that names the fields in which two differ."""

    def differing_fields(self, other: Self) -> list[str]: ...


S = TypeVar("S", bound=Snapshot)


def free_and_used_partition_pool(s: BlockManagerSnapshot) -> Violation:
    """The free deque (no duplicates) and the used set partition ``{0..N-1}``."""
    free, used = set(s.free_block_ids), set(s.used_block_ids)
    if (
        len(free) + len(used) == s.num_blocks
        and len(free) == len(s.free_block_ids)
        and free | used == set(range(s.num_blocks))
    ):
        return None  # fast path: a partition, no duplicates
    dupes = sorted(p for p, n in Counter(s.free_block_ids).items() if n > 1)
    if dupes:
        return f"pages {dupes} appear twice on the free deque"
    both = sorted(free & used)
    if both:
        return f"pages {both} are both free and used"
    missing = sorted(set(range(s.num_blocks)) - free - used)
    if missing:
        return f"pages {missing} are neither free nor used"
    return f"ids {sorted((free | used) - set(range(s.num_blocks)))} are outside the pool"


def free_pages_unreferenced(s: BlockManagerSnapshot) -> Violation:
    """Every free page has ref_count 0 and no hash; no ref count is negative."""
    bad = [
        p for p in s.free_block_ids if 0 <= p < s.num_blocks and (s.ref_counts[p] or s.hashes[p])
    ]
    if bad:
        return f"free pages {bad} are referenced or hashed"
    negative = [p for p, r in enumerate(s.ref_counts) if r < 0]
    if negative:
        return f"pages {negative} have negative ref counts"
    return None


def prefix_index_consistent(s: BlockManagerSnapshot) -> Violation:
    """``p in index[h]`` iff ``hash(p) == h != b""``; indexed pages are used; no empty sets."""
    indexed = {(h, p) for h, ids in s.hash_to_block_ids for p in ids}
    hashed = {(h, p) for p, h in enumerate(s.hashes) if h}
    if indexed != hashed:
        return (
            f"index and page hashes disagree: indexed-not-hashed "
            f"{sorted(p for _, p in indexed - hashed)}, hashed-not-indexed "
            f"{sorted(p for _, p in hashed - indexed)}"
        )
    empty = [h.hex() for h, ids in s.hash_to_block_ids if not ids]
    if empty:
        return f"empty index sets for hashes {empty}"
    used = set(s.used_block_ids)
    stray = sorted(p for _, p in indexed if p not in used)
    if stray:
        return f"indexed pages {stray} are not in use"
    return None


def referenced_count_matches_live_pages(
    s: BlockManagerSnapshot,
    usable_blocks: int,
    holders: Iterable[Iterable[int]] | None = None,
) -> Violation:
    """``usable == N - |{p : ref(p) > 0}|``; with ``holders`` also ``ref(p)`` == occurrences of p.

    ``usable_blocks`` is what the target's ``get_total_usable_blocks()`` answered (an O(1) counter in
    #576-style implementations, so this checks the counter); ``holders`` are the live block tables
    and pins a driver knows of.
    """
    live = sum(1 for r in s.ref_counts if r > 0)
    if usable_blocks != s.num_blocks - live:
        return f"usable={usable_blocks} but N - referenced = {s.num_blocks} - {live}"
    if holders is not None:
        expected: Counter[int] = Counter()
        for table in holders:
            expected.update(table)
        wrong = {
            p: (r, expected.get(p, 0))
            for p, r in enumerate(s.ref_counts)
            if r != expected.get(p, 0)
        }
        if wrong:
            return "ref_count != live occurrences (page: (ref, occurrences)): " + str(wrong)
    return None


def no_live_eviction(s: BlockManagerSnapshot, holders: Iterable[Iterable[int]]) -> Violation:
    """No page held by a live table or pin is on the free deque."""
    free = set(s.free_block_ids)
    evicted = sorted({p for table in holders for p in table if p in free})
    if evicted:
        return f"live pages {evicted} were returned to the free deque"
    return None


def no_leak_at_quiescence(s: BlockManagerSnapshot) -> Violation:
    """With no live holder left, every page is free or an unreferenced cached page."""
    leaked = [p for p, r in enumerate(s.ref_counts) if r != 0]
    if leaked:
        return f"pages {leaked} are still referenced at quiescence"
    return None


def atomic_failure(before: S, after: S) -> Violation:
    """A validate-first operation that raised (or an offload store that returned ``None``: a failed
    eviction) left every observable unchanged — for ARC not even ghost order or the target."""
    changed = before.differing_fields(after)
    if changed:
        return f"a rejected operation changed {changed}"
    return None


def identical_eviction_order(spec_free: tuple[int, ...], target_free: tuple[int, ...]) -> Violation:
    """Spec and target put pages on the free deque (offload: the free-id stack) in the same order
    (same evictions, same order)."""
    if spec_free != target_free:
        return f"free deque differs: spec {list(spec_free)} vs target {list(target_free)}"
    return None


# Predicates of one snapshot alone, checked after every step by every checker.
STATE_INVARIANTS: Mapping[str, Callable[[BlockManagerSnapshot], Violation]] = {
    "free_and_used_partition_pool": free_and_used_partition_pool,
    "free_pages_unreferenced": free_pages_unreferenced,
    "prefix_index_consistent": prefix_index_consistent,
}


def first_state_violation(s: BlockManagerSnapshot) -> Violation:
    """The first broken :data:`STATE_INVARIANTS` predicate of ``s``, as ``"name: problem"``."""
    for name, predicate in STATE_INVARIANTS.items():
        problem = predicate(s)
        if problem:
            return f"{name}: {problem}"
    return None


# ----------------------------------------------------------------------------- InfiniLM scheduler
_TERMINAL_NAMES = frozenset(status.name for status in TERMINAL)


def request_in_exactly_one_place(s: SchedulerSnapshot, lost: Collection[str] = ()) -> Violation:
    """No request is queued twice (waiting, running, remote-pending); every live request is in one
    of those places, unless it is ``lost`` (dequeued by a step that raised, reference §9.14)."""
    places = s.placed()
    twice = sorted(rid for rid, n in Counter(places).items() if n > 1)
    placed = set(places)
    nowhere = sorted(
        row[0]
        for row in s.requests
        if row[1] not in _TERMINAL_NAMES and row[0] not in placed and row[0] not in lost
    )
    if twice or nowhere:
        return f"in two places: {twice}; in none: {nowhere}"
    return None


def reservation_counter_matches_scan(
    counter: int, running: Iterable[InferenceRequest], variant: str, block_size: int
) -> Violation:
    """The exact-reservation PR: ``counter`` (the target's ``num_reserved_decode_blocks``) equals
    Σ over the running queue (``running``, head first) of the variant's running reservation."""
    scan = sum(running_reservation(variant, r, block_size) for r in running)
    if counter != scan:
        return f"num_reserved_decode_blocks={counter} but the scan gives {scan}"
    return None


def pending_counter_matches_scan(
    counter: int, remote: Iterable[InferenceRequest], variant: str, block_size: int
) -> Violation:
    """``counter`` (``pending_kv_decode_blocks``) equals Σ over the remote-pending requests
    (``remote``) of the variant's remote reservation (reference §5.3, §5.6)."""
    pending = sum(remote_reservation(variant, r, block_size) for r in remote)
    if counter != pending:
        return f"pending_kv_decode_blocks={counter} but the scan gives {pending}"
    return None


def admission_soundness(decode_oom_without_drafts: bool, variant: str) -> Violation:
    """A question about a reservation variant, not a contract: a decode step never runs out of
    pages unless draft tokens were used (``decode_oom_without_drafts`` says one did)."""
    if decode_oom_without_drafts:
        return f"a decode step ran out of pages with no draft tokens ({variant} reservation)"
    return None


# ----------------------------------------------------------------------------- vLLM CPU offload
def arc_lists_bounded(s: OffloadManagerSnapshot) -> Violation:
    """ARC (docs/vllm.md §2.1, §2.3): ``|B1|, |B2| <= N``; ``0 <= target <= N``; ``|T1| + |T2| <= N``;
    T1, T2, B1, B2 pairwise disjoint; T1 + T2 are exactly the cached blocks. Holds for non-ARC
    snapshots vacuously."""
    p, n = s.policy, s.num_blocks
    if not isinstance(p, ARCSnapshot):
        return None
    if len(p.b1) > n or len(p.b2) > n or not 0 <= p.target_t1_size <= n:
        return f"ghosts {len(p.b1)}/{len(p.b2)} or target {p.target_t1_size} exceed N={n}"
    if len(p.t1) + len(p.t2) > n:
        return f"|T1|+|T2| = {len(p.t1) + len(p.t2)} > N={n}"
    lists = [*p.t1, *p.t2, *p.b1, *p.b2]
    if len(set(lists)) != len(lists):
        twice = sorted((k for k, c in Counter(lists).items() if c > 1), key=repr)
        return f"keys {twice} appear in two ARC lists"
    if {k for _, k, _ in p.blocks} != {*p.t1, *p.t2}:
        return "T1 + T2 differ from the cached blocks"
    return None


def lru_order_consistent(s: OffloadManagerSnapshot, variant: str) -> Violation:
    """LRU (docs/vllm.md §3): the eviction order lists each key once — v1 every cached key, v2 exactly
    the idle (``ref_cnt == 0``) keys. Holds for non-LRU snapshots vacuously."""
    p = s.policy
    if not isinstance(p, LRUSnapshot):
        return None
    want = {k for _, k, r in p.blocks if variant == "v1" or r == 0}
    if len(set(p.order)) != len(p.order) or set(p.order) != want:
        return f"LRU order {list(p.order)} is not a permutation of {sorted(want, key=repr)}"
    return None


def offload_ids_partition_pool(s: OffloadManagerSnapshot) -> Violation:
    """Free ids and cached blocks' ids are disjoint, without repeats, and together are the ids
    handed out so far, ``0..num_allocated_blocks-1``; at most N ids were ever handed out."""
    free, used = list(s.free_list), [b for b, _, _ in s.policy.blocks]
    if len(set(free)) != len(free) or len(set(used)) != len(used) or set(free) & set(used):
        return f"free ids {free} and cached ids {used} overlap or repeat"
    if set(free) | set(used) != set(range(s.num_allocated_blocks)):
        return f"free {free} + cached {used} != ids 0..{s.num_allocated_blocks - 1}"
    if s.num_allocated_blocks > s.num_blocks:
        return f"{s.num_allocated_blocks} ids handed out from a pool of {s.num_blocks}"
    return None


def evictable_counter_matches_scan(s: OffloadManagerSnapshot, counter: int) -> Violation:
    """#45757: ``counter`` (a manager's ``_num_evictable_cache_blocks``) equals the number of cached
    blocks with ``ref_cnt == 0`` (idle blocks). A drift turns into a false ``None`` store."""
    idle = sum(1 for _, _, r in s.policy.blocks if r == 0)
    return None if counter == idle else f"evictable counter {counter} != {idle} idle blocks"


def offload_no_live_eviction(
    before: OffloadManagerSnapshot,
    after: OffloadManagerSnapshot,
    *,
    may_evict: bool,
    protected: Collection[Key] = (),
    released: Collection[Key] = (),
) -> Violation:
    """``no_live_eviction`` for the offload manager, over one call from ``before`` to ``after``.

    Only an evicting call (``prepare_store``: ``may_evict``) removes ready blocks, and only idle
    (``ref_cnt == 0``) ones outside ``protected`` (its threshold-filtered input keys, #35846): a
    loading, pending or protected block is never evicted. Besides, only the pending blocks in
    ``released`` (a failed ``complete_store``) may leave the cache.
    """
    kept = {k for _, k, _ in after.policy.blocks}
    live, outside = [], []
    for _, key, ref in before.policy.blocks:
        if key in kept or (ref < 0 and key in released):
            continue
        if ref != 0 or key in protected:
            live.append((key, ref))
        elif not may_evict:
            outside.append(key)
    if live:
        return "evicted live blocks (key, ref_cnt; protected if 0): " + str(live)
    if outside:
        return f"blocks {outside} left the cache outside an eviction"
    return None


# ----------------------------------------------------------------------------- vLLM GPU prefix cache
# docs/vllm.md §5.4 (invariants 1-12) over a PrefixCacheSnapshot (docs/vllm-kv-cache-manager.md §7).
def gpu_free_queue_partition(s: PrefixCacheSnapshot) -> Violation:
    """``free_and_used_partition_pool`` (§5.4 2, 4): the free queue holds every non-null block with
    ``ref_cnt == 0`` exactly once and nothing else (no block both free and held, the null block
    never free); no reference count is negative."""
    queue = s.free_queue
    if len(set(queue)) != len(queue):
        return f"blocks {sorted(b for b, n in Counter(queue).items() if n > 1)} are queued twice"
    nulls = set(s.null_blocks)
    idle = {b for b, r in enumerate(s.ref_cnts) if r == 0 and b not in nulls}
    if set(queue) != idle:
        return (
            f"free queue {list(queue)} != idle blocks {sorted(idle)} (queued but held: "
            f"{sorted(set(queue) - idle)}, idle but not queued: {sorted(idle - set(queue))})"
        )
    negative = [b for b, r in enumerate(s.ref_cnts) if r < 0]
    return f"blocks {negative} have negative ref counts" if negative else None


def free_counter_matches_queue(s: PrefixCacheSnapshot) -> Violation:
    """§5.4 3, 12: ``num_free_blocks`` is the queue's length and ``usage == 1 - free / (N - 1)``."""
    if s.num_free_blocks != len(s.free_queue):
        return f"num_free_blocks {s.num_free_blocks} != {len(s.free_queue)} blocks in the queue"
    usable = len(s.ref_cnts) - 1
    usage = 0.0 if not usable else 1.0 - s.num_free_blocks / usable
    if s.usage != usage:
        return f"usage {s.usage} != 1 - {s.num_free_blocks}/{usable}"
    return None


def gpu_prefix_index_consistent(s: PrefixCacheSnapshot) -> Violation:
    """``prefix_index_consistent`` (§5.4 5): each block listed under a key has that hash, each
    hashed block is listed under its hash, no entry is empty or lists a block twice."""
    listed = [(label, b) for label, ids in s.cached for b in ids]
    empty = [label for label, ids in s.cached if not ids]
    if empty or len(set(listed)) != len(listed):
        return f"empty or repeated map entries: {empty or listed}"
    hashed = {(h, b) for b, h in enumerate(s.block_hashes) if h is not None}
    if set(listed) != hashed:
        return (
            f"map and block hashes disagree: listed-not-hashed {sorted(set(listed) - hashed)}, "
            f"hashed-not-listed {sorted(hashed - set(listed))}"
        )
    return None


def null_block_reserved(s: PrefixCacheSnapshot) -> Violation:
    """``null_block_reserved`` (§5.4 4): block 0 is the only null block; it is never free, never
    cached and in no full-attention block list; in a sliding-window or chunked-local group's list
    the null blocks (the positions before the span) come first (a Mamba group's may be anywhere
    but the end)."""
    if s.null_blocks != (0,):
        return f"null blocks {list(s.null_blocks)} (want block 0 alone)"
    held = [rid for rid, ids in s.req_to_blocks if 0 in ids]
    if 0 in s.free_queue or s.block_hashes[0] is not None or held:
        return f"the null block is free, cached or held (by {held})"
    kinds = dict(enumerate(s.group_kinds, start=1))
    for g, tables, _ in group_tables(s)[1:]:
        for rid, ids in tables:
            if kinds.get(g) == "mamba":
                if ids and ids[-1] == 0:
                    return f"group {g}: request {rid}'s Mamba state block is null {list(ids)}"
                continue
            lead = len(ids) - len(list(dropwhile(lambda b: b == 0, ids)))
            if 0 in ids[lead:]:
                return f"group {g}: request {rid}'s null blocks do not lead its list {list(ids)}"
    return None


def cached_blocks_are_a_prefix(s: PrefixCacheSnapshot) -> Violation:
    """``cached_blocks_are_a_prefix`` (§5.4 8): a request's blocks past its cached count (all of
    them without a count) carry no hash — only full, cached blocks are hashed."""
    bad = [
        (rid, b)
        for _, tables, counts in group_tables(s)
        for rid, ids in tables
        for b in ids[dict(counts).get(rid, 0) :]
        if s.block_hashes[b] is not None
    ]
    return f"hashed blocks past a request's cached count (request, block): {bad}" if bad else None


def block_hashes_match_content(
    s: PrefixCacheSnapshot, prefixes: Mapping[str, Sequence[str]]
) -> Violation:
    """``block_hashes_match_content`` (§5.4 9): a request's cached block at position i is either
    uncached now (evicted) or cached under the request's own hash of its first i+1 blocks
    (``prefixes``: request id -> the labels of its block hashes). Catches stale or misplaced
    hashes, which would serve another prompt's KV to a prefix hit."""
    bad = []
    for g, tables, counts in group_tables(s):
        cached, tag = dict(counts), f"@{g}" if g else ""  # a further group's keys say so
        for rid, ids in tables:
            want = prefixes.get(rid)
            if want is None:
                continue
            for i, b in enumerate(ids[: cached.get(rid, 0)]):
                h = s.block_hashes[b]
                if b and h is not None and (i >= len(want) or h != want[i] + tag):
                    bad.append((rid, i, b, h))
    return (
        f"blocks cached under another prefix (request, position, block, hash): {bad}"
        if bad
        else None
    )


def gpu_ref_counts_match_holders(
    s: PrefixCacheSnapshot, deferred: Iterable[Iterable[int]] = ()
) -> Violation:
    """``referenced_count_matches_live_pages`` (§5.4 1): every non-null block's ``ref_cnt`` is the
    number of times it occurs in the requests' block lists and in the ``deferred`` lists (blocks
    popped for a later free)."""
    expected: Counter[int] = Counter(
        b for _, tables, _ in group_tables(s) for _, ids in tables for b in ids
    )
    for table in deferred:
        expected.update(table)
    nulls = set(s.null_blocks)
    wrong = {
        b: (r, expected.get(b, 0))
        for b, r in enumerate(s.ref_cnts)
        if b not in nulls and r != expected.get(b, 0)
    }
    return f"ref_cnt != holders (block: (ref, holders)): {wrong}" if wrong else None


def gpu_no_leak_at_quiescence(s: PrefixCacheSnapshot) -> Violation:
    """``no_leak_at_quiescence``: with no block list held, every block but the null block is free."""
    leaked = [b for b, r in enumerate(s.ref_cnts) if r]
    if leaked or s.num_free_blocks != len(s.ref_cnts) - len(s.null_blocks):
        return f"blocks {leaked} still referenced, {s.num_free_blocks} free at quiescence"
    return None


def flat_ids(ids: Sequence[Any]) -> list[int]:
    """Block ids of one group (a list) or of several (a list of lists), as one list."""
    return [b for x in ids for b in (x if isinstance(x, list | tuple) else (x,))]


def group_tables(s: PrefixCacheSnapshot) -> list[tuple[int, Any, Any]]:
    """``(group, req_to_blocks, num_cached_block)`` of every KV cache group."""
    return [(0, s.req_to_blocks, s.num_cached_block)] + [
        (g, tables, counts) for g, (tables, counts) in enumerate(s.groups, start=1)
    ]


def gpu_refusal_changes_nothing(
    before: PrefixCacheSnapshot, after: PrefixCacheSnapshot
) -> Violation:
    """``atomic_failure`` of an allocation that returned ``None``: nothing changed — except, with
    a sliding-window group, that blocks at the head of a window group's list were nulled and
    freed (``remove_skipped_blocks`` runs before the capacity check, as upstream's)."""
    if before == after:
        return None
    moved = set(before.differing_fields(after)) - {"ref_cnts", "free_queue", "num_free_blocks",
                                                   "usage", "groups"}  # fmt: skip
    if moved or not before.groups:
        return f"returned None but changed {before.differing_fields(after)}"
    for (_, old_t, old_c), (_, new_t, new_c) in zip(
        group_tables(before)[1:], group_tables(after)[1:], strict=True
    ):
        old_map, new_map = dict(old_t), dict(new_t)
        if old_c != new_c or set(new_map) - set(old_map) - {r for r, ids in new_t if not ids}:
            return "returned None but changed a window group's request set or cached counts"
        for rid, ids in new_map.items():
            was = old_map.get(rid, ())
            nulled = [i for i, (a, b) in enumerate(zip(was, ids, strict=False)) if a != b]
            if len(was) != len(ids) or any(ids[i] != 0 for i in nulled):
                return f"returned None but changed request {rid}'s window blocks {was} -> {ids}"
    return None


def _nulled(before: PrefixCacheSnapshot, after: PrefixCacheSnapshot) -> set[int]:
    """Blocks a call replaced by the null block in a window group's list (and so freed)."""
    out: set[int] = set()
    for (_, old_t, _), (_, new_t, _) in zip(
        group_tables(before)[1:], group_tables(after)[1:], strict=True
    ):
        new_map = dict(new_t)
        for rid, ids in old_t:
            now = new_map.get(rid, ())
            out.update(b for b, n in zip(ids, now, strict=False) if b and n == 0)
    return out


def gpu_no_live_eviction(
    before: PrefixCacheSnapshot, after: PrefixCacheSnapshot, new_blocks: Iterable[int]
) -> Violation:
    """``no_live_eviction`` (§5.4 6) over one allocating call: every block handed out new was free
    before the call (or left a window group's list in it) and is held exactly once after it (no
    live block is handed out again)."""
    free = set(before.free_queue) | _nulled(before, after)
    nulls = set(after.null_blocks)  # a Mamba group's new entries pad with the null block
    bad = [b for b in new_blocks if b not in nulls and (b not in free or after.ref_cnts[b] != 1)]
    if bad:
        return f"new blocks {bad} were held before the call, or are shared after it"
    return None


# ----------------------------------------------------------------------------- every name
# Every invariant name used anywhere (checkers' failures, SNAPSHOT_CHECKS, the mutant catalogue's
# expected checks, proofs and explorer). Lockstep's outcome comparisons (``exception``,
# ``return_value``, ``argument_mutation``, ``snapshot``) are comparisons, not invariants.
# ----------------------------------------------------------------------------- SGLang radix cache
# docs/sglang.md §6. Pages: slot // page_size (page size 1: the slot itself).
def _radix_pages(s: RadixSnapshot, slots: Iterable[int]) -> list[int]:
    return [x // s.page_size for x in slots]


def _radix_tree_pages(s: RadixSnapshot) -> list[int]:
    return [p for n in s.nodes for p in _radix_pages(s, n.value[:: s.page_size])]


def radix_slot_conservation(s: RadixSnapshot) -> Violation:
    """Slot conservation: the free list, the staged pages, the open free group's pending frees,
    the tree's nodes and the live requests' own row tails (past their tree-owned prefix) hold
    every page ``1..num_pages`` exactly once."""
    held = [*s.free_pages, *s.staged_pages, *s.free_group, *_radix_tree_pages(s)]
    for r in s.requests:
        held += sorted(set(_radix_pages(s, r.row[r.protected :])))
    counts = Counter(held)
    missing = sorted(set(range(1, s.num_pages + 1)) - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    stray = sorted(p for p in counts if not 1 <= p <= s.num_pages)
    if missing or twice or stray:
        return f"pages lost {missing}, held twice {twice}, outside the pool {stray}"
    return None


def no_slot_free_and_cached(s: RadixSnapshot) -> Violation:
    """No page is on the free list (or staged) while a tree node holds it."""
    both = sorted(set(s.free_pages).union(s.staged_pages) & set(_radix_tree_pages(s)))
    return f"pages both free and cached: {both}" if both else None


def evictable_plus_protected_is_tree_size(s: RadixSnapshot) -> Violation:
    """``evictable_size`` counts the unlocked nodes' tokens, ``protected_size`` the locked ones';
    no lock count is negative."""
    free = sum(len(n.value) for n in s.nodes if n.lock_ref == 0)
    held = sum(len(n.value) for n in s.nodes if n.lock_ref > 0)
    negative = [list(n.path) for n in s.nodes if n.lock_ref < 0]
    if negative:
        return f"negative lock_ref at {negative}"
    if (s.evictable_size, s.protected_size) != (free, held):
        return (
            f"evictable/protected {s.evictable_size}/{s.protected_size}, the tree has {free}/{held}"
        )
    return None


def radix_lock_refs_match_holders(s: RadixSnapshot) -> Violation:
    """Every node's ``lock_ref`` is the number of live requests whose locked node is it or lies
    below it (a lock covers the whole path from the root)."""
    for n in s.nodes:
        holders = sum(
            1 for r in s.requests if r.locked is not None and r.locked[: len(n.path)] == n.path
        )
        if n.lock_ref != holders:
            return f"node {list(n.path)} has lock_ref {n.lock_ref}, {holders} live holders"
    return None


def radix_rows_match_tree(s: RadixSnapshot) -> Violation:
    """A live request's tree-owned prefix is the path to its locked node: the same tokens and
    the same slots."""
    by_path = {n.path: n for n in s.nodes}
    for r in s.requests:
        if r.locked is None:
            continue
        slots: list[int] = []
        path = r.locked
        while path:
            node = by_path.get(path)
            if node is None:
                return f"request {r.rid} locks {list(r.locked)}, not in the tree"
            slots[:0] = node.value
            path = path[: node.start]
        if r.tokens[: len(r.locked)] != r.locked or tuple(slots) != r.row[: r.protected]:
            return f"request {r.rid}'s prefix row {list(r.row[: r.protected])} is not its path"
    return None


def tree_page_aligned(s: RadixSnapshot) -> Violation:
    """Every node starts and ends on a page boundary and holds whole pages (consecutive slots
    from a page's first)."""
    ps = s.page_size
    for n in s.nodes:
        v = n.value
        if n.start % ps or len(v) % ps or len(v) != len(n.path) - n.start or not v:
            return f"node {list(n.path)} (start {n.start}, {len(v)} slots) is not whole pages"
        for i in range(0, len(v), ps):
            if v[i] % ps or list(v[i : i + ps]) != list(range(v[i], v[i] + ps)):
                return f"node {list(n.path)} holds a broken page {list(v[i : i + ps])}"
    return None


def radix_no_locked_eviction(before: RadixSnapshot, after: RadixSnapshot) -> Violation:
    """No node locked before a call is gone after it."""
    kept = {n.path for n in after.nodes}
    lost = [list(n.path) for n in before.nodes if n.lock_ref > 0 and n.path not in kept]
    return f"locked nodes evicted: {lost}" if lost else None


INVARIANT_NAMES: tuple[str, ...] = (
    # block manager (InfiniLM), one snapshot
    "free_and_used_partition_pool",  # the free deque and the used set partition the pool
    "free_pages_unreferenced",  # free pages have ref 0 and no hash; no negative ref count
    "prefix_index_consistent",  # the prefix index and the page hashes agree; indexed pages used
    # block manager, against the holders a driver knows
    "referenced_count_matches_live_pages",  # usable counter and ref counts match live holders
    "no_live_eviction",  # no held page is freed or evicted (offload: offload_no_live_eviction)
    "no_leak_at_quiescence",  # with no holder left, every page is unreferenced
    # comparison-only: spec vs target, or one snapshot before vs after a call
    "identical_eviction_order",  # comparison-only: spec and target free/evict in the same order
    "atomic_failure",  # comparison-only: a rejected validate-first call changed nothing
    # InfiniLM scheduler
    "request_in_exactly_one_place",  # each live request is waiting, running or remote, once
    "reservation_counter_matches_scan",  # the decode-reservation counter equals the scan
    "pending_counter_matches_scan",  # pending_kv_decode_blocks equals the remote scan
    "admission_soundness",  # a question, checked on demand: no decode OOM without drafts
    # vLLM CPU offload manager, ARC, LRU
    "arc_lists_bounded",  # ARC's four lists and target within N, disjoint, T1+T2 cached
    "lru_order_consistent",  # the LRU order lists each evictable key once
    "offload_ids_partition_pool",  # free ids and cached ids partition the ids handed out
    "evictable_counter_matches_scan",  # #45757: the evictable counter equals the idle scan
    # vLLM GPU prefix cache (besides the shared names above)
    "free_counter_matches_queue",  # num_free_blocks is the queue's length; usage follows it
    "null_block_reserved",  # block 0 is never free, cached or held
    "cached_blocks_are_a_prefix",  # a request's blocks past its cached count carry no hash
    "block_hashes_match_content",  # a request's cached blocks carry its own prefix hashes
    # SGLang radix cache (besides the shared names above)
    "evictable_plus_protected_is_tree_size",  # the two size counters split the tree's tokens
    "no_slot_free_and_cached",  # no page is both on the free list and in a tree node
    "tree_page_aligned",  # node keys are whole pages; a node's slots are whole pages
)
