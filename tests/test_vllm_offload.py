"""Behavioural tests of vLLM's CPU offload manager and its ARC / LRU policies.

Every behavioural test runs against both the executable spec and the production implementation
(ids ``spec`` and ``impl``); the seeded lockstep test at the end drives the two side by side.
Section numbers refer to docs/vllm.md.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from impl.vllm import arc as impl_arc
from impl.vllm import lru as impl_lru
from impl.vllm import offload_manager as impl_om
from spec.errors import DoubleFreeError, InvalidArgument, OffloadStateError, exception_kind
from spec.vllm import BlockStatus
from spec.vllm import arc as spec_arc
from spec.vllm import lru as spec_lru
from spec.vllm import offload_manager as spec_om
from spec.vllm.arc import ARCSnapshot
from spec.vllm.offload_manager import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadManagerSnapshot,
    PrepareStoreOutput,
)

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(
    params=[spec_om.CPUOffloadingManager, impl_om.CPUOffloadingManager], ids=["spec", "impl"]
)
def make(request):
    """The CPUOffloadingManager class under test."""
    return request.param


@pytest.fixture(params=[spec_arc.ARCCachePolicy, impl_arc.ARCCachePolicy], ids=["spec", "impl"])
def make_arc(request):
    """The ARCCachePolicy class under test."""
    return request.param


@pytest.fixture(params=[spec_lru.LRUCachePolicy, impl_lru.LRUCachePolicy], ids=["spec", "impl"])
def make_lru(request):
    """The LRUCachePolicy class under test."""
    return request.param


POLICIES = [
    pytest.param({"cache_policy": "lru", "lru": "v1"}, id="lru-v1"),
    pytest.param({"cache_policy": "lru", "lru": "v2"}, id="lru-v2"),
    pytest.param({"cache_policy": "arc", "arc_t1_fallback": False}, id="arc"),
    pytest.param({"cache_policy": "arc", "arc_t1_fallback": True}, id="arc-fallback"),
]

# ----------------------------------------------------------------------------- helpers


def store(m, keys):
    """prepare_store + complete_store; returns the new block ids."""
    out = m.prepare_store(keys)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return list(out.store_spec.block_ids)


def ids(out):
    return list(out.store_spec.block_ids)


def arc(m):
    """(T1, T2, B1, B2, target) of a manager's ARC policy."""
    p = m.snapshot().policy
    assert isinstance(p, ARCSnapshot)
    return list(p.t1), list(p.t2), list(p.b1), list(p.b2), p.target_t1_size


def refs(m):
    """key -> ref_cnt of every cached block."""
    return {k: r for _, k, r in m.snapshot().policy.blocks}


def idle_arc_policy(make_arc, t1, t2, capacity=8, **kw):
    """An ARC policy whose T1 and T2 hold idle blocks with the given keys, in the given order."""
    p = make_arc(capacity, **kw)
    for i, key in enumerate([*t2, *t1]):
        p.insert(key, BlockStatus(i, ref_cnt=0))
    for key in t2:
        p.touch([key])  # ready T1 -> T2 MRU, so T2 ends in the given order
    assert list(p.t1) == list(t1) and list(p.t2) == list(t2)
    return p


def keys_of(victims):
    return None if victims is None else [k for k, _ in victims]


# ============================================================================= lookup, loads


def test_lookup_miss_pending_hit(make):
    """§1.2, #41795: not cached -> MISS, store in flight -> HIT_PENDING, stored -> HIT."""
    m = make(4)
    assert m.lookup(1) is MISS
    m.prepare_store([1])
    assert m.lookup(1) is PENDING
    m.complete_store([1])
    assert m.lookup(1) is HIT


def test_prepare_load_ids_are_coindexed_with_keys(make):
    """§4 test_prepare_load_preserves_key_order: ids come back in the order of the keys."""
    m = make(4)
    assert store(m, [1, 2, 3]) == [0, 1, 2]
    assert m.prepare_load([3, 1, 2]) == CPULoadStoreSpec((2, 0, 1))
    assert refs(m) == {1: 1, 2: 1, 3: 1}


