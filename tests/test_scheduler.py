"""Behavioural tests of InfiniLM v0.2.9c's request ``Scheduler`` and its reservation variants.

Every behavioural test runs against both the executable spec and the production scheduler (ids
``spec`` and ``impl``) and, where the reservation policy matters, against each variant
(``legacy``, ``exact``, ``tight``). Section numbers refer to docs/infinilm.md.
"""

from __future__ import annotations

import pytest
from scheduler_support import (
    FakeConnector,
    engine_step,
    finish_step,
    ids,
    mk,
    refs,
)

from impl.infinilm import scheduler as impl_sched
from spec.infinilm.block_manager import ceil_div
from spec.infinilm.request import RequestStatus
from spec.infinilm.scheduler import (
    exact_blocks,
    legacy_running_blocks,
    remote_reservation,
    tight_blocks,
)

# ----------------------------------------------------------------------------- §7.2 worked example


def _worked_example_7_2(sched_cls, variant):
    """Build the reference §7.2 state through the public API.

    R1 (P=17, M=15) and R2 (P=1, M=32) are prefilled and sampled once (g=1); Q (P=20, M=12) is
    admitted as remote-pending (the connector answers 19 external tokens, async).
    """
    conn = FakeConnector({"Q": (19, True)})
    s = sched_cls(
        max_batch_size=16,
        num_blocks=8,
        block_size=16,
        connector=conn,
        enable_prefix_caching=False,
        reservation=variant,
    )
    r1, r2, q = mk("R1", 17, 15), mk("R2", 1, 32), mk("Q", 20, 12)
    for r in (r1, r2, q):
        s.add_request(r)
    out = engine_step(s)
    assert out.is_prefill and ids(out.scheduled_requests) == ["R1", "R2"]
    assert (r1.block_table, r2.block_table, q.block_table) == ([0, 1], [2], [3, 4])
    assert r1.get_num_generated_tokens() == r2.get_num_generated_tokens() == 1
    assert q.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert list(s.remote_kv_requests) == ["Q"]
    assert ids(s.running_queue) == ["R1", "R2"]
    assert s.cache_manager.get_total_usable_blocks() == 3  # 8 - 5 referenced
    return s, r1, r2, q, mk("C", 5, 11)


def _schedule_candidate(s, c):
    """Add C and schedule once; return the output."""
    s.add_request(c)
    return s.schedule()


def test_worked_example_7_2_legacy_rejects(sched_cls):
    s, r1, r2, q, c = _worked_example_7_2(sched_cls, "legacy")
    assert [legacy_running_blocks(r, 16) for r in (r1, r2)] == [1, 2]
    assert s._running_required_blocks() == 3
    assert s.num_reserved_decode_blocks == 3
    assert s.pending_kv_decode_blocks == remote_reservation("legacy", q, 16) == 1  # ceil(12/16)
    assert ceil_div(c.get_prompt_length() + c.sampling_params.max_tokens, 16) == 1
    assert s.can_accept_request(c, 0) is False  # need 3 + 1 + 1 = 5 > 3
    out = _schedule_candidate(s, c)
    assert not out.is_prefill and ids(out.scheduled_requests) == ["R1", "R2"]
    assert ids(s.waiting_queue) == ["C"] and c.block_table == []


def test_worked_example_7_2_exact_accepts(sched_cls):
    s, r1, r2, q, c = _worked_example_7_2(sched_cls, "exact")
    assert [exact_blocks(r, 16) for r in (r1, r2, q)] == [0, 2, 0]
    assert s._running_required_blocks() == 2
    assert s.num_reserved_decode_blocks == 2
    assert s.pending_kv_decode_blocks == 0  # ceil(32 / 16) - 2
    assert s.can_accept_request(c, 0) is True  # need 2 + 1 + 0 = 3 <= 3
    out = _schedule_candidate(s, c)
    assert out.is_prefill and ids(out.scheduled_requests) == ["C"]
    assert c.block_table == [5] and list(s.waiting_queue) == []


def test_worked_example_7_2_tight_accepts(sched_cls):
    s, r1, r2, q, c = _worked_example_7_2(sched_cls, "tight")
    # the true remaining needs of reference §7.2: R1 0, R2 1, Q 0
    assert [tight_blocks(r, 16) for r in (r1, r2, q)] == [0, 1, 0]
    assert s._running_required_blocks() == 1
    assert s.num_reserved_decode_blocks == 1
    assert s.pending_kv_decode_blocks == 0
    assert s.can_accept_request(c, 0) is True  # need 1 + 1 + 0 = 2 <= 3
    out = _schedule_candidate(s, c)
    assert out.is_prefill and ids(out.scheduled_requests) == ["C"]
    assert c.block_table == [5]


