"""Behaviours that no kvspec check exercised until generic mutation testing (``kvspec mutants
--generic``) showed a cosmic-ray mutant of impl/ surviving them.

Each test drives the spec and the impl through the public API on the same calls and requires the
same outcome (return value or exception kind) and the same snapshot, plus the spec's documented
post-condition; it names the survivor it kills (stateful_tests/generic_mutation/SURVIVORS.md).
These tests are part of every module's oracle in stateful_tests/generic_mutation/modules.toml.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from impl.infinilm import block_manager as impl_bm
from impl.infinilm import scheduler as impl_sched
from impl.vllm import arc as impl_arc
from impl.vllm import lru as impl_lru
from impl.vllm import offload_manager as impl_om
from spec.errors import exception_kind
from spec.infinilm import block_manager as spec_bm
from spec.infinilm import scheduler as spec_sched
from spec.infinilm.request import InferenceRequest, SamplingParams
from spec.infinilm.scheduler import RESERVATIONS, KVConnectorOutput, ModelRunnerOutput
from spec.vllm import BlockStatus
from spec.vllm import arc as spec_arc
from spec.vllm import lru as spec_lru
from spec.vllm import offload_manager as spec_om

BM_CLASSES = [spec_bm.BlockManager, impl_bm.BlockManager]


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "returned", fn()
    except Exception as exc:  # the contract compares exception kinds
        return "raised", exception_kind(exc)


def lockstep_bm(
    num_blocks: int, block_size: int, calls: Callable[[Any], Any]
) -> list[tuple[tuple[str, Any], Any]]:
    """Run ``calls(bm)`` on a spec and an impl block manager; (outcome, snapshot) per side."""
    sides = []
    for cls in BM_CLASSES:
        bm = cls(num_blocks, block_size)
        sides.append((_outcome(lambda bm=bm: calls(bm)), bm.snapshot()))
    return sides


# ----------------------------------------------------------------------------- block manager
@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_append_slots_from_the_first_token_of_an_empty_table(block_size: int) -> None:
    """``start_num_tokens == 1`` is legal (the table then holds ceil(0 / B) = 0 pages) and maps
    token indices [0, num_slots). Kills ``start_num_tokens <= 0`` → ``<= 1`` in append_slots."""
    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(
        4, block_size, lambda bm: bm.append_slots([], 1, 3)
    )
    assert spec_out == impl_out and spec_snap == impl_snap
    kind, (table, slots) = spec_out
    assert kind == "returned" and len(table) == -(-3 // block_size)
    assert slots == [table[t // block_size] * block_size + t % block_size for t in range(3)]


@pytest.mark.parametrize(("computed", "total"), [(5, 3), (1, 0), (300, 299), (1000, 1000)])
def test_update_blocks_slot_empty_range_needs_no_table(computed: int, total: int) -> None:
    """``num_computed_tokens >= total_tokens`` returns ``[]`` before the table is checked, even
    for a table too short to map anything (and for ints beyond CPython's small-int cache). Kills
    ``>=`` → ``is`` / ``==`` in update_blocks_slot."""
    computed, total = int(str(computed)), int(str(total))  # distinct int objects
    for cls in BM_CLASSES:
        assert cls(4, 2).update_blocks_slot([], computed, total) == []


NON_INT_COUNTS = [True, False, 1.0, 2.5, "1", None]
COUNT_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "can_allocate": lambda bm, n: bm.can_allocate(n),
    "try_free_blocks": lambda bm, n: bm.try_free_blocks(n),
    "allocate_slots(new)": lambda bm, n: bm.allocate_slots(n, 0),
    "allocate_slots(computed)": lambda bm, n: bm.allocate_slots(1, n),
    "append_slot": lambda bm, n: bm.append_slot([], n),
    "append_slots(num_slots)": lambda bm, n: bm.append_slots([], 1, n),
    "truncate_blocks": lambda bm, n: bm.truncate_blocks([0], n),
    "update_blocks_slot(computed)": lambda bm, n: bm.update_blocks_slot([0], n, 1),
    "update_blocks_slot(total)": lambda bm, n: bm.update_blocks_slot([0], 0, n),
}


@pytest.mark.parametrize("call", sorted(COUNT_CALLS))
@pytest.mark.parametrize("count", NON_INT_COUNTS, ids=repr)
def test_counts_that_are_not_ints_are_rejected_like_the_spec(call: str, count: Any) -> None:
    """A count must be a non-negative int, ``bool`` excluded (spec ``check_count``); the impl's
    fast paths (``type(n) is not int or n < 0``) must fall back to the same validation. Kills
    ``not`` inserted into try_free_blocks' fast-path guard (bools and floats then skip it)."""

    def calls(bm: Any) -> Any:
        bm.allocate_slots(2, 0)  # page 0 in use, so the table [0] is valid where one is needed
        bm.free_blocks([0])  # ... and unreferenced: a reclaim candidate
        bm.allocate_slots(2, 0)
        return COUNT_CALLS[call](bm, count)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(4, 2, calls)
    assert spec_out == impl_out and spec_snap == impl_snap


@pytest.mark.parametrize("block_size", [1, 2, 4])
@pytest.mark.parametrize("start", [0, -1, -5, 1.0, "1"])
def test_append_slots_rejects_a_start_below_one_or_not_an_int(block_size: int, start: Any) -> None:
    """``start_num_tokens`` must be an int >= 1 (validated before the table length). Kills
    ``<= 0`` → ``<= -1`` / ``== 0`` and ``or`` → ``and`` in append_slots' check."""
    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(
        4, block_size, lambda bm: bm.append_slots([], start, 3)
    )
    assert spec_out == impl_out == ("raised", "ValueError") and spec_snap == impl_snap


def test_append_slots_on_a_table_of_more_than_256_pages() -> None:
    """A long table (300 pages of one token) is compared by value, not identity (CPython caches
    ints up to 256 only). Kills ``len(block_table) != expected`` → ``is not`` in append_slots."""

    def calls(bm: Any) -> Any:
        table, _ = bm.allocate_slots(300, 0)
        return bm.append_slots(table, 301, 2)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(310, 1, calls)
    assert spec_out == impl_out and spec_snap == impl_snap
    kind, (table, slots) = spec_out
    assert kind == "returned" and len(table) == 302 and slots == table[300:]


def test_truncate_blocks_of_a_table_of_more_than_256_pages() -> None:
    """Truncating a 300-page table does not mistake it for one with repeated pages (lengths
    compare by value). Kills ``len(set(block_table)) != len(block_table)`` → ``is not`` in
    truncate_blocks."""

    def calls(bm: Any) -> Any:
        table, _ = bm.allocate_slots(300, 0)
        return bm.truncate_blocks(table, 298)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(310, 1, calls)
    assert spec_out == impl_out and spec_snap == impl_snap
    kind, kept = spec_out
    assert kind == "returned" and kept == list(range(298))


def test_truncate_blocks_rejects_a_released_page() -> None:
    """A released page (ref 0, still in ``used`` because it is unhashed) cannot be truncated:
    only pages held exactly once may be (spec ``_check_exclusive``). Kills ``ref_count != 1`` →
    ``> 1`` in _check_exclusive (the page would be freed and the referenced counter go wrong)."""

    def calls(bm: Any) -> Any:
        table, _ = bm.allocate_slots(4, 0)
        bm.free_blocks(table)
        return bm.truncate_blocks(table, 2)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(4, 2, calls)
    assert spec_out == impl_out == ("raised", "RuntimeError") and spec_snap == impl_snap
    assert BM_CLASSES[1](4, 2).get_total_usable_blocks() == 4


@pytest.mark.parametrize("bad_hash", [b"", "h1", None])
def test_publish_rejects_an_empty_or_non_bytes_hash(bad_hash: Any) -> None:
    """A published hash must be non-empty bytes (validated before anything is indexed). Kills
    ``or`` → ``and`` in publish_computed_blocks' hash check."""

    def calls(bm: Any) -> Any:
        table, _ = bm.allocate_slots(4, 0)
        return bm.publish_computed_blocks(table, [b"h0", bad_hash], 0, 4)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(4, 2, calls)
    assert spec_out == impl_out == ("raised", "ValueError") and spec_snap == impl_snap


@pytest.mark.parametrize("start_block", [-1, -2, 3])
def test_publish_rejects_a_start_block_outside_the_range(start_block: int) -> None:
    """``start_block`` must lie in ``[0, end]`` (a negative one would index the table from its
    end and publish the uncomputed last page). Kills ``0 <= start_block`` → ``-1 <= start_block``
    in publish_computed_blocks."""

    def calls(bm: Any) -> Any:
        table, _ = bm.allocate_slots(6, 0)  # three pages; the first two are computed
        return bm.publish_computed_blocks(table, [b"h0", b"h1", b"h2"], start_block, 4)

    (spec_out, spec_snap), (impl_out, impl_snap) = lockstep_bm(4, 2, calls)
    assert spec_out == impl_out == ("raised", "ValueError") and spec_snap == impl_snap


# ----------------------------------------------------------------------------- scheduler
class AsyncConnector:
    """A PD connector double: the prompt (but its last token) of every request whose id starts
    with ``q`` arrives asynchronously; the others are computed locally."""

    def get_num_new_matched_tokens(self, req: Any, num_local_computed_tokens: int) -> Any:
        if req.request_id.startswith("q"):
            return req.prompt_length - 1, True
        return 0, False

    def update_state_after_alloc(self, req: Any, table: Any, external: int, size: int) -> None:
        pass

    def request_finished(self, req: Any, table: Any, size: int) -> Any:
        return False, None

    def build_connector_meta(self) -> None:
        return None


class OneRemoteConnector(AsyncConnector):
    """Only the request named ``remote`` is received asynchronously; the others compute."""

    def get_num_new_matched_tokens(self, req: Any, num_local_computed_tokens: int) -> Any:
        if req.request_id == "remote":
            return req.prompt_length - 1, True
        return 0, False


def _request(rid: str, prompt_len: int, max_tokens: int) -> InferenceRequest:
    return InferenceRequest(rid, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens))