def test_repeated_load_pins_twice_and_needs_two_completions(make):
    m = make(2)
    store(m, [1])
    m.prepare_load([1, 1])
    assert refs(m) == {1: 2} and m._num_evictable_cache_blocks == 0
    m.complete_load([1])
    assert refs(m) == {1: 1} and m._num_evictable_cache_blocks == 0
    m.complete_load([1])
    assert refs(m) == {1: 0} and m._num_evictable_cache_blocks == 1


# ============================================================================= block-id pool


@pytest.mark.parametrize("policy", POLICIES)
def test_block_ids_fresh_ascending_then_freed_lifo(make, policy):
    """§1.2, §8: fresh ids first, then the free list as a stack: evicting ids [0,1,2] in that
    order and allocating three gives [2,1,0]."""
    m = make(3, **policy)
    assert store(m, ["a", "b", "c"]) == [0, 1, 2]
    out = m.prepare_store(["d", "e", "f"])
    assert out.evicted_keys == ["a", "b", "c"]
    assert ids(out) == [2, 1, 0]
    assert m.snapshot().free_list == ()


def test_fresh_ids_before_freed_ids(make):
    m = make(4)
    assert store(m, [1, 2]) == [0, 1]
    m.prepare_store([3])
    m.complete_store([3], success=False)  # id 2 freed
    assert m.snapshot().free_list == (2,) and m.snapshot().num_allocated_blocks == 3
    assert ids(m.prepare_store([4, 5])) == [3, 2]  # fresh 3 first, then the freed 2


# ============================================================================= failed stores


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_store_removes_pending_keys_frees_ids_lifo_no_ghost_no_event(make, policy):
    """§1.2 complete_store(success=False), §4 test_failed_store, O4: pending keys disappear
    (no ghost entry, no event), their ids are pushed in call order, ready keys are untouched."""
    m = make(4, enable_events=True, **policy)
    store(m, [1, 2])
    m.prepare_store([3, 4])
    list(m.take_events())
    before = m.snapshot()
    m.complete_store([4, 1, 3], success=False)
    after = m.snapshot()
    assert [m.lookup(k) for k in (1, 2, 3, 4)] == [HIT, HIT, MISS, MISS]
    assert after.free_list == (3, 2)  # 4 (id 3) pushed before 3 (id 2)
    assert list(m.take_events()) == []
    if isinstance(after.policy, ARCSnapshot):
        assert after.policy.b1 == after.policy.b2 == ()
    assert after.policy.blocks == tuple(e for e in before.policy.blocks if e[1] in (1, 2))
    assert ids(m.prepare_store([5, 6])) == [2, 3]  # LIFO reuse


def test_complete_store_skips_ready_and_unknown_keys(make):
    """§1.2, §3.2 last row: already-ready and unknown keys are skipped (not an error)."""
    m = make(4, enable_events=True)
    store(m, [7])
    m.prepare_store([9])
    list(m.take_events())
    m.complete_store([7, 9, 42], success=False)
    assert (m.lookup(7), m.lookup(9), m.lookup(42)) == (HIT, MISS, MISS)
    before = m.snapshot()
    m.complete_store([7, 42])  # nothing pending: no change, no event
    assert m.snapshot() == before and list(m.take_events()) == []


# ============================================================================= #35846, #45757


@pytest.mark.parametrize("policy", POLICIES)
def test_prepare_store_protects_every_input_key(make, policy):
    """#35846, §4 test_already_stored_block_not_evicted_during_prepare_store: key 2 is already
    stored and idle, first in LRU/T1 order after 1, but is part of the batch: 1 is evicted."""
    m = make(4, **policy)
    assert store(m, [1, 2]) == [0, 1]
    out = m.prepare_store([2, 3, 4, 5])
    assert out.keys_to_store == [3, 4, 5]
    assert ids(out) == [2, 3, 0]
    assert out.evicted_keys == [1]
    assert m.lookup(2) is HIT


