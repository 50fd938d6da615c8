"""Behavioural tests of InfiniLM v0.2.9c's ``BlockManager`` and ``MambaCacheManager``.

Every behavioural test runs against both the executable spec and the optimised implementation
(ids ``spec`` and ``impl``). Section numbers refer to docs/infinilm.md.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import xxhash

from impl.infinilm import block_manager as impl_bm
from spec.errors import (
    DoubleFreeError,
    InvalidArgument,
    InvalidPageId,
    OutOfBlocksError,
    PageStateError,
    RehashError,
    TableTooShort,
)
from spec.infinilm import block_manager as spec_bm
from spec.infinilm.prefix_cache import chain_hashes, hash_block_tokens

# ----------------------------------------------------------------------------- helpers


@pytest.fixture(params=[spec_bm.BlockManager, impl_bm.BlockManager], ids=["spec", "impl"])
def make(request):
    """The BlockManager class under test."""
    return request.param


@pytest.fixture(params=[spec_bm.MambaCacheManager, impl_bm.MambaCacheManager], ids=["spec", "impl"])
def make_mamba(request):
    """The MambaCacheManager class under test."""
    return request.param


def h(i):
    """A distinct 16-byte prefix hash."""
    return hash_block_tokens([i])


def alloc(bm, num_tokens):
    """A fresh block table covering ``num_tokens`` tokens (no prefix hit)."""
    out = bm.allocate_slots(num_tokens)
    assert out is not None
    return out[0]


def publish_all(bm, table, hashes):
    """Publish every page of ``table`` under ``hashes``."""
    return bm.publish_computed_blocks(table, hashes, 0, len(table) * bm.block_size)


def refs(bm, pages):
    return [bm.blocks[p].ref_count for p in pages]


def free_list(bm):
    return list(bm.free_block_ids)


def evictable(bm):
    """Ref-0 used pages in set iteration order: the legacy eviction order (§3.8)."""
    return [p for p in bm.used_block_ids if bm.blocks[p].ref_count == 0]


def churned_manager(make):
    """N=64, B=4 with used == {29, 60}, both ref 0, whose set iterates [60, 29] (§3.8).

    Pages 0..63 are allocated one at a time; all but 29 and 60 are released and evicted at once
    (quirk A evicts exactly the one candidate), so the used set stays small and 60 lands in an
    earlier hash-table slot than 29.
    """
    bm = make(64, 4)
    held = []
    for page in range(64):
        table = alloc(bm, 4)
        assert table == [page]
        if page in (29, 60):
            held.append(table)
            continue
        bm.free_blocks(table)
        assert bm.try_free_blocks(0)
    for table in held:
        bm.free_blocks(table)
    return bm


# ----------------------------------------------------------------------------- construction


def test_constructor_rejects_non_positive_sizes(make):
    for num_blocks, block_size in [(0, 4), (4, 0), (-1, 4), (4, -1)]:
        with pytest.raises(InvalidArgument):
            make(num_blocks, block_size)
    bm = make(3, 4)
    assert free_list(bm) == [0, 1, 2] and not bm.used_block_ids and not bm.hash_to_block_ids


# ----------------------------------------------------------------------------- reclamation


def test_quirk_a_evicts_one_when_capacity_suffices(make):
    bm = make(3, 4)
    bm.free_blocks(alloc(bm, 4))  # page 0 released, stays in used
    assert free_list(bm) == [1, 2]
    assert bm.try_free_blocks(1) is True
    assert free_list(bm) == [1, 2, 0] and not bm.used_block_ids


def test_quirk_a_evicts_exactly_one_of_several_candidates(make):
    bm = make(4, 4)
    bm.free_blocks(alloc(bm, 8))  # pages 0, 1 released
    first = evictable(bm)[0]
    assert bm.try_free_blocks(1) is True
    assert free_list(bm) == [2, 3, first] and len(bm.used_block_ids) == 1


def test_quirk_a_no_candidates_returns_true_and_evicts_nothing(make):
    bm = make(3, 4)
    alloc(bm, 4)  # page 0 live
    before = bm.snapshot()
    assert bm.try_free_blocks(1) is True
    assert bm.try_free_blocks(0) is True
    assert bm.snapshot() == before


def test_quirk_b_failed_reclaim_evicts_every_candidate(make):
    bm = make(6, 4)
    table = alloc(bm, 20)  # pages 0..4, free=[5]
    bm.free_blocks([table[2]])  # page 2: ref 0, unhashed
    assert bm.allocate_slots(12) is None
    assert free_list(bm) == [5, 2]
    assert set(bm.used_block_ids) == {0, 1, 3, 4}
    assert bm.allocate_slots(4)[0] == [5]


def test_quirk_b_failed_reclaim_flushes_prefix_index(make):
    bm = make(6, 4)
    table = alloc(bm, 20)  # pages 0..4
    publish_all(bm, table[:2], [h(0), h(1)])
    bm.free_blocks(table[:2])  # two hashed, cached pages
    assert bm.allocate_slots(16) is None  # needs 4, at most 1 + 2 reachable
    assert sorted(bm.free_block_ids) == [0, 1, 5]
    assert bm.hash_to_block_ids == {}
    assert [bm.blocks[p].hash for p in (0, 1)] == [b"", b""]
    assert bm.get_computed_blocks([h(0), h(1)], 8) == ([], 0)


def test_try_free_blocks_never_evicts_referenced_pages(make):
    bm = make(4, 4)
    live = alloc(bm, 12)  # pages 0..2 live, free=[3]
    before = bm.snapshot()
    assert bm.try_free_blocks(4) is False
    assert bm.snapshot() == before and refs(bm, live) == [1, 1, 1]


def test_eviction_follows_set_iteration_order(make):
    bm = churned_manager(make)
    order = evictable(bm)
    assert order == [60, 29] and order != sorted(order)
    assert bm.try_free_blocks(64) is True  # evicts both
    assert free_list(bm)[-2:] == order


def test_quirk_a_evicts_first_in_set_order_not_lowest_id(make):
    bm = churned_manager(make)
    assert bm.try_free_blocks(1) is True
    assert free_list(bm)[-1] == 60 and list(bm.used_block_ids) == [29]


# ----------------------------------------------------------------------------- free deque


def test_free_deque_is_fifo(make):
    bm = make(5, 4)
    table = alloc(bm, 12)  # popleft: never-used pages in id order
    assert table == [0, 1, 2] and free_list(bm) == [3, 4]
    assert bm.truncate_blocks(table, 4) == [0]  # truncation appends right, in table order
    assert free_list(bm) == [3, 4, 1, 2]
    bm.free_blocks([0])
    bm.try_free_blocks(0)  # eviction appends right too
    assert free_list(bm) == [3, 4, 1, 2, 0]
    assert [alloc(bm, 4)[0] for _ in range(5)] == [3, 4, 1, 2, 0]


def test_unhashed_released_pages_linger_in_used(make):
    bm = make(3, 16)
    table, slots = bm.allocate_slots(17)
    assert table == [0, 1] and slots == list(range(17))
    bm.free_blocks(table)
    assert free_list(bm) == [2]
    assert set(bm.used_block_ids) == {0, 1} and refs(bm, [0, 1]) == [0, 0]
    assert bm.get_total_usable_blocks() == 3
    assert bm.get_num_free_blocks() == 1


# ----------------------------------------------------------------------------- prefix index


def test_duplicate_hash_pages_both_indexed(make):
    bm = make(4, 4)
    a, b = alloc(bm, 4), alloc(bm, 4)
    publish_all(bm, a, [h(7)])
    publish_all(bm, b, [h(7)])  # publishing never deduplicates
    assert bm.hash_to_block_ids == {h(7): {a[0], b[0]}}
    expected = next(iter(bm.hash_to_block_ids[h(7)]))
    assert bm.get_computed_blocks([h(7)], 4) == ([expected], 4)
    assert bm.blocks[expected].ref_count == 2


def test_duplicate_hash_survives_other_copy_eviction(make):
    bm = make(4, 4)
    a, b = alloc(bm, 4), alloc(bm, 4)
    publish_all(bm, a, [h(7)])
    publish_all(bm, b, [h(7)])
    bm.free_blocks(a)  # only copy a is evictable
    assert bm.try_free_blocks(3) is True
    assert free_list(bm)[-1] == a[0]
    assert bm.hash_to_block_ids == {h(7): {b[0]}} and bm.blocks[a[0]].hash == b""
    assert bm.get_computed_blocks([h(7)], 4) == (b, 4)


def test_prefix_hit_cap_p_minus_1(make):
    bm = make(8, 16)
    hashes = chain_hashes(list(range(64)), 16)
    table = alloc(bm, 64)
    assert publish_all(bm, table, hashes) == 4
    bm.free_blocks(table)
    assert bm.get_computed_blocks(hashes, 64 - 1) == (table[:3], 48)
    bm.free_blocks(table[:3])
    assert bm.get_computed_blocks(hashes, 64) == (table, 64)


def test_lookup_stops_at_first_miss(make):
    bm = make(8, 4)
    table = alloc(bm, 12)
    publish_all(bm, table, [h(0), h(1), h(2)])
    bm.free_blocks(table)
    before = bm.snapshot()
    assert bm.get_computed_blocks([h(0), h(99), h(2)], 12) == ([table[0]], 4)
    assert refs(bm, table) == [1, 0, 0]
    bm.free_blocks(table[:1])
    assert bm.get_computed_blocks([h(0)], -5) == ([], 0)  # negative cap: no hit
    assert bm.snapshot() == before


def test_lookup_pins_cached_ref0_page(make):
    bm = make(4, 4)
    table = alloc(bm, 4)
    publish_all(bm, table, [h(0)])
    bm.free_blocks(table)
    assert bm.get_total_usable_blocks() == 4 and refs(bm, table) == [0]
    assert bm.get_computed_blocks([h(0)], 4) == (table, 4)
    assert refs(bm, table) == [1] and bm.get_total_usable_blocks() == 3
    assert table[0] in bm.used_block_ids and bm.hash_to_block_ids == {h(0): {table[0]}}


def test_publish_rejects_rehash_without_change(make):
    bm = make(4, 4)
    table = alloc(bm, 8)
    assert bm.publish_computed_blocks(table, [h(0), h(1)], 1, 8) == 2  # page 1 only
    before = bm.snapshot()
    with pytest.raises(RehashError):  # page 0 is valid, page 1 would change its hash
        bm.publish_computed_blocks(table, [h(0), h(5)], 0, 8)
    with pytest.raises(RehashError):  # even the same hash is refused
        bm.publish_computed_blocks(table, [h(0), h(1)], 0, 8)
    assert bm.snapshot() == before and bm.blocks[table[0]].hash == b""


def test_publish_rejects_start_after_end(make):
    bm = make(4, 4)
    table = alloc(bm, 8)
    before = bm.snapshot()
    with pytest.raises(InvalidArgument):
        bm.publish_computed_blocks(table, [h(0), h(1)], 2, 4)  # end = 1
    assert bm.snapshot() == before


# ----------------------------------------------------------------------------- allocate_slots


def test_allocate_rejects_negative_counts(make):
    bm = make(4, 4)
    before = bm.snapshot()
    with pytest.raises(InvalidArgument):
        bm.allocate_slots(-1)
    with pytest.raises(InvalidArgument):
        bm.allocate_slots(4, -1)
    assert bm.snapshot() == before


def test_allocate_rejects_cached_table_longer_than_computed(make):
    bm = make(4, 4)
    cached = alloc(bm, 4)
    before = bm.snapshot()
    with pytest.raises(InvalidArgument):
        bm.allocate_slots(4, 3, cached)  # 1 cached page = 4 tokens > 3 computed
    assert bm.snapshot() == before


def test_allocate_slots_slots_start_at_computed_tokens(make):
    bm = make(8, 4)
    table = alloc(bm, 12)
    bm.publish_computed_blocks(table, [h(0)], 0, 4)  # page 0 is a cached prefix page
    bm.truncate_blocks(table, 4)  # free deque is now [3..7, 1, 2]
    bm.free_blocks([0])
    cached, hit_tokens = bm.get_computed_blocks([h(0)], 12)
    assert (cached, hit_tokens) == ([0], 4)
    table, slots = bm.allocate_slots(3, 9, cached)  # tokens 4..8 arrive from a remote node
    assert table == [0, 3, 4] and table is not cached  # pages for all 12 tokens
    assert slots == [table[t // 4] * 4 + t % 4 for t in range(9, 12)] == [17, 18, 19]


def test_allocate_slots_returns_new_list_with_cached_prefix(make):
    bm = make(8, 4)
    cached = alloc(bm, 4)
    table, slots = bm.allocate_slots(2, 4, cached)
    assert table == [0, 1] and slots == [4, 5]
    assert table is not cached and cached == [0]


# ----------------------------------------------------------------------------- append_slot(s)


def test_append_slot_allocates_at_page_start_in_place(make):
    bm = make(4, 4)
    table = alloc(bm, 4)
    out, slot = bm.append_slot(table, 5)  # token 4 starts page 2
    assert out is table and table == [0, 1] and slot == 4
    out, slot = bm.append_slot(table, 6)  # token 5 fits in page 1
    assert out is table and table == [0, 1] and slot == 5


def test_append_slot_trusts_table_length(make):
    bm = make(4, 4)
    table = alloc(bm, 8)  # pages [0, 1]
    before = bm.snapshot()
    assert bm.append_slot(table, 3) == ([0, 1], 6)  # §9.19: token 2 mapped into the last page
    assert bm.snapshot() == before


def test_append_slot_out_of_blocks_keeps_evictions(make):
    # append_slot reclaims only when the free deque is empty, so it fails only when nothing is
    # evictable: nothing changes.
    bm = make(2, 4)
    table = alloc(bm, 8)
    before = bm.snapshot()
    with pytest.raises(OutOfBlocksError):
        bm.append_slot(table, 9)
    assert table == [0, 1] and bm.snapshot() == before
    # append_slots needs two pages: reclaim evicts the only candidate, then fails; it stays evicted.
    bm = make(3, 4)
    request, other = alloc(bm, 4), alloc(bm, 8)
    bm.free_blocks(other[1:])  # page 2: ref 0, evictable
    with pytest.raises(OutOfBlocksError):
        bm.append_slots(request, 5, 5)  # tokens 4..8 need 2 fresh pages
    assert request == [0] and free_list(bm) == [2] and 2 not in bm.used_block_ids


def test_append_slots_rejects_wrong_table_length(make):
    bm = make(4, 4)
    table = alloc(bm, 4)
    before = bm.snapshot()
    for start, num_slots in [(6, 2), (1, 2), (0, 1), (4, -1)]:
        with pytest.raises(InvalidArgument):
            bm.append_slots(table, start, num_slots)
    assert table == [0] and bm.snapshot() == before


def test_append_slots_zero_returns_same_list(make):
    bm = make(4, 4)
    table = alloc(bm, 4)
    before = bm.snapshot()
    out, slots = bm.append_slots(table, 999, 0)  # nothing else is validated
    assert out is table and slots == [] and bm.snapshot() == before


def test_append_slots_and_truncate_round_trip(make):
    bm = make(8, 4)
    table = alloc(bm, 5)  # L = 5 tokens: pages [0, 1]
    draft = list(table)
    out, slots = bm.append_slots(draft, 5 + 1, 9)  # tokens 5..13
    assert out is draft and draft == [0, 1, 2, 3]
    assert slots == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    kept = bm.truncate_blocks(draft, 5)
    assert kept == table and kept is not draft and draft == [0, 1, 2, 3]
    assert free_list(bm) == [4, 5, 6, 7, 2, 3]
    assert set(bm.used_block_ids) == {0, 1} and refs(bm, table) == [1, 1]


# ----------------------------------------------------------------------------- truncate_blocks


def test_truncate_validates_all_before_mutating(make):
    bm = make(4, 4)
    table = alloc(bm, 12)  # pages 0..2
    bm.publish_computed_blocks(table, [h(0), h(1), h(2)], 2, 12)  # publish page 2 only
    assert bm.get_computed_blocks([h(2)], 4) == ([table[2]], 4)  # page 2 now shared: ref 2
    before = bm.snapshot()
    with pytest.raises(PageStateError):  # page 1 is fine, page 2 is not
        bm.truncate_blocks(table, 4)
    assert bm.snapshot() == before


def test_truncate_checks_retained_partial_page(make):
    bm = make(4, 4)
    table = alloc(bm, 12)
    bm.publish_computed_blocks(table, [h(0), h(1)], 1, 8)  # page 1 hashed
    before = bm.snapshot()
    with pytest.raises(PageStateError):  # keep 5: partial page 1 must be exclusive and unhashed
        bm.truncate_blocks(table, 5)
    assert bm.snapshot() == before
    assert bm.truncate_blocks(table, 8) == table[:2]  # a full retained page is not checked


def test_truncate_rejects_duplicate_ids(make):
    bm = make(4, 4)
    table = alloc(bm, 8)
    before = bm.snapshot()
    with pytest.raises(PageStateError):
        bm.truncate_blocks([*table, table[1]], 4)
    for keep in (0, -1, 9):
        with pytest.raises(InvalidArgument):
            bm.truncate_blocks(table, keep)
    assert bm.snapshot() == before


# ----------------------------------------------------------------------------- free_blocks


def test_free_blocks_partial_mutation_on_double_free(make):
    bm = make(4, 4)
    a, b = alloc(bm, 4), alloc(bm, 4)
    bm.free_blocks(a)  # a: ref 0
    with pytest.raises(DoubleFreeError):
        bm.free_blocks([*a, *b])  # reversed: b decremented first, then a fails
    assert refs(bm, [a[0], b[0]]) == [0, 0]
    assert isinstance(DoubleFreeError(), AssertionError)


def test_free_blocks_rejects_negative_and_out_of_range_ids(make):
    bm = make(4, 4)
    alloc(bm, 16)  # every page live, so upstream's alias of -1 (page 3) would "succeed"
    before = bm.snapshot()
    for bad in (-1, 4):
        with pytest.raises(InvalidPageId):
            bm.free_blocks([0, bad])  # the last entry is checked first
    assert bm.snapshot() == before


def test_free_blocks_keeps_pages_in_used_and_counts_multiplicity(make):
    bm = make(4, 4)
    table = alloc(bm, 4)
    publish_all(bm, table, [h(0)])
    bm.get_computed_blocks([h(0)], 4)
    assert refs(bm, table) == [2] and bm.get_total_usable_blocks() == 3
    bm.free_blocks(table)
    assert refs(bm, table) == [1] and bm.get_total_usable_blocks() == 3
    bm.free_blocks(table)
    assert refs(bm, table) == [0] and bm.get_total_usable_blocks() == 4
    assert table[0] in bm.used_block_ids and bm.get_num_free_blocks() == 3


# ----------------------------------------------------------------------------- update_blocks_slot


def test_update_blocks_slot(make):
    bm = make(4, 4)
    assert bm.update_blocks_slot([3, 1], 5, 5) == []
    assert bm.update_blocks_slot([3, 1], 6, 5) == []
    assert bm.update_blocks_slot([3, 1], 2, 6) == [14, 15, 4, 5]
    with pytest.raises(TableTooShort):
        bm.update_blocks_slot([3], 2, 6)


# ----------------------------------------------------------------------------- lockstep lifecycle


class Lifecycle:
    """Random request lifecycles, applied identically to several managers."""

    def __init__(self, managers, seed, block_size):
        self.managers = managers
        self.rng = random.Random(seed)
        self.block_size = block_size
        self.requests = []  # [tables per manager, hashes, num_tokens, indexed blocks]

    def call(self, method, *args_per_manager):
        """Call ``method`` on every manager; results (or exception types) must agree."""
        results = []
        for bm, args in zip(self.managers, args_per_manager, strict=True):
            try:
                results.append(getattr(bm, method)(*args))
            except (OutOfBlocksError, PageStateError) as exc:
                results.append(type(exc))
        assert all(r == results[0] for r in results), (method, results)
        return results

    def same(self, method, *args):
        return self.call(method, *([args] * len(self.managers)))

    def step(self):
        rng, n = self.rng, len(self.managers)
        op = rng.choice(["admit", "admit", "decode", "decode", "release", "reclaim", "spec"])
        if op == "admit":
            prompt = [rng.randint(0, 1) for _ in range(rng.randint(1, 14))]
            hashes = chain_hashes(prompt, self.block_size)
            hits = self.same("get_computed_blocks", hashes, len(prompt) - 1)
            cached, hit_tokens = hits[0]
            out = self.same("allocate_slots", len(prompt) - hit_tokens, hit_tokens, cached)
            if out[0] is None:
                if cached:
                    self.same("free_blocks", cached)
                return
            tables = [o[0] for o in out]
            end = self.call(
                "publish_computed_blocks", *[(t, hashes, len(cached), len(prompt)) for t in tables]
            )
            self.requests.append([tables, hashes, len(prompt), end[0]])
        elif op == "decode" and self.requests:
            req = rng.choice(self.requests)
            res = self.call("append_slot", *[(t, req[2] + 1) for t in req[0]])
            if res[0] is not OutOfBlocksError:
                req[2] += 1
        elif op == "release" and self.requests:
            req = self.requests.pop(rng.randrange(len(self.requests)))
            self.call("free_blocks", *[(t,) for t in req[0]])
        elif op == "reclaim":
            self.same("try_free_blocks", rng.randint(0, 3))
        elif op == "spec" and self.requests:
            req = rng.choice(self.requests)
            drafts = [list(t) for t in req[0]]
            k = rng.randint(1, 6)
            res = self.call("append_slots", *[(d, req[2] + 1, k) for d in drafts])
            if res[0] is not OutOfBlocksError:
                self.call("truncate_blocks", *[(d, req[2]) for d in drafts])
        snapshots = [bm.snapshot() for bm in self.managers]
        assert snapshots == [snapshots[0]] * n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_usable_counter_matches_scan_after_lifecycle(seed):
    spec, impl = spec_bm.BlockManager(12, 4), impl_bm.BlockManager(12, 4)
    life = Lifecycle([spec, impl], seed, 4)
    for _ in range(400):
        life.step()
        scanned = impl.num_blocks - sum(1 for b in impl.blocks if b.ref_count > 0)
        assert impl.get_total_usable_blocks() == scanned == spec.get_total_usable_blocks()


# ----------------------------------------------------------------------------- mamba rows


def test_mamba_row_zero_never_handed_out(make_mamba):
    rows = make_mamba(3)
    assert [rows.allocate(), rows.allocate(), rows.allocate()] == [1, 2, None]
    assert not rows.can_allocate()
    rows.free(0)  # the zero-state row is ignored
    assert not rows.can_allocate() and 0 not in rows.free_block_ids


def test_mamba_free_is_idempotent(make_mamba):
    rows = make_mamba(3)
    row = rows.allocate()
    for _ in range(2):
        rows.free(row)
    rows.free(None)
    rows.free(99)
    assert list(rows.free_block_ids) == [2, 1] and not rows.used_block_ids


def test_mamba_rejects_fewer_than_two_rows(make_mamba):
    for size in (1, 0, -1):
        with pytest.raises(InvalidArgument):
            make_mamba(size)
    assert list(make_mamba(2).free_block_ids) == [1]


def test_mamba_reuse_is_fifo(make_mamba):
    rows = make_mamba(4)
    assert [rows.allocate() for _ in range(3)] == [1, 2, 3]
    rows.free(2)
    rows.free(1)
    assert rows.can_allocate()
    assert [rows.allocate(), rows.allocate(), rows.allocate()] == [2, 1, None]


# ----------------------------------------------------------------------------- hashing


def test_chain_hashes_matches_reference_scheme():
    def reference(tokens, parent):
        data = b"InfiniLM-prefix-cache-v1\0" + (parent or b"\0") + len(tokens).to_bytes(4, "little")
        return xxhash.xxh3_128(data + np.asarray(tokens, dtype="<i4").tobytes()).digest()

    first = reference([1, 2], b"")
    assert hash_block_tokens([1, 2], b"") == first and len(first) == 16
    assert hash_block_tokens([3, 4], first) == reference([3, 4], first)
    assert chain_hashes([1, 2, 3, 4, 5], 2) == [first, reference([3, 4], first)]  # tail unhashed
    for bad_parent in (b"\0", bytes(15), bytes(17)):
        with pytest.raises(ValueError):
            hash_block_tokens([1, 2], bad_parent)
