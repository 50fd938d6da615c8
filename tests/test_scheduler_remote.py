"""Behavioural tests of the InfiniLM ``Scheduler``: the PD-connector paths (remote prefill, failed
receives, parked pages), decode out of pages, completion and publication, PR #579's per-step reuse,
cache statistics and mamba rows — against the spec and the impl, in every reservation variant.
Section numbers refer to docs/infinilm.md.
"""

from __future__ import annotations

import pytest
from scheduler_support import (
    FakeConnector,
    engine_step,
    events,
    finish_step,
    ids,
    mk,
    next_token,
    refs,
    running_scan,
)

from impl.infinilm import scheduler as impl_sched
from spec.errors import OutOfBlocksError
from spec.infinilm.request import RequestStatus
from spec.infinilm.scheduler import (
    exact_blocks,
    legacy_running_blocks,
    remote_reservation,
    tight_blocks,
)

# ----------------------------------------------------------------------------- remote (§5.6, §9.9-9.12)


def test_remote_promotion_break_leaves_later_cleanup(sched_cls, variant):
    conn = FakeConnector({f"r{i}": (9, True) for i in range(3)})
    s = sched_cls(
        max_batch_size=1,
        num_blocks=16,
        block_size=16,
        connector=conn,
        enable_prefix_caching=False,
        reservation=variant,
    )
    r0, r1, r2 = (mk(f"r{i}", 10, 8) for i in range(3))
    for r in (r0, r1, r2):
        s.add_request(r)
    out = s.schedule()
    assert out.scheduled_requests == [] and not out.is_prefill
    assert list(s.remote_kv_requests) == ["r0", "r1", "r2"]
    # legacy ceil(8/16) = 1, exact ceil(18/16) - 1 = 1, tight ceil(17/16) - 1 = 1 each
    assert s.pending_kv_decode_blocks == 3
    s.update_from_output(events(finished_recving={"r0", "r1"}))
    r2.status = RequestStatus.CANCELED
    out = engine_step(s)
    assert not out.is_prefill and ids(out.scheduled_requests) == ["r0"]
    # r1 hit the full batch: `break`; the canceled r2 behind it was not cleaned up
    assert list(s.remote_kv_requests) == ["r1", "r2"]
    assert s.pending_kv_decode_blocks == 2
    assert "r2" not in s.pending_free_blocks and refs(s, r2.block_table) == [1]
    assert ids(s.running_queue) == ["r0"]

    r0.status = RequestStatus.CANCELED
    out = s.schedule()  # r0 leaves; r1 is promoted; r2 is finally cleaned up
    assert ids(out.scheduled_requests) == ["r1"]
    assert s.remote_kv_requests == {} and s.pending_kv_decode_blocks == 0
    assert s.pending_free_blocks == {"r2": r2.block_table}  # receive never finished: delayed


def test_cancel_after_failed_receive_parks_pages(sched_cls, variant):
    conn = FakeConnector({"q": (19, True)})
    s = sched_cls(num_blocks=8, block_size=16, connector=conn, reservation=variant)
    q = mk("q", 20, 12)
    s.add_request(q)
    s.schedule()
    assert q.block_table == [0, 1] and q.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    s.update_from_output(events(failed_recving={"q"}))
    assert "q" in s.failed_receiving_kv_req_ids
    q.status = RequestStatus.CANCELED
    out = s.schedule()
    assert out.scheduled_requests == []
    assert s.remote_kv_requests == {} and s.pending_kv_decode_blocks == 0
    # not in finished_receiving, so delay=True: the pages are parked, not released ...
    assert s.pending_free_blocks == {"q": [0, 1]}
    assert refs(s, [0, 1]) == [1, 1]
    assert s.cache_manager.get_total_usable_blocks() == 6
    # ... and the failed id is not cleared (possible leak, reference §9.10)
    assert "q" in s.failed_receiving_kv_req_ids
    # only a later finished_recving / finished_sending event for the id releases them
    s.update_from_output(events(finished_recving={"q"}))
    assert s.pending_free_blocks == {} and refs(s, [0, 1]) == [0, 0]
    assert s.cache_manager.get_total_usable_blocks() == 8
    assert "q" in s.failed_receiving_kv_req_ids