@pytest.mark.parametrize("policy", POLICIES)
def test_protection_fails_store_when_only_input_keys_are_idle(make, policy):
    """The only idle block is in the batch: the guard passes (1 idle) but eviction fails."""
    m = make(1, **policy)
    store(m, [1])
    before = m.snapshot()
    assert m.prepare_store([1, 2]) is None
    assert m.snapshot() == before


def test_threshold_filtered_stored_key_is_not_protected(make):
    """§1.2 quirk: ``protected`` is built after the store-threshold filter, so an already-stored
    key that the filter drops (here: forgotten by the full tracker) is evicted by the same call
    that lists it. Without the filter it would be protected and the store would fail."""
    m = make(1, store_threshold=2, max_tracker_size=2)
    for key in (1, 1, 2, 2):
        m.lookup(key)
    store(m, [1])
    m.lookup(3)  # tracker full: key 1, the oldest entry, is forgotten
    assert m.snapshot().counts == ((2, 2), (3, 1))
    out = m.prepare_store([1, 2])
    assert (out.keys_to_store, out.evicted_keys) == ([2], [1])
    assert m.stores_skipped_in_current_batch == 1
    plain = make(1)
    store(plain, [1])
    assert plain.prepare_store([1, 2]) is None


def test_store_threshold_tracker(make):
    """#41727: only keys looked up ``store_threshold`` times are stored; the tracker is an LRU of
    at most ``max_tracker_size`` keys; skipped keys are counted."""
    m = make(4, store_threshold=2, max_tracker_size=2)
    assert m.prepare_store([1]) == PrepareStoreOutput([], CPULoadStoreSpec(()), [])
    assert m.stores_skipped_in_current_batch == 1
    m.lookup(1)
    m.lookup(1)
    m.lookup(2)
    assert m.snapshot().counts == ((1, 2), (2, 1))
    m.lookup(3)  # tracker full: the oldest entry (1) is dropped
    assert m.snapshot().counts == ((2, 1), (3, 1))
    m.lookup(2)
    assert m.snapshot().counts == ((3, 1), (2, 2))
    out = m.prepare_store([1, 2, 3])
    assert out.keys_to_store == [2]
    assert m.stores_skipped_in_current_batch == 3


def test_evictable_guard_fails_fast_without_calling_the_policy(make):
    """#45757, §4 test_evictable_cache_block_count's spy: when more blocks must be evicted than
    are idle, ``prepare_store`` returns None before ``policy.evict`` is called."""
    m = make(2)
    store(m, [1, 2])
    m.prepare_load([1])
    calls = []
    real_evict = m._policy.evict
    m._policy.evict = lambda n, protected: calls.append(n) or real_evict(n, protected)
    before = m.snapshot()
    assert m.prepare_store([3, 4]) is None  # need 2 > 1 idle
    assert calls == [] and m.snapshot() == before
    assert m.prepare_store([3]) is not None  # need 1 <= 1 idle: the policy is asked
    assert calls == [1]


def test_evictable_counter_through_a_lifecycle(make):
    """#45757, §4 test_evictable_cache_block_count: store, double load (no double decrement),
    partial and complete loads, eviction, failed store, reset."""
    m = make(3)

    def count():
        return m._num_evictable_cache_blocks

    m.prepare_store([1, 2])
    assert count() == 0  # pending blocks are not evictable
    m.complete_store([1, 2])
    assert count() == 2
    m.prepare_load([1])
    m.prepare_load([1])
    assert count() == 1
    m.complete_load([1])
    assert count() == 1
    m.complete_load([1])
    assert count() == 2
    m.prepare_store([3])
    assert count() == 2
    m.complete_store([3], success=False)
    assert count() == 2
    store(m, [3])
    assert count() == 3
    out = m.prepare_store([4, 5])  # LRU v2: 1 became idle again after 2
    assert out.evicted_keys == [2, 1] and count() == 1
    m.reset_cache()
    assert count() == 0


# ============================================================================= events