def _finish(s: Any, out: Any) -> None:
    """The engine's bookkeeping after a step: one generated token per scheduled request."""
    for req in out.scheduled_requests:
        s.commit_computed_tokens(req, req.get_total_length())
        req.append_generated_token_id(1)
    s.complete_requests(out.scheduled_requests)


@pytest.mark.parametrize("variant", RESERVATIONS)
@pytest.mark.parametrize(("budget", "scheduled"), [(48, ["q1", "q2"]), (47, ["q1"])])
def test_requeued_remote_requests_are_charged_their_uncached_tokens(
    variant: str, budget: int, scheduled: list[str]
) -> None:
    """Two remote requests (40 tokens) whose receive failed at their second page are re-queued
    (quirk §9.11) with 16 tokens local; the next prefill step charges each ``40 - 16 = 24``
    tokens against the budget: both fit in 48, the second does not fit in 47 and ends the step
    (a later one-token request waits). Kills every operator replacement of ``prompt -
    num_local_cached_tokens`` in schedule()'s budget check for resumed requests (``+ | ** <<``
    charge more, ``% & /`` less) and ``break`` → ``continue`` after it."""
    seen = []
    for cls in (spec_sched.Scheduler, impl_sched.Scheduler):
        s = cls(
            num_blocks=16,
            block_size=16,
            max_num_batched_tokens=budget,
            connector=AsyncConnector(),
            enable_prefix_caching=False,
            reservation=variant,
        )
        s.add_request(_request("q1", 40, 8))
        s.add_request(_request("q2", 40, 8))
        s.schedule()  # both wait for their remote KV (pages 0-2 and 3-5)
        failed = KVConnectorOutput(failed_recving={"q1", "q2"}, invalid_block_ids={1, 4})
        s.update_from_output(ModelRunnerOutput(failed))
        s.schedule()  # promotion: both failed part-way -> back to the waiting queue
        local = [r.num_local_cached_tokens for r in s.waiting_queue]
        s.add_request(_request("c", 1, 8))  # fits after q1 whatever happens to q2
        out = s.schedule()
        seen.append((local, [r.request_id for r in out.scheduled_requests], out.is_prefill))
    assert seen[0] == seen[1] == ([16, 16], scheduled, True)