# ----------------------------------------------------------------------------- §7.1 formulas


@pytest.mark.parametrize(
    ("prompt", "generated", "max_tokens", "expected"),
    [
        (16, 1, 17, {"legacy": 1, "exact": 2, "tight": 1}),
        (1, 16, 32, {"legacy": 1, "exact": 2, "tight": 1}),
    ],
    ids=["P16-g1-M17", "P1-g16-M32"],
)
def test_exact_can_exceed_legacy_at_boundary(
    sched_cls, variant, prompt, generated, max_tokens, expected
):
    size = 16
    req = mk("r", prompt, max_tokens)
    for t in range(generated):
        req.append_generated_token_id(t)
    req.block_table = list(range(ceil_div(prompt + generated - 1, size)))
    req.num_blocks = len(req.block_table)
    assert len(req.block_table) == 1
    assert legacy_running_blocks(req, size) == expected["legacy"]
    assert exact_blocks(req, size) == expected["exact"]
    assert tight_blocks(req, size) == expected["tight"]
    assert exact_blocks(req, size) > legacy_running_blocks(req, size)  # P + M ≡ 1 (mod B)
    s = sched_cls(num_blocks=8, block_size=size, reservation=variant)
    req.status = RequestStatus.RUNNING
    s.complete_requests([req])  # joins the running queue (the impl counter too)
    assert ids(s.running_queue) == ["r"]
    assert s.num_reserved_decode_blocks == expected[variant]


# ----------------------------------------------------------------------------- §9.5, §9.6


def test_deferred_head_moves_to_tail(sched_cls, variant):
    s = sched_cls(num_blocks=4, block_size=16, reservation=variant)
    a, b, c = mk("A", 100, 1), mk("B", 5, 1), mk("C", 5, 1)
    for r in (a, b, c):
        s.add_request(r)
    assert s.schedule() is None  # A needs ceil(101/16) = 7 > 4 pages: rejected, the loop breaks
    assert ids(s.waiting_queue) == ["B", "C", "A"]
    assert a.block_table == [] and s.cache_manager.get_num_free_blocks() == 4
    out = s.schedule()  # B and C overtake A; A is rejected again and stays at the tail
    assert out.is_prefill and ids(out.scheduled_requests) == ["B", "C"]
    assert ids(s.waiting_queue) == ["A"]


def test_prefill_suppresses_decode(sched_cls, variant):
    s = sched_cls(num_blocks=16, block_size=16, reservation=variant)
    r = mk("R", 4, 8)
    s.add_request(r)
    engine_step(s)
    assert ids(s.running_queue) == ["R"]
    reserved = s.num_reserved_decode_blocks
    w = mk("W", 4, 8)
    s.add_request(w)
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["W"]
    assert ids(s.running_queue) == ["R"]  # the decode phase never ran
    assert r.get_num_generated_tokens() == 1 and r.slot_mapping == list(range(4))
    assert s.num_reserved_decode_blocks == reserved
    finish_step(s, out)
    out = engine_step(s)
    assert not out.is_prefill and ids(out.scheduled_requests) == ["R", "W"]
    assert r.slot_mapping == [r.block_table[0] * 16 + 4]


# ----------------------------------------------------------------------------- §9.7, §3.1


def test_prefix_hit_capped_at_p_minus_1(sched_cls):
    size = 16
    s = sched_cls(num_blocks=16, block_size=size, enable_prefix_caching=True)
    bm = s.cache_manager
    prompt = list(range(100, 164))  # 64 tokens = 4 full blocks
    a = mk("a", 64, 1, tokens=prompt)
    s.add_request(a)
    engine_step(s)  # prefilled, published after execution, finished (max_tokens=1)
    assert a.status is RequestStatus.FINISHED and a.block_table == [0, 1, 2, 3]
    assert [bm.blocks[p].hash for p in a.block_table] == list(a.block_hashes[:4])
    assert refs(s, a.block_table) == [0, 0, 0, 0]

    b = mk("b", 64, 1, tokens=prompt)
    s.add_request(b)
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["b"]
    # only floor((64 - 1) / 16) = 3 blocks hit: the aligned prompt recomputes its last block
    assert b.num_computed_tokens == 48 and b.num_local_cached_tokens == 48
    assert b.num_cache_indexed_blocks == 3
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] not in a.block_table
    assert b.slot_mapping == [b.block_table[3] * size + i for i in range(size)]
    assert refs(s, a.block_table) == [1, 1, 1, 0]
    finish_step(s, out)

    c = mk("c", 65, 1, tokens=[*prompt, 7])  # not block aligned: all 4 blocks may hit
    s.add_request(c)
    s.schedule()
    assert c.num_computed_tokens == 64 and len(c.slot_mapping) == 1
    assert c.block_table[:3] == a.block_table[:3]
    assert bm.blocks[c.block_table[3]].hash == a.block_hashes[3]