@pytest.mark.parametrize("policy", POLICIES)
def test_events_report_stores_then_evictions_in_order(make, policy):
    """§1.2: a stored event per completing call (keys in the order passed) and an eviction event
    per evicting prepare_store (eviction order); take_events yields then clears."""
    m = make(2, enable_events=True, **policy)
    m.prepare_store([1, 2])
    m.complete_store([2, 1])
    m.prepare_store([3, 4])
    events = list(m.take_events())
    assert [(e.keys, e.removed, e.medium) for e in events] == [
        ([2, 1], False, "CPU"),
        ([2, 1] if policy.get("lru") == "v2" else [1, 2], True, "CPU"),
    ]
    assert list(m.take_events()) == [] and m.snapshot().events == ()


def test_events_disabled(make):
    m = make(1)
    store(m, [1])
    store(m, [2])
    assert m.events is None and m.snapshot().events is None and list(m.take_events()) == []


def test_take_events_is_lazy_as_upstream(make):
    m = make(1, enable_events=True)
    store(m, [1])
    gen = m.take_events()
    assert m.snapshot().events == (((1,), False),)  # nothing taken until iterated
    assert [e.keys for e in gen] == [[1]]
    assert m.snapshot().events == ()


def test_reset_cache_forgets_blocks_and_ids_keeps_events(make):
    """#41956: policy cleared (ARC ghosts and target too), id pool restarts at 0."""
    m = make(2, "arc", enable_events=True)
    store(m, [1, 2])
    store(m, [3])
    m.touch([1])
    m.reset_cache()
    snap = m.snapshot()
    assert snap.policy == ARCSnapshot((), (), (), (), (), 0.0)
    assert snap.free_list == () and snap.num_allocated_blocks == 0
    assert len(snap.events) == 3
    assert store(m, [4]) == [0]


# ============================================================================= ARC (§2)


def test_arc_new_keys_enter_t1_and_a_touch_promotes_them(make):
    """§4 TestARCPolicy test_basic / test_t1_to_t2_promotion."""
    m = make(4, "arc")
    store(m, [1, 2])
    assert arc(m)[:2] == ([1, 2], [])
    m.touch([1])
    assert arc(m)[:2] == ([2], [1])


def test_arc_touch_walks_keys_reversed(make_arc):
    """§2.2: T1=[1,2], T2=[3,4]; touch([1,3,4]) -> T2=[4,3,1], T1=[2] (first key ends MRU)."""
    p = idle_arc_policy(make_arc, t1=[1, 2], t2=[3, 4])
    p.touch([1, 3, 4])
    assert list(p.t1) == [2] and list(p.t2) == [4, 3, 1]


def test_arc_touch_keeps_pending_block_in_t1_at_mru(make):
    """#34576 (O1): touching a not-ready T1 block moves it to T1's MRU end, not to T2."""
    m = make(4, "arc")
    m.prepare_store([1, 2])
    m.touch([1])
    assert arc(m)[:2] == ([2, 1], [])


def test_arc_touch_ordering_decides_the_victim(make):
    """§4 test_touch_ordering (shape): the touched key survives, the untouched one is evicted and
    its id reused."""
    m = make(2, "arc")
    store(m, [1, 2])
    m.touch([2, 1])  # reversed: 1 then 2 promoted; T2 = [1, 2]
    assert arc(m)[:2] == ([], [1, 2])
    out = m.prepare_store([3])
    assert out.evicted_keys == [1] and ids(out) == [0]


@pytest.mark.parametrize("fallback", [False, True])
def test_arc_virtual_t1_size_drops_only_on_t1_picks(make_arc, fallback):
    """§2.3: T1=[a,b,c], T2=[x,y] idle, target 2, evict(3) -> [a, b, x] (after two T1 picks the
    virtual size 1 < 2). Forgetting the decrement would give [a, b, c]."""
    p = idle_arc_policy(make_arc, t1="abc", t2="xy", t1_fallback=fallback)
    p.target_t1_size = 2.0
    assert keys_of(p.evict(3, set())) == ["a", "b", "x"]
    assert list(p.t1) == ["c"] and list(p.t2) == ["y"]
    assert list(p.b1) == ["a", "b"] and list(p.b2) == ["x"]