def test_can_accept_request_takes_keyword_arguments() -> None:
    """Upstream's ``can_accept_request(req, num_local_computed_tokens,
    current_prefill_extra_blocks=0)`` may be called with keywords. Kills ``*`` → ``/`` (which
    makes the leading parameters positional-only) in the impl's signature."""
    answers = []
    for cls in (spec_sched.Scheduler, impl_sched.Scheduler):
        s = cls(num_blocks=8, block_size=4)
        req = _request("r", 5, 3)
        answers.append(
            s.can_accept_request(
                req=req, num_local_computed_tokens=0, current_prefill_extra_blocks=1
            )
        )
    assert answers == [True, True]


def test_scheduler_defaults_match_the_spec() -> None:
    """The upstream constructor defaults are part of the API (a target is built the same way).
    Kills the number replacements of impl Scheduler's default arguments."""
    spec_s, impl_s = spec_sched.Scheduler(), impl_sched.Scheduler()
    for name in (
        "max_batch_size",
        "max_num_batched_tokens",
        "block_size",
        "enable_prefix_caching",
        "has_mamba_cache",
        "reservation",
    ):
        assert getattr(impl_s, name) == getattr(spec_s, name), name
    assert impl_s.cache_manager.snapshot() == spec_s.cache_manager.snapshot()