def test_partial_remote_failure_requeue_bypasses_admission(sched_cls, variant, monkeypatch):
    conn = FakeConnector({"q": (39, True)})
    s = sched_cls(
        num_blocks=8,
        block_size=16,
        connector=conn,
        enable_prefix_caching=False,
        reservation=variant,
    )
    q = mk("q", 40, 8)
    s.add_request(q)
    s.schedule()
    assert q.block_table == [0, 1, 2] and q.num_computed_tokens == 39
    assert q.num_local_cached_tokens == 0
    s.update_from_output(events(failed_recving={"q"}, invalid_block_ids={2}))
    assert q.num_computed_tokens == 32  # min(39, index 2 * B)
    out = s.schedule()  # promotion loop: failed -> back to the waiting queue
    assert out.scheduled_requests == []
    assert ids(s.waiting_queue) == ["q"] and q.status is RequestStatus.WAITING
    assert s.remote_kv_requests == {} and s.pending_kv_decode_blocks == 0
    assert "q" not in s.failed_receiving_kv_req_ids
    assert q.num_local_cached_tokens == 32
    assert q.slot_mapping == list(range(32, 40))  # page 2, offsets 0..7

    # a running request whose reservation covers the whole pool: admission would reject q
    blocker = mk("blocker", 1, 1000)
    blocker.status = RequestStatus.RUNNING
    s.complete_requests([blocker])
    assert s.can_accept_request(q, q.num_local_cached_tokens) is False
    snapshot = s.cache_manager.snapshot()
    calls = []
    monkeypatch.setattr(s, "can_accept_request", lambda *a, **k: calls.append(a) or False)
    monkeypatch.setattr(s.cache_manager, "allocate_slots", lambda *a: calls.append(a))
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["q"]
    assert calls == []  # neither admission nor allocation
    assert q.block_table == [0, 1, 2] and q.slot_mapping == list(range(32, 40))
    assert q.status is RequestStatus.RUNNING
    assert s.cache_manager.snapshot() == snapshot


def test_partial_remote_failure_requeue_adds_prefill_extra(sched_cls):
    """The requeued request still adds max(ceil((P+M)/B) - len(table), 0) to the batch extra."""
    conn = FakeConnector({"q": (39, True)})
    s = sched_cls(num_blocks=8, block_size=16, connector=conn, enable_prefix_caching=False)
    q = mk("q", 40, 40)  # extra = ceil(80/16) - 3 = 2
    s.add_request(q)
    s.schedule()  # legacy: own ceil(80/16) = 5 <= 8; pending += ceil(40/16) = 3
    s.update_from_output(events(failed_recving={"q"}, invalid_block_ids={2}))
    s.schedule()
    assert ids(s.waiting_queue) == ["q"] and s.pending_kv_decode_blocks == 0
    c = mk("c", 1, 31)  # own = 2; usable = 5; need 2 + extra 2 = 4 <= 5: admitted, extra += 1
    d = mk("d", 1, 16)  # own = 2; usable = 4; need 2 + 3 = 5 > 4 (without q's 2 it would fit)
    s.add_request(c)
    s.add_request(d)
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["q", "c"]
    assert ids(s.waiting_queue) == ["d"]


def test_remote_pending_ignores_batch_size(sched_cls, variant, monkeypatch):
    conn = FakeConnector({f"r{i}": (39, True) for i in range(3)})
    s = sched_cls(
        max_batch_size=1,
        num_blocks=32,
        block_size=16,
        max_num_batched_tokens=16,
        connector=conn,
        enable_prefix_caching=False,
        reservation=variant,
    )
    remote = [mk(f"r{i}", 40, 8) for i in range(3)]
    local = mk("L", 10, 8)
    for r in (*remote, local):
        s.add_request(r)
    accepted = []
    original = s.can_accept_request

    def spy(req, *args, **kwargs):
        result = original(req, *args, **kwargs)
        accepted.append((req.request_id, result))
        return result

    monkeypatch.setattr(s, "can_accept_request", spy)
    out = s.schedule()
    # three remote admissions (120 prompt tokens) count toward neither batch size nor budget
    assert list(s.remote_kv_requests) == ["r0", "r1", "r2"]
    assert out.is_prefill and ids(out.scheduled_requests) == ["L"]
    assert accepted == [("r0", True), ("r1", True), ("r2", True), ("L", True)]
    assert [r.block_table for r in remote] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert s.pending_kv_decode_blocks == sum(remote_reservation(variant, r, 16) for r in remote)