@pytest.mark.parametrize("fallback", [False, True])
def test_arc_exhausted_t1_iterator_continues_from_t2(make_arc, fallback):
    """§2.3, the #50992 scenario: T1=[a(loading), b(protected)], T2=[c,d], target 0, evict(2,{b})
    -> [c, d]: the T1 scan is exhausted and stays so; no StopIteration, no restart, no None."""
    p = idle_arc_policy(make_arc, t1="ab", t2="cd", t1_fallback=fallback)
    p.t1["a"].ref_cnt = 1
    assert keys_of(p.evict(2, {"b"})) == ["c", "d"]
    assert list(p.t1) == ["a", "b"] and list(p.b2) == ["c", "d"]


def test_arc_t1_picks_stop_once_virtual_size_is_below_target(make_arc):
    """§4 test_t1_t2_eviction_policy (shape): with target 1 and |T1| = 1 the T1 entry goes first."""
    p = idle_arc_policy(make_arc, t1=[1], t2=[2])
    p.target_t1_size = 1
    assert keys_of(p.evict(1, set())) == [1]
    assert list(p.b1) == [1]
    p = idle_arc_policy(make_arc, t1=[1], t2=[2])
    p.target_t1_size = 1.9  # int() truncates: still 1
    assert keys_of(p.evict(2, set())) == [1, 2]
    p = idle_arc_policy(make_arc, t1=[1], t2=[2])
    p.target_t1_size = 2
    assert keys_of(p.evict(1, set())) == [2]


def test_arc_ghost_hits_adapt_the_target(make_arc):
    """§2.4: a B1 hit adds max(1, |B2|/|B1|) capped at capacity, a B2 hit subtracts
    max(1, |B1|/|B2|) floored at 0; the ghost key moves to its list's MRU end."""
    p = idle_arc_policy(make_arc, t1=[1, 2, 3], t2=[4, 5, 6, 7], capacity=4)
    assert keys_of(p.evict(3, set())) == [1, 2, 3]  # target 0: T1 first
    p.target_t1_size = 4.0
    assert keys_of(p.evict(4, set())) == [4, 5, 6, 7]  # virtual T1 (0) < 4: T2
    assert list(p.b1) == [1, 2, 3] and list(p.b2) == [4, 5, 6, 7]
    p.target_t1_size = 1.0
    p.touch([1])  # B1 hit: +max(1, 4/3) = 4/3, then the cap (4) does not bind
    assert p.target_t1_size == 1.0 + 4 / 3 and list(p.b1) == [2, 3, 1]
    p.touch([4])  # B2 hit: -max(1, 3/4) = -1
    assert p.target_t1_size == pytest.approx(4 / 3) and list(p.b2) == [5, 6, 7, 4]
    p.touch([5, 6])  # reversed: 6 then 5, each -1, floored at 0
    assert p.target_t1_size == 0 and list(p.b2) == [7, 4, 6, 5]
    for _ in range(5):
        p.touch([2])
    assert p.target_t1_size == 4  # capped at capacity


def test_arc_ghost_lists_are_trimmed_to_capacity_on_commit(make):
    """§4 test_ghost_list_bounds: |B1|, |B2| <= capacity; the oldest ghost goes first."""
    m = make(2, "arc")
    store(m, [1, 2])
    store(m, [3, 4])
    assert arc(m)[2] == [1, 2]
    store(m, [5])
    assert arc(m)[2] == [2, 3]


def test_arc_failed_eviction_changes_nothing(make_arc):
    """§2.3, #37874 (O3): a failed eviction leaves every list, the ghost order and the target."""
    p = idle_arc_policy(make_arc, t1=[1, 2], t2=[3], capacity=3)
    assert keys_of(p.evict(2, set())) == [1, 2]  # B1 = [1, 2]
    p.insert(4, BlockStatus(9, ref_cnt=0))
    p.target_t1_size = 0.5
    before = p.snapshot()
    assert p.evict(3, {3}) is None  # only 4 is eligible
    assert p.snapshot() == before