def test_impl_scheduler_builds_the_impl_block_manager() -> None:
    """Without a ``block_manager`` argument the production scheduler runs on the production block
    manager (the spec's is observably identical, so only this catches the swap — and every
    scheduler benchmark would silently measure the slow one). Kills ``block_manager or
    BlockManager(...)`` → ``and`` in Scheduler.__init__."""
    s = impl_sched.Scheduler(num_blocks=8, block_size=4)
    assert type(s.cache_manager) is impl_bm.BlockManager
    shared = impl_bm.BlockManager(8, 4)
    assert (
        impl_sched.Scheduler(num_blocks=8, block_size=4, block_manager=shared).cache_manager
        is shared
    )


def test_decode_batch_larger_than_256_stops_at_max_batch_size() -> None:
    """With 258 running requests and ``max_batch_size=257`` a decode step takes exactly 257
    (batch sizes above CPython's small-int cache compare by value). Kills ``len(batch) <
    max_batch_size`` → ``is not`` in the decode loop."""
    seen = []
    for cls in (spec_sched.Scheduler, impl_sched.Scheduler):
        s = cls(max_batch_size=257, num_blocks=4096, block_size=1, max_num_batched_tokens=4096)
        for i in range(258):
            s.add_request(_request(f"r{i}", 1, 4))
        sizes = []
        for _ in range(3):  # two prefill steps (257 + 1), then one decode step
            out = s.schedule()
            _finish(s, out)
            sizes.append((len(out.scheduled_requests), out.is_prefill))
        seen.append(sizes)
    assert seen[0] == seen[1] == [(257, True), (1, True), (257, False)]


def test_remote_promotion_stops_at_a_full_batch_larger_than_256() -> None:
    """A received remote request is not promoted into a decode batch that already holds
    ``max_batch_size = 257`` requests. Kills ``len(batch) >= max_batch_size`` → ``is`` in the
    remote promotion."""
    seen = []
    for cls in (spec_sched.Scheduler, impl_sched.Scheduler):
        s = cls(
            max_batch_size=257,
            num_blocks=4096,
            block_size=1,
            max_num_batched_tokens=4096,
            connector=OneRemoteConnector(),
        )
        s.add_request(_request("remote", 2, 4))
        for i in range(257):
            s.add_request(_request(f"r{i}", 1, 4))
        _finish(s, s.schedule())  # remote waits for its KV; 257 prefills
        s.update_from_output(ModelRunnerOutput(KVConnectorOutput(finished_recving={"remote"})))
        out = s.schedule()  # decode: the batch is full before the promotion
        seen.append((len(out.scheduled_requests), out.is_prefill, "remote" in s.remote_kv_requests))
    assert seen[0] == seen[1] == (257, False, True)