def test_full_remote_hit_promoted_into_decode_batch(sched_cls, variant):
    """§5.6: a promoted remote request computes its last prompt token in a decode batch."""
    conn = FakeConnector({"q": (19, True)})
    s = sched_cls(num_blocks=8, block_size=16, connector=conn, reservation=variant)
    q = mk("q", 20, 4)
    s.add_request(q)
    s.schedule()
    assert q.num_computed_tokens == 19 and q.slot_mapping == [q.block_table[1] * 16 + 3]
    assert conn.log[:2] == [("match", "q", 0), ("alloc", "q", (0, 1), 19, 16)]
    out = s.schedule()  # nothing received yet: an empty decode output (connector present)
    assert out.scheduled_requests == [] and not out.is_prefill
    s.update_from_output(events(finished_recving={"q"}))
    assert "q" in s.finished_receiving_kv_req_ids
    out = engine_step(s)
    assert not out.is_prefill and ids(out.scheduled_requests) == ["q"]
    assert q.num_local_cached_tokens == 19 and q.slot_mapping == [19]
    assert s.remote_kv_requests == {} and s.finished_receiving_kv_req_ids == set()
    assert ids(s.running_queue) == ["q"] and q.get_num_generated_tokens() == 1
    assert s.num_reserved_decode_blocks == running_scan(s)
    # prefix caching on: the prompt's full block was published after execution
    assert s.cache_manager.blocks[0].hash == q.block_hashes[0]


@pytest.mark.parametrize(
    ("invalid", "boundary"),
    [(set(), 16), ({"prefix"}, 16), ({"third"}, 32)],
    ids=["none-invalid", "invalid-prefix-page-ignored", "invalid-third-page"],
)
def test_failed_receive_boundary(sched_cls, variant, invalid, boundary):
    """§5.6: the scan starts at num_cache_indexed_blocks; default is num_local_cached_tokens."""
    size = 16
    conn = FakeConnector({"q": (43, True)})
    s = sched_cls(num_blocks=16, block_size=size, connector=conn, reservation=variant)
    shared = list(range(500, 500 + size))
    a = mk("a", 20, 1, tokens=[*shared, 1, 2, 3, 4])
    s.add_request(a)
    engine_step(s)  # publishes the shared first block (page 0)
    q = mk("q", 60, 4, tokens=[*shared, *range(900, 944)])
    s.add_request(q)
    s.schedule()
    assert q.block_table[0] == 0 and len(q.block_table) == 4
    assert q.num_local_cached_tokens == 16 and q.num_cache_indexed_blocks == 1
    assert q.num_computed_tokens == 59
    pages = {"prefix": q.block_table[0], "third": q.block_table[2]}
    s.update_from_output(
        events(failed_recving={"q"}, invalid_block_ids={pages[k] for k in invalid})
    )
    assert q.num_computed_tokens == boundary
    s.schedule()  # promotion: back to waiting with the valid prefix committed
    assert ids(s.waiting_queue) == ["q"] and len(q.block_table) == 4
    assert q.num_local_cached_tokens == boundary
    assert q.num_cache_indexed_blocks == boundary // size
    assert s.cache_manager.blocks[q.block_table[1]].hash == (
        q.block_hashes[1] if boundary == 32 else b""
    )
    assert q.slot_mapping == s.cache_manager.update_blocks_slot(q.block_table, boundary, 60)