def test_arc_eviction_waits_for_loads(make):
    """§4 test_eviction_with_load: pinned blocks cannot be evicted; after complete_load they can."""
    m = make(2, "arc")
    store(m, [1, 2])
    m.prepare_load([1, 2])
    assert m.prepare_store([3]) is None
    m.complete_load([1, 2])
    assert m.prepare_store([3]).evicted_keys == [1]


@pytest.mark.parametrize("fallback", [False, True], ids=["no-fallback", "t1-fallback"])
def test_issue_55461_worked_example(make, fallback):
    """§2.5, the six steps with N=2: the #50992 state fails the store although key 3 is
    evictable; #55461 falls back to T1 and evicts it, giving key 4 id 1."""
    m = make(2, "arc", arc_t1_fallback=fallback)
    assert store(m, [1, 2]) == [0, 1]  # 1
    assert arc(m)[:2] == ([1, 2], [])
    m.touch([1])  # 2
    assert arc(m)[:2] == ([2], [1])
    out = m.prepare_store([3])  # 3
    assert out.evicted_keys == [2] and ids(out) == [1]
    m.complete_store([3])
    assert arc(m) == ([3], [1], [2], [], 0.0)
    m.touch([2])  # 4: two B1 ghost hits
    m.touch([2])
    assert arc(m)[4] == 2.0
    m.prepare_load([1])  # 5
    assert m._num_evictable_cache_blocks == 1  # 6: the guard passes
    before = m.snapshot()
    out = m.prepare_store([4])
    if fallback:
        assert (out.keys_to_store, ids(out), out.evicted_keys) == ([4], [1], [3])
        assert arc(m) == ([4], [1], [2, 3], [], 2.0)
    else:
        assert out is None
        assert m.snapshot() == before


class CountedBlock(BlockStatus):
    """A block that counts how often eviction looks at its reference count (one visit each)."""

    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "ref_cnt":
            CountedBlock.reads += 1
        return super().__getattribute__(name)


@pytest.mark.parametrize("fallback", [False, True])
def test_impl_arc_visits_each_entry_at_most_once(fallback):
    """#50992 (O5): one batch eviction visits each T1/T2 entry at most once, where the spec's
    rescan revisits the pinned front for every victim; both choose the same victims."""
    results = []
    for cls in (spec_arc.ARCCachePolicy, impl_arc.ARCCachePolicy):
        p = idle_arc_policy(
            cls, t1=range(100, 200), t2=range(200, 260), capacity=400, t1_fallback=fallback
        )
        for key in range(100, 150):
            p.t1[key].ref_cnt = 1  # pinned front of T1
        for entries in (p.t1, p.t2):
            for key, block in entries.items():
                entries[key] = CountedBlock(block.block_id, block.ref_cnt)
        p.target_t1_size = 80.0 if fallback else 0.0  # fallback: T2 first, then back to T1
        CountedBlock.reads = 0
        victims = keys_of(p.evict(100, set()))
        results.append((victims, CountedBlock.reads))
    (spec_victims, spec_visits), (impl_victims, impl_visits) = results
    assert impl_victims == spec_victims and impl_victims is not None
    assert impl_visits <= 160 < spec_visits


def random_arc_state(cls, rng: random.Random, fallback: bool):
    """§2.3 facts' state space: |T1|, |T2| in 0..8, ref_cnt in {-1, 0, 1}, target in [0, 10)."""
    p = cls(20, t1_fallback=fallback)
    n1, n2 = rng.randint(0, 8), rng.randint(0, 8)
    for key in range(n1 + n2):
        (p.t1 if key < n1 else p.t2)[key] = BlockStatus(key, rng.choice([-1, 0, 1]))
    p.b1.update((k, None) for k in range(100, 100 + rng.randint(0, 20)))
    p.target_t1_size = rng.random() * 10
    return p