# ----------------------------------------------------------------------------- vllm ARC
ARC_CLASSES = [spec_arc.ARCCachePolicy, impl_arc.ARCCachePolicy]


def test_arc_policy_constructor_defaults_and_keywords() -> None:
    """``t1_fallback`` is off unless asked for (the #50992 state; #55461 is the named variant),
    ``cache_capacity`` may be passed by keyword and ``t1_fallback`` only by keyword. Kills
    ``t1_fallback: bool = False`` → ``True`` and ``*`` → ``/`` in the impl's constructor."""
    assert [cls(4).t1_fallback for cls in ARC_CLASSES] == [False, False]
    assert [cls(cache_capacity=4).cache_capacity for cls in ARC_CLASSES] == [4, 4]
    for cls in ARC_CLASSES:
        with pytest.raises(TypeError):
            cls(4, True)


def test_arc_policy_remove_takes_a_block_out_of_t2() -> None:
    """``remove`` (the upstream CachePolicy API) drops a key from T1 *or* T2; the manager only
    removes pending keys, which sit in T1, so only the policy API reaches T2. Kills ``not``
    inserted into impl ARC ``remove``'s T1 test (T2 keys were kept)."""
    snaps = []
    for cls in ARC_CLASSES:
        p = cls(4)
        p.insert("a", BlockStatus(0, ref_cnt=0))
        p.insert("b", BlockStatus(1, ref_cnt=0))
        p.touch(["a"])  # a ready block touched again moves to T2
        p.remove("a")
        p.remove("b")
        snaps.append(p.snapshot())
    assert snaps[0] == snaps[1]
    assert list(snaps[0].t1) == list(snaps[0].t2) == []


# ----------------------------------------------------------------------------- vllm LRU
LRU_CLASSES = [spec_lru.LRUCachePolicy, impl_lru.LRUCachePolicy]


def _lru_lockstep(calls: Callable[[Any], Any], **kw: Any) -> list[tuple[Any, Any]]:
    sides = []
    for cls in LRU_CLASSES:
        p = cls(**kw)
        sides.append((_outcome(lambda p=p: calls(p)), p.snapshot()))
    return sides


def test_lru_policy_constructor_keywords_and_a_runtime_variant_name() -> None:
    """``cache_capacity`` may be passed by keyword, ``variant`` only by keyword, and a variant
    name built at run time (from a CLI or a JSON manifest) selects the same variant as the
    literal. Kills ``*`` → ``/`` and ``variant == "v2"`` → ``is`` in the impl's constructor."""
    for cls in LRU_CLASSES:
        with pytest.raises(TypeError):
            cls(4, "v1")

    def calls(p: Any) -> Any:
        p.insert("pending", BlockStatus(0))  # a store in flight: in v1's order, not in v2's
        p.insert("idle", BlockStatus(1, ref_cnt=0))
        return p.evict(1, set())

    (spec_out, spec_snap), (impl_out, impl_snap) = _lru_lockstep(
        calls, cache_capacity=4, variant="".join(["v", "2"])
    )
    assert spec_out == impl_out and spec_snap == impl_snap and spec_snap.order == ()


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_lru_policy_inserted_idle_and_pinned_blocks(variant: str) -> None:
    """Through the policy API (the manager only ever inserts pending blocks) an idle inserted
    block is evictable and a pinned one is not, ``evict(0)`` evicts nothing and a removed idle
    block leaves the order. Kills the mutants of v2 ``insert``'s ``self._v2 and block.ref_cnt ==
    0``, ``n == 0`` → ``n < 0`` in ``evict`` (whose general path would then evict every idle
    block) and ``not`` inserted into ``remove``'s v2 test."""

    def calls(p: Any) -> Any:
        p.insert("pinned", BlockStatus(0, ref_cnt=1))
        p.insert("idle", BlockStatus(1, ref_cnt=0))
        p.insert("idle2", BlockStatus(2, ref_cnt=0))
        none = p.evict(0, set())
        victims = p.evict(1, set())
        p.remove("idle2")  # an idle block leaves the recency order too
        return none, victims, p.snapshot()

    (spec_out, spec_snap), (impl_out, impl_snap) = _lru_lockstep(
        calls, cache_capacity=4, variant=variant
    )
    assert spec_out == impl_out and spec_snap == impl_snap
    _, (none, victims, _) = spec_out
    assert none == [] and [k for k, _ in victims] == ["idle"]


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_lru_policy_evicts_exactly_n_of_more_than_256_blocks(variant: str) -> None:
    """Evicting 257 of 300 idle blocks takes exactly 257 (the count compares by value). Kills
    ``len(victims) == n`` → ``is`` in both variants' ``evict`` loops."""

    def calls(p: Any) -> Any:
        for i in range(300):
            p.insert(i, BlockStatus(i, ref_cnt=0))
        return len(p.evict(257, set()))

    (spec_out, spec_snap), (impl_out, impl_snap) = _lru_lockstep(
        calls, cache_capacity=300, variant=variant
    )
    assert spec_out == impl_out == ("returned", 257) and spec_snap == impl_snap