def test_failed_receive_multimodal_restarts_from_scratch(sched_cls, variant):
    conn = FakeConnector({"q": (19, True)})
    s = sched_cls(num_blocks=8, block_size=16, connector=conn, reservation=variant)
    q = mk("q", 20, 4, has_multimodal_inputs=True)
    s.add_request(q)
    s.schedule()
    assert q.block_table == [0, 1]
    s.update_from_output(events(failed_recving={"q"}))
    assert q.num_computed_tokens == 0
    out = s.schedule()
    assert out.scheduled_requests == []
    assert q.block_table == [] and q.slot_mapping == [] and q.num_local_cached_tokens == 0
    assert refs(s, [0, 1]) == [0, 0] and ids(s.waiting_queue) == ["q"]
    conn.matches["q"] = (0, False)  # the retry finds nothing remote: a plain local prefill
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["q"]
    assert len(q.block_table) == 2 and len(q.slot_mapping) == 20


# ----------------------------------------------------------------------------- §9.14


def test_decode_oom_raises_and_loses_request(sched_cls, variant):
    s = sched_cls(num_blocks=3, block_size=16, reservation=variant)
    x, r = mk("X", 4, 4), mk("R", 16, 2)
    s.add_request(x)
    s.add_request(r)
    engine_step(s)
    assert (x.block_table, r.block_table) == ([0], [1])
    assert ids(s.running_queue) == ["X", "R"]
    assert s.num_reserved_decode_blocks == running_scan(s) >= 1
    # a page taken outside admission (e.g. speculative verify slots, reference §9.15)
    stolen = s.cache_manager.allocate_slots(16)
    assert stolen is not None and stolen[0] == [2]
    with pytest.raises(OutOfBlocksError, match="No available cache blocks") as info:
        s.schedule()  # R's token 16 starts a new page: none free, none reclaimable
    assert isinstance(info.value, RuntimeError)
    # no preemption: X (already in the partial batch) and R are both lost
    assert list(s.running_queue) == []
    assert r.block_table == [1] and refs(s, [0, 1]) == [1, 1]
    # the exact/tight counter was decremented on dequeue: it equals the (empty) scan
    assert s.num_reserved_decode_blocks == running_scan(s) == 0


# ----------------------------------------------------------------------------- §5.5, §5.7


def test_complete_requests_releases_and_keeps_block_table(sched_cls, variant):
    conn = FakeConnector(delays={"d": True})
    s = sched_cls(
        num_blocks=8,
        block_size=16,
        connector=conn,
        enable_prefix_caching=False,
        reservation=variant,
    )
    bm = s.cache_manager
    a, d, k, m = mk("a", 20, 4), mk("d", 20, 4), mk("k", 4, 4), mk("m", 4, 4)
    for r in (a, d, k, m):
        s.add_request(r)
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["a", "d", "k", "m"]
    assert [r.block_table for r in (a, d, k, m)] == [[0, 1], [2, 3], [4], [5]]
    for r in out.scheduled_requests:
        r.append_generated_token_id(next_token(r))
    a.status = RequestStatus.FINISHED
    d.status = RequestStatus.FINISHED
    conn.log.clear()
    s.complete_requests(out.scheduled_requests)
    # survivors go to the running tail in batch order
    assert ids(s.running_queue) == ["k", "m"]
    assert s.num_reserved_decode_blocks == running_scan(s)
    # a released: refs dropped, pages stay in used (not returned to the free deque), table kept
    assert a.block_table == [0, 1] and refs(s, [0, 1]) == [0, 0]
    assert {0, 1} <= bm.used_block_ids and list(bm.free_block_ids) == [6, 7]
    # d: the connector asked to delay: parked in pending_free_blocks, still referenced
    assert d.block_table == [2, 3] and refs(s, [2, 3]) == [1, 1]
    assert s.pending_free_blocks == {"d": [2, 3]}
    assert [e[:2] for e in conn.log] == [("finished", "a"), ("finished", "d")]
    assert bm.get_total_usable_blocks() == 4
    # the send finishes: released; a second event is a no-op
    s.update_from_output(events(finished_sending={"d"}))
    assert s.pending_free_blocks == {} and refs(s, [2, 3]) == [0, 0]
    s.update_from_output(events(finished_sending={"d"}))
    assert refs(s, [2, 3]) == [0, 0] and bm.get_total_usable_blocks() == 6