def test_arc_one_pass_eviction_equals_rescan_on_random_states():
    """§2.3 facts: variant B (impl) selects the same victims in the same order as variant A
    (spec) and commits the same lists, with and without the #55461 fallback; and C equals A
    whenever A succeeds (it only turns some failures into successes)."""
    rng = random.Random(55461)
    rescued = 0
    for _ in range(5000):
        seed = rng.random()
        n = rng.randint(0, 10)
        protected = {k for k in range(16) if rng.random() < 0.2}
        results = {}
        for fallback in (False, True):
            for cls in (spec_arc.ARCCachePolicy, impl_arc.ARCCachePolicy):
                p = random_arc_state(cls, random.Random(seed), fallback)
                results[cls, fallback] = (keys_of(p.evict(n, protected)), p.snapshot())
            assert (
                results[spec_arc.ARCCachePolicy, fallback]
                == results[impl_arc.ARCCachePolicy, fallback]
            )
        plain, fallback_result = (results[spec_arc.ARCCachePolicy, f] for f in (False, True))
        if plain[0] is not None:
            assert fallback_result == plain
        rescued += plain[0] is None and fallback_result[0] is not None
    assert rescued > 0


# ============================================================================= LRU (§3)

LRU_TABLE = {  # §3.2: (step 6 evicted, step 6 ids, touch keys, step 7 id)
    "v1": ([2, 3, 4], [3, 2, 1], [5, 6, 7], [1]),
    "v2": ([4, 5, 2], [1, 0, 3], [3, 6, 7], [3]),
}


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_lru_reference_table_v1_vs_v2(make, variant):
    """§3.2 table (upstream test_cpu_manager, N=4), both variants."""
    evicted6, ids6, touched, id7 = LRU_TABLE[variant]
    m = make(4, "lru", enable_events=True, lru=variant)
    assert store(m, [1, 2]) == [0, 1]
    out = m.prepare_store([2, 3, 4, 5])
    assert (out.keys_to_store, ids(out), out.evicted_keys) == ([3, 4, 5], [2, 3, 0], [1])
    assert [m.lookup(k) for k in (1, 2, 3)] == [MISS, HIT, PENDING]
    assert m.prepare_store([1, 6]) is None  # 3, 4, 5 pending: the guard fails
    m.complete_store([2, 3, 4, 5])
    assert m.prepare_load([2, 3]) == CPULoadStoreSpec((1, 2))
    assert m.prepare_store([6, 7, 8]) is None
    m.complete_load([2, 3])
    out = m.prepare_store([6, 7, 8])
    assert (ids(out), out.evicted_keys) == (ids6, evicted6)
    m.complete_store([6, 7, 8])
    m.touch(touched)
    out = m.prepare_store([9])
    assert (ids(out), out.evicted_keys) == (id7, [8])
    m.complete_store([7, 9], success=False)
    assert (m.lookup(7), m.lookup(9)) == (HIT, MISS)
    events = [(set(e.keys), e.removed) for e in m.take_events()]
    assert events == [
        ({1, 2}, False),
        ({1}, True),
        ({3, 4, 5}, False),
        (set(evicted6), True),
        ({6, 7, 8}, False),
        ({8}, True),
    ]


def test_lru_touch_walks_keys_reversed(make_lru):
    p = make_lru(4, variant="v1")
    for i, key in enumerate("abcd"):
        p.insert(key, BlockStatus(i, ref_cnt=0))
    p.touch(["b", "a", "zz"])  # unknown keys ignored
    assert p.snapshot().order == ("c", "d", "a", "b")
    assert keys_of(p.evict(2, set())) == ["c", "d"]


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_lru_recency_of_busy_blocks(make, variant):
    """§3.1 vs §3.2: v1 orders by store time and touches, whatever the state; v2 by when a block
    last became idle, and touching a busy block does nothing."""
    m = make(3, "lru", lru=variant)
    store(m, [1, 2, 3])
    m.prepare_load([1])
    m.touch([1])  # v1: 1 most recent; v2: ignored (1 is loading)
    m.touch([3, 2])  # 2 then 3: 3 most recent
    m.complete_load([1])  # v2: 1 became idle now -> most recent
    assert m.snapshot().policy.order == ((1, 2, 3) if variant == "v1" else (2, 3, 1))
    out = m.prepare_store([4])
    assert out.evicted_keys == ([1] if variant == "v1" else [2])