# ----------------------------------------------------------------------------- token budget


def test_token_budget_first_request_always_passes(sched_cls, variant):
    s = sched_cls(num_blocks=16, block_size=16, max_num_batched_tokens=8, reservation=variant)
    a, b = mk("A", 20, 4), mk("B", 1, 4)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["A"]  # 20 > 8 but first
    assert ids(s.waiting_queue) == ["B"]  # the loop stopped: the budget is spent; B never popped


def test_token_budget_defers_second(sched_cls, variant):
    s = sched_cls(num_blocks=16, block_size=16, max_num_batched_tokens=30, reservation=variant)
    a, b, c = mk("A", 20, 4), mk("B", 20, 4), mk("C", 5, 4)
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["A"]
    assert ids(s.waiting_queue) == ["C", "B"]  # B deferred to the tail; C never popped
    assert b.block_table == []
    finish_step(s, out)
    out = s.schedule()
    assert out.is_prefill and ids(out.scheduled_requests) == ["C", "B"]  # 5 + 20 <= 30


# ----------------------------------------------------------------------------- admission (§5.4, §6)


def test_current_batch_prefill_extra_stays_live(sched_cls, variant):
    """PR #579 test: N=5, B=16, three 1-token prompts with M=16 admit 0 and 1, defer 2."""
    s = sched_cls(num_blocks=5, block_size=16, reservation=variant)
    for i in range(3):
        s.add_request(mk(str(i), 1, 16))
    out = s.schedule()
    assert ids(out.scheduled_requests) == ["0", "1"]
    assert ids(s.waiting_queue) == ["2"]
    assert s.cache_manager.get_num_free_blocks() == 3


def test_remote_reservation_stays_live(sched_cls):
    """A remote-pending reservation counts against later candidates (legacy: pending == 1)."""
    conn = FakeConnector({"q": (15, True)})
    s = sched_cls(num_blocks=3, block_size=16, connector=conn, reservation="legacy")
    s.add_request(mk("q", 16, 16))  # own = 2 pages, 1 allocated, pending += ceil(16/16) = 1
    s.add_request(mk("c", 1, 15))  # own = 1, usable 2, need 1 + 1 = 2: admitted
    s.add_request(mk("d", 1, 15))  # need 1 + 1 + extra 0 = 2 > usable 1: deferred
    out = s.schedule()
    assert s.pending_kv_decode_blocks == 1
    assert ids(out.scheduled_requests) == ["c"] and ids(s.waiting_queue) == ["d"]


# ----------------------------------------------------------------------------- lockstep workload
# Larger than the checkers' drawn pools: 40 pages of 8 tokens, batches of 4 and 48 tokens, a PD
# connector, prompts sharing prefixes. Run through the scheduler component's own engine-loop
# checker (spec vs impl after every event: outputs, queues, counters, snapshots, invariants).
WORKLOAD = {
    "num_blocks": 40,
    "block_size": 8,
    "max_batch_size": 4,
    "max_num_batched_tokens": 48,
    "connector": True,
    "mamba": False,
    "prefix_caching": True,
}
WORKLOAD_PATHS = {"path:prefill_step", "path:decode_step", "path:remote_pending"}


def _workload(variant, seed):
    from kvspec import components
    from stateful_tests.checker import Example

    result = components.get("infinilm-scheduler").run_example(
        impl_sched.Scheduler, "impl", Example(seed, steps=300, config=WORKLOAD), variant=variant
    )
    assert result.passed, result.failure
    assert set(result.coverage) >= WORKLOAD_PATHS, result.coverage


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("variant", ["exact", "tight"])
def test_reservation_counter_matches_scan(variant, seed):
    _workload(variant, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spec_impl_lockstep_legacy(seed):
    """PR #579's once-per-step scan gives the same decisions as legacy's per-candidate scans."""
    _workload("legacy", seed)