def test_commit_computed_tokens_publishes_deferred(sched_cls):
    s = sched_cls(num_blocks=8, block_size=16)
    bm = s.cache_manager
    r = mk("r", 20, 40)
    s.add_request(r)
    out = s.schedule()
    assert r.block_table == [0, 1] and len(r.block_hashes) == 1
    # nothing is published at allocation time
    assert [bm.blocks[p].hash for p in r.block_table] == [b"", b""]
    assert bm.hash_to_block_ids == {} and r.num_cache_indexed_blocks == 0
    s.commit_computed_tokens(r, 20)  # KV for the 20 prompt tokens now exists
    assert r.num_cache_indexed_blocks == 1
    assert bm.blocks[0].hash == r.block_hashes[0] and bm.blocks[1].hash == b""
    assert bm.hash_to_block_ids == {r.block_hashes[0]: {0}}
    s.commit_computed_tokens(r, 20)  # target == indexed: nothing to do
    finish_step(s, out)  # commits 20 again, samples token 21
    while r.get_total_length() < 32:
        engine_step(s)
    # the second block's hash exists (16 tokens), but its last token's KV is not computed yet
    assert len(r.block_hashes) == 2 and bm.blocks[1].hash == b""
    engine_step(s)  # computes token 31, then commits 32 tokens: the output block is published
    assert r.num_cache_indexed_blocks == 2 and bm.blocks[1].hash == r.block_hashes[1]


def test_commit_computed_tokens_noop_without_prefix_caching(sched_cls):
    s = sched_cls(num_blocks=8, block_size=16, enable_prefix_caching=False)
    r = mk("r", 40, 4)
    s.add_request(r)
    engine_step(s)
    assert r.block_hashes == () and r.num_cache_indexed_blocks == 0
    s.commit_computed_tokens(r, 40)
    assert s.cache_manager.hash_to_block_ids == {}


def test_multimodal_request_is_not_hashed(sched_cls):
    """§2: hashing is off for a multimodal request, so it never hits nor publishes."""
    s = sched_cls(num_blocks=8, block_size=16)
    prompt = list(range(40))
    a = mk("a", 40, 1, tokens=prompt)
    s.add_request(a)
    engine_step(s)
    b = mk("b", 40, 1, tokens=prompt, has_multimodal_inputs=True)
    s.add_request(b)
    s.schedule()
    assert b.block_hashes == () and b.num_computed_tokens == 0
    assert len(b.slot_mapping) == 40


# ----------------------------------------------------------------------------- PR #579 (§6)


def _counting_scans(s, monkeypatch):
    calls = []
    original = s._running_required_blocks

    def counting():
        calls.append(1)
        return original()

    monkeypatch.setattr(s, "_running_required_blocks", counting)
    return calls


def test_pr579_legacy_reuses_running_reservation(monkeypatch):
    s = impl_sched.Scheduler(num_blocks=64, block_size=16, reservation="legacy")
    scans = _counting_scans(s, monkeypatch)
    for i in range(3):
        s.add_request(mk(f"run{i}", 4, 32))
    engine_step(s)
    assert ids(s.running_queue) == ["run0", "run1", "run2"]
    scans.clear()
    for i in range(8):
        s.add_request(mk(f"w{i}", 4, 8))
    out = s.schedule()
    assert ids(out.scheduled_requests) == [f"w{i}" for i in range(8)]
    assert len(scans) == 1  # one scan for eight admission checks
    assert ids(s.running_queue) == ["run0", "run1", "run2"]  # the scan keeps the order
    finish_step(s, out)
    scans.clear()
    out = engine_step(s)
    assert not out.is_prefill and len(out.scheduled_requests) == 11
    assert scans == []  # a decode-only step never scans
    assert s.can_accept_request(mk("x", 4, 8), 0) is True
    assert len(scans) == 1  # a standalone call recomputes