def test_lru_v2_order_holds_idle_blocks_only(make):
    m = make(3, "lru", lru="v2")
    store(m, [1, 2])
    m.prepare_store([3])
    m.prepare_load([1])
    assert m.snapshot().policy.order == (2,)
    m.complete_store([3])
    m.complete_load([1])
    assert m.snapshot().policy.order == (2, 3, 1)


# ============================================================================= bad input


def _ready(m):
    store(m, [1, 2])
    m.prepare_store([3])  # 3 pending
    m.prepare_load([2])  # 2 loading


BAD_CALLS = [
    pytest.param(lambda m: m.prepare_store([4, 5, 4]), InvalidArgument, id="store-duplicates"),
    pytest.param(lambda m: m.prepare_store([1, 1]), InvalidArgument, id="store-dup-stored"),
    pytest.param(lambda m: m.prepare_load([9]), OffloadStateError, id="load-missing"),
    pytest.param(lambda m: m.prepare_load([1, 3]), OffloadStateError, id="load-pending"),
    pytest.param(lambda m: m.prepare_load([1, 2, 9]), OffloadStateError, id="load-partly-bad"),
    pytest.param(lambda m: m.complete_load([9]), OffloadStateError, id="complete-load-missing"),
    pytest.param(lambda m: m.complete_load([3]), OffloadStateError, id="complete-load-pending"),
    pytest.param(lambda m: m.complete_load([1]), DoubleFreeError, id="complete-load-idle"),
    pytest.param(lambda m: m.complete_load([2, 2]), DoubleFreeError, id="complete-load-twice"),
    pytest.param(lambda m: m._policy.evict(-1, set()), InvalidArgument, id="evict-negative"),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("call", "exc"), BAD_CALLS)
def test_bad_input_raises_and_changes_nothing(make, policy, call, exc):
    """Validate-first operations raise the specific kvspec exception (of the upstream kind:
    ValueError for kvspec's extra checks, AssertionError where upstream asserts) and leave the
    snapshot and the #45757 counter unchanged (atomic_failure)."""
    m = make(4, enable_events=True, store_threshold=1, **policy)
    _ready(m)
    before, counter = m.snapshot(), m._num_evictable_cache_blocks
    with pytest.raises(exc):
        call(m)
    assert m.snapshot() == before and m._num_evictable_cache_blocks == counter


def test_bad_input_kinds_match_upstream():
    assert exception_kind(OffloadStateError("x")) == "AssertionError"
    assert exception_kind(DoubleFreeError("x")) == "AssertionError"
    assert exception_kind(InvalidArgument("x")) == "ValueError"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": -1},
        {"num_blocks": 2, "cache_policy": "lfu"},
        {"num_blocks": 2, "lru": "v3"},
        {"num_blocks": 2, "cache_policy": "arc", "arc_t1_fallback": 1},
        {"num_blocks": 2, "store_threshold": 2, "max_tracker_size": 0},
        {"num_blocks": 2.0},
    ],
)
def test_bad_constructor_arguments(make, kwargs):
    with pytest.raises(InvalidArgument):
        make(**kwargs)


def test_bad_policy_constructor_arguments(make_arc, make_lru):
    with pytest.raises(InvalidArgument):
        make_arc(-1)
    with pytest.raises(InvalidArgument):
        make_arc(2, t1_fallback="yes")
    with pytest.raises(InvalidArgument):
        make_lru(2, variant="v0")


def test_snapshots_are_hashable_and_deterministic(make):
    m = make(3, "arc", enable_events=True, store_threshold=2)
    for key in (b"k1", b"k2"):
        m.lookup(key)
        m.lookup(key)
    store(m, [b"k1", b"k2"])
    s = m.snapshot()
    assert isinstance(s, OffloadManagerSnapshot) and hash(s) == hash(m.snapshot())
    assert s.policy.blocks == ((0, b"k1", 0), (1, b"k2", 0))
    assert s.differing_fields(s._replace(free_list=(1,))) == ["free_list"]