# ----------------------------------------------------------------------------- vllm manager
OM_CLASSES = [spec_om.CPUOffloadingManager, impl_om.CPUOffloadingManager]


def _store_all(m: Any, keys: list[int]) -> Any:
    out = m.prepare_store(keys)
    if out is None:
        return None
    m.complete_store(out.keys_to_store)
    return out.keys_to_store, out.evicted_keys, list(out.store_spec.block_ids)


@pytest.mark.parametrize("policy", ["arc", "lru"])
def test_offload_store_of_more_than_256_distinct_keys(policy: str) -> None:
    """A batch of 300 distinct keys is not mistaken for one with repeats (lengths compare by
    value). Kills ``len(set(keys)) != len(keys)`` → ``is not`` in prepare_store."""
    sides = []
    for cls in OM_CLASSES:
        m = cls(300, policy)
        sides.append((_outcome(lambda m=m: _store_all(m, list(range(300)))), m.snapshot()))
    assert sides[0] == sides[1] and sides[0][0][0] == "returned"


def test_offload_manager_constructor_defaults() -> None:
    """The upstream defaults (LRU policy, events off, store threshold 1, ...) are part of the
    API. Kills replacements of the impl constructor's default arguments."""
    sides = []
    for cls in OM_CLASSES:
        m = cls(2)
        stored = [_store_all(m, [k]) for k in (1, 2, 3)]  # the third store evicts
        m.touch([2])
        sides.append((stored, list(m.take_events()), m.snapshot()))
    assert sides[0] == sides[1]


def test_offload_manager_default_attributes() -> None:
    """Defaults that only show after 64,000 tracked keys are compared as attributes."""
    spec_m, impl_m = (cls(2) for cls in OM_CLASSES)
    for name in ("store_threshold", "max_tracker_size", "medium"):
        assert getattr(impl_m, name) == getattr(spec_m, name), name


def test_offload_store_threshold_above_two() -> None:
    """With ``store_threshold=3`` a key looked up twice is still not stored. Kills
    ``store_threshold >= 2`` → ``== 2`` (no tracker above 2) in the constructor."""
    sides = []
    for cls in OM_CLASSES:
        m = cls(4, store_threshold=3)
        m.lookup(7)
        m.lookup(7)
        skipped = _store_all(m, [7])
        m.lookup(7)
        sides.append((skipped, _store_all(m, [7]), m.snapshot()))
    assert sides[0] == sides[1] and sides[0][0] == ([], [], [])


def test_offload_tracker_bounded_above_256_keys() -> None:
    """The store-threshold tracker holds at most ``max_tracker_size = 257`` keys after 300
    distinct lookups (sizes compare by value). Kills ``len(counts) >= max_tracker_size`` →
    ``is`` in lookup."""
    snaps = []
    for cls in OM_CLASSES:
        m = cls(4, store_threshold=2, max_tracker_size=257)
        for k in range(300):
            m.lookup(k)
        snaps.append(m.snapshot())
        assert len(m.counts) == 257
    assert snaps[0] == snaps[1]