def test_pr579_running_reservation_recomputed_each_step(monkeypatch):
    s = impl_sched.Scheduler(num_blocks=64, block_size=16, reservation="legacy")
    seen = []
    original = s.can_accept_request

    def spy(req, *args, **kwargs):
        seen.append((req.request_id, kwargs.get("running_required_blocks")))
        return original(req, *args, **kwargs)

    monkeypatch.setattr(s, "can_accept_request", spy)
    r = mk("R", 1, 32)
    s.add_request(r)
    engine_step(s)
    s.add_request(mk("c1", 1, 1))
    engine_step(s)
    assert seen[-1] == ("c1", 2)  # ceil((32 - 1) / 16)
    while r.get_num_generated_tokens() < 16:
        engine_step(s)
    s.add_request(mk("c2", 1, 1))
    engine_step(s)
    assert seen[-1] == ("c2", 1)  # ceil((32 - 16) / 16)


def test_pr579_canceled_waiting_and_token_budget_one_admission_call(monkeypatch):
    s = impl_sched.Scheduler(
        num_blocks=16, block_size=16, max_num_batched_tokens=5, reservation="legacy"
    )
    calls = []
    original = s.can_accept_request
    monkeypatch.setattr(
        s, "can_accept_request", lambda *a, **k: calls.append(a[0].request_id) or original(*a, **k)
    )
    canceled, a, b = mk("x", 3, 4), mk("a", 3, 4), mk("b", 3, 4)
    for r in (canceled, a, b):
        s.add_request(r)
    canceled.status = RequestStatus.CANCELED
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["a"] and calls == ["a"]
    assert ids(s.waiting_queue) == ["b"]  # budget: 3 + 3 > 5


# ----------------------------------------------------------------------------- stats, mamba


def test_get_cache_stats_fields(sched_cls, variant):
    # reference §9.4: N=3, B=16, one 17-token request finishes with prefix caching off
    s = sched_cls(num_blocks=3, block_size=16, enable_prefix_caching=False, reservation=variant)
    r = mk("r", 17, 1)
    s.add_request(r)
    engine_step(s)
    assert r.status is RequestStatus.FINISHED
    stats = s.get_cache_stats()
    assert stats["num_blocks"] == 3 and stats["block_size"] == 16
    assert stats["num_free_blocks"] == 1  # understates capacity
    assert stats["usable_blocks"] == 3
    assert stats["num_used_blocks"] == 2  # includes the unreferenced released pages
    assert stats.get("num_reserved_decode_blocks", 0) == 0
    assert not any(key.startswith("mamba") for key in stats)
    assert list(s.cache_manager.free_block_ids) == [2]
    assert s.cache_manager.used_block_ids == {0, 1}

    s.add_request(mk("q", 4, 40))
    engine_step(s)
    stats = s.get_cache_stats()
    assert s.num_reserved_decode_blocks == running_scan(s) > 0
    if variant != "legacy":  # the exact PR's stats key; legacy has none (reference §5.8)
        assert stats["num_reserved_decode_blocks"] == s.num_reserved_decode_blocks
    assert stats["usable_blocks"] == 2


REFERENCE_STATS_KEYS = {
    "legacy": {"num_blocks", "block_size", "num_free_blocks", "usable_blocks", "num_used_blocks"},
    "exact": {
        "num_blocks",
        "block_size",
        "num_free_blocks",
        "usable_blocks",
        "num_used_blocks",
        "num_reserved_decode_blocks",
    },
}


@pytest.mark.parametrize("reservation", ["legacy", "exact"])
def test_get_cache_stats_keys_match_reference(sched_cls, reservation):
    s = sched_cls(num_blocks=8, block_size=16, reservation=reservation)
    assert set(s.get_cache_stats()) == REFERENCE_STATS_KEYS[reservation]


def test_get_cache_stats_mamba_fields(sched_cls):
    s = sched_cls(num_blocks=8, block_size=16, has_mamba_cache=True)  # max(2, 8 // 4) = 2 rows
    stats = s.get_cache_stats()
    # upstream's keys; the total includes row 0, the permanent zero state
    assert stats["num_mamba_cache_blocks"] == 2
    assert (stats["num_free_mamba_cache_blocks"], stats["num_used_mamba_cache_blocks"]) == (1, 0)
    s.add_request(mk("a", 4, 4))
    s.schedule()
    stats = s.get_cache_stats()
    assert (stats["num_free_mamba_cache_blocks"], stats["num_used_mamba_cache_blocks"]) == (0, 1)


def test_mamba_rows_limit_admission(sched_cls, variant, monkeypatch):
    s = sched_cls(
        num_blocks=16,
        block_size=16,
        has_mamba_cache=True,
        num_mamba_cache_blocks=2,
        reservation=variant,
    )
    a, b = mk("a", 4, 2), mk("b", 4, 2)
    s.add_request(a)
    s.add_request(b)
    assert a.block_hashes == ()  # no prefix hashing with a mamba cache
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["a"]
    assert a.mamba_cache_index == 1 and b.mamba_cache_index is None
    assert ids(s.waiting_queue) == ["b"] and b.block_table == []
    assert s.can_accept_request(b, 0) is False
    finish_step(s, out)
    scans = _counting_scans(s, monkeypatch)
    out = engine_step(s)  # b is rejected by the mamba pre-check; a decodes and finishes
    assert not out.is_prefill and ids(out.scheduled_requests) == ["a"]
    assert scans == []  # with the mamba pool full, no reservation scan happens
    assert a.status is RequestStatus.FINISHED
    assert a.mamba_cache_index is None  # the row went back with complete_requests
    assert list(s.mamba_cache_manager.free_block_ids) == [1]
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["b"] and b.mamba_cache_index == 1


def test_mamba_allocation_failure_leaves_pages_cached(sched_cls, variant, monkeypatch):
    """§9.13: the new pages are released with free_blocks, so they linger in used with ref 0."""
    s = sched_cls(num_blocks=8, block_size=16, has_mamba_cache=True, reservation=variant)
    a, b = mk("a", 20, 4), mk("b", 4, 4)
    s.add_request(a)
    s.add_request(b)
    monkeypatch.setattr(s.mamba_cache_manager, "allocate", lambda: None)
    assert s.schedule() is None
    assert ids(s.waiting_queue) == ["b", "a"]  # the head was deferred to the tail
    assert a.block_table == [] and a.mamba_cache_index is None
    bm = s.cache_manager
    assert bm.used_block_ids == {0, 1} and refs(s, [0, 1]) == [0, 0]
    assert list(bm.free_block_ids) == list(range(2, 8))
    assert bm.get_total_usable_blocks() == 8


def test_empty_prompt_gets_empty_table(sched_cls, variant):
    """§9.17: P=0 gives ncomp=0, an empty table and empty slots (not guarded)."""
    s = sched_cls(num_blocks=8, block_size=16, reservation=variant)
    r = mk("r", 0, 4)
    s.add_request(r)
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["r"]
    assert r.block_table == [] and r.slot_mapping == [] and r.num_computed_tokens == 0


def test_token_budget_counts_only_uncached_tokens(sched_cls, variant):
    s = sched_cls(num_blocks=16, block_size=16, max_num_batched_tokens=20, reservation=variant)
    prompt = list(range(300, 340))
    s.add_request(mk("warm", 40, 1, tokens=prompt))
    engine_step(s)  # publishes two full blocks
    a, b = mk("a", 40, 4, tokens=prompt), mk("b", 10, 4)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert a.num_local_cached_tokens == 32
    assert ids(out.scheduled_requests) == ["a", "b"]  # 8 + 10 <= 20


def test_legacy_reservation_negative_when_max_tokens_zero():
    """§9.16: with M=0 the legacy running reservation ceil((0 - g)/B) can go negative."""
    r = mk("r", 4, 0)
    for t in range(20):
        r.append_generated_token_id(t)
    r.block_table = [0, 1]
    assert legacy_running_blocks(r, 16) == -1
    assert exact_blocks(r, 16) == 0 and tight_blocks(r, 16) == 0
