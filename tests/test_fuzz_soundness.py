"""The fuzzer's fast paths check as much as the plain checks did.

What the shortcuts could get wrong, each pinned by a test that fails if it did:

* the verdict memo (:class:`~stateful_tests.lockstep.Verdicts`) remembers only states that passed,
  keyed by the whole state, so a state differing in one field is checked afresh;
* the verdict-preserving shortcuts of :mod:`stateful_tests.fastpath` (``counts_hold``,
  ``state_holds``, ``placement_holds``) answer ``True`` only where the predicates they stand for
  hold (properties over arbitrary snapshots, edge cases included), and do answer on the states
  the spec reaches; a state the shortcut wrongly passed would go unreported (shown with one
  broken on purpose);
* the spec is read again after a call only where its own code can change (``SPEC_WRITES``):
  the same snapshot as a full read (and not, with a footprint broken on purpose);
* sealed request rows (read once, :mod:`stateful_tests.sealed`) are what a full read gives, a
  target that keeps and later changes a finished request is still caught at that event, and
  with the sealing rule broken on purpose it would not be;
* divergences only the full snapshot compare sees (no return value, no invariant), and a drift of
  a target-only counter, are still found — at the very call that makes them;
* the seeded draws are the same programs as before (same chooser results, same weighted rows);
* one periodic watchdog still turns a call that never returns into a ``hang``;
* the fuzzer hands garbage collection back as it found it; ``kvspec fuzz --json`` reports
  calls per second.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.infinilm.scheduler import Scheduler as ImplScheduler
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec.cli import main
from spec import invariants as inv
from spec.infinilm.request import InferenceRequest
from spec.infinilm.snapshot import BlockManagerSnapshot, read_block_manager, read_scheduler
from stateful_tests import checker
from stateful_tests import infinilm_block_manager as bm_checker
from stateful_tests import infinilm_scheduler as sched_checker
from stateful_tests.checker import CheckerDef, Operation
from stateful_tests.fastpath import counts_hold, page_occurrences, placement_holds, state_holds
from stateful_tests.lockstep import (
    Divergence,
    Lockstep,
    RandomChooser,
    Verdicts,
    call_timeout,
    encode,
)
from stateful_tests.sealed import sealed

BM = components.get("infinilm-block-manager")
ARC = components.get("vllm-arc")
SCHED = components.get("infinilm-scheduler")


# ----------------------------------------------------------------------------- planted targets
class RelabelsACachedPrefix(ImplBlockManager):
    """Once, on a release: renames one published page's prefix hash, index included. Every
    invariant still holds and no return value changes; only the full snapshot compare (the
    ``hashes`` and ``hash_to_block_ids`` fields) sees it."""

    relabelled_on: int | None = None  # which free_blocks call of its manager relabelled

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.frees = 0

    def free_blocks(self, block_table: Sequence[int]) -> None:
        self.frees += 1
        super().free_blocks(block_table)
        hashed = [b for b in self.blocks if b.hash and len(self.hash_to_block_ids[b.hash]) == 1]
        if type(self).relabelled_on is None and hashed:
            block = hashed[0]
            del self.hash_to_block_ids[block.hash]
            block.hash = bytes(reversed(block.hash)) + b"!"
            self.hash_to_block_ids[block.hash] = {block.block_id}
            type(self).relabelled_on = self.frees


class NudgesTheArcTarget(ImplManager):
    """Once the ARC target is positive, a touch moves it by 1e-9: within bounds, and no return
    value changes (the target is only used rounded); only the full compare sees it."""

    nudged_on: int | None = None  # which touch call of its manager nudged

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.touches = 0

    def touch(self, keys: Any, req_context: object = None) -> None:
        self.touches += 1
        super().touch(keys, req_context)
        policy = self._policy
        if type(self).nudged_on is None and policy.target_t1_size > 0:
            policy.target_t1_size += 1e-9
            type(self).nudged_on = self.touches


def _calls_of(failure: Divergence, method: str) -> int:
    return sum(step.method == method for step in failure.steps)


def test_a_divergence_only_the_full_compare_sees_is_found_at_the_call_that_made_it() -> None:
    RelabelsACachedPrefix.relabelled_on = None
    result = BM.fuzz(RelabelsACachedPrefix, "relabel", 50_000, seed=0)
    assert not result.passed and result.failure is not None
    # SNAPSHOT_CHECKS names a differing ``hashes`` field prefix_index_consistent
    assert result.failure.check == "prefix_index_consistent"
    assert "hashes:" in result.failure.detail
    # the failing call is the relabelling one, not a later one
    assert result.failure.steps[-1].method == "free_blocks"
    assert _calls_of(result.failure, "free_blocks") == RelabelsACachedPrefix.relabelled_on


def test_an_arc_divergence_only_the_full_compare_sees_is_found_at_the_call_that_made_it() -> None:
    NudgesTheArcTarget.nudged_on = None
    result = ARC.fuzz(NudgesTheArcTarget, "nudge", 50_000, seed=0)
    assert not result.passed and result.failure is not None
    assert "target_t1_size" in result.failure.detail
    assert result.failure.steps[-1].method == "touch"
    assert _calls_of(result.failure, "touch") == NudgesTheArcTarget.nudged_on


def test_a_drifting_target_only_counter_is_found_at_the_call_that_drifts_it() -> None:
    """The usable counter is the target's own (in no snapshot): checked after every call."""
    mutant = {m.name: m for m in BM.planted}["counter_not_decremented_in_truncate"]
    result = BM.fuzz(mutant.cls, mutant.name, 50_000, seed=0)
    assert not result.passed and result.failure is not None
    assert result.failure.check == "referenced_count_matches_live_pages"
    assert result.failure.steps[-1].method == "truncate_blocks"


# ----------------------------------------------------------------------------- the verdict memo
class Pair(NamedTuple):
    a: int
    b: tuple[int, ...]

    def differing_fields(self, other: Pair) -> list[str]:
        return [f for f, x, y in zip(self._fields, self, other, strict=True) if x != y]


class Cell:
    """A spec and a target at once: whatever state the test sets (so the two always agree)."""

    def __init__(self) -> None:
        self.state = Pair(0, ())

    def set(self, a: int, b: list[int]) -> None:
        self.state = Pair(a, tuple(b))


checked: list[Pair] = []


def _b_sorted(p: Pair) -> str | None:
    checked.append(p)
    return None if list(p.b) == sorted(p.b) else f"b={p.b} is not sorted"


def test_the_verdict_memo_checks_a_state_that_differs_in_one_field_afresh() -> None:
    verdicts = Verdicts()
    ls = Lockstep(
        Cell(),
        Cell(),
        lambda c: c.state,
        state_invariants={"b_sorted": _b_sorted},
        validate_first=lambda m, e: False,
        verdicts=verdicts,
    )
    checked.clear()
    ls.call("set", 1, [1, 2])
    ls.call("set", 1, [1, 2])  # the same state again: a memo hit, the predicate is not run
    assert checked == [Pair(1, (1, 2))] and verdicts.passed == {Pair(1, (1, 2))}
    with pytest.raises(Divergence) as caught:
        ls.call("set", 1, [2, 1])  # same ``a``, same multiset: only the order differs
    assert caught.value.check == "b_sorted"
    assert Pair(1, (2, 1)) not in verdicts.passed  # failures are never remembered


def test_the_verdict_memo_starts_afresh_at_its_limit() -> None:
    verdicts = Verdicts(limit=2)
    for key in ("x", "y", "z"):
        verdicts.add(key)
    assert verdicts.passed == {"z"}


# ----------------------------------------------------------------------------- ledger fast path
@st.composite
def _ledgers(draw: st.DrawFn) -> tuple[BlockManagerSnapshot, int, list[list[int]]]:
    n = draw(st.integers(1, 6))
    pages = st.integers(-1, n)  # out-of-range ids too
    refs = tuple(draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n)))
    free = tuple(draw(st.lists(pages, max_size=n + 1)))
    tables = draw(st.lists(st.lists(pages, max_size=4), max_size=4))
    usable = draw(st.integers(-1, n + 1))
    snap = BlockManagerSnapshot(n, 2, free, (), refs, (b"",) * n, ())
    return snap, usable, tables


@given(_ledgers())
def test_counts_hold_only_where_both_predicates_hold(
    case: tuple[BlockManagerSnapshot, int, list[list[int]]],
) -> None:
    snap, usable, tables = case
    occurrences = page_occurrences(snap.num_blocks, tables)
    if occurrences is not None and counts_hold(snap, usable, occurrences):
        assert inv.referenced_count_matches_live_pages(snap, usable, tables) is None
        assert inv.no_live_eviction(snap, tables) is None


def test_counts_hold_confirms_a_consistent_ledger() -> None:
    """Not vacuous: the common, consistent case takes the fast path."""
    snap = BlockManagerSnapshot(4, 2, (3,), (0, 1, 2), (2, 1, 0, 0), (b"",) * 4, ())
    assert page_occurrences(4, [[0, 1], [0]]) == (2, 1, 0, 0)
    assert page_occurrences(4, [[0, 4]]) is None  # an id outside the pool: no shortcut
    assert counts_hold(snap, 2, (2, 1, 0, 0))
    assert not counts_hold(snap, 3, (2, 1, 0, 0))  # the counter is off by one
    assert not counts_hold(snap, 2, (2, 1, 0, 1))  # a free page is held


# ----------------------------------------------------------------------------- state fast path
@st.composite
def _pools(draw: st.DrawFn) -> BlockManagerSnapshot:
    """Block-manager snapshots, consistent ones often (a permutation split into free and used,
    published pages indexed) and then disturbed in one random way."""
    n = draw(st.integers(0, 6))
    order = draw(st.permutations(range(n)))
    cut = draw(st.integers(0, n))
    free, used = tuple(order[:cut]), tuple(order[cut:])
    refs = [0] * n
    hashes = [b""] * n
    for p in used:
        refs[p] = draw(st.integers(0, 2))
        hashes[p] = draw(st.sampled_from((b"", b"a", b"b")))
    index: dict[bytes, list[int]] = {}
    for p in range(n):
        if hashes[p]:
            index.setdefault(hashes[p], []).append(p)
    snap = BlockManagerSnapshot(
        n,
        2,
        free,
        used,
        tuple(refs),
        tuple(hashes),
        tuple((h, tuple(ids)) for h, ids in sorted(index.items())),
    )
    pages = st.integers(-1, n)
    field = draw(st.sampled_from((None, *snap._fields)))
    if field == "num_blocks":
        snap = snap._replace(num_blocks=draw(st.integers(0, 7)))
    elif field in ("free_block_ids", "used_block_ids"):
        snap = snap._replace(**{field: tuple(draw(st.lists(pages, max_size=n + 1)))})
    elif field == "ref_counts":
        snap = snap._replace(
            ref_counts=tuple(draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n + 1)))
        )
    elif field == "hashes":
        values = st.sampled_from((b"", b"a", b"b", b"c"))
        snap = snap._replace(hashes=tuple(draw(st.lists(values, min_size=n, max_size=n))))
    elif field == "hash_to_block_ids":
        entry = st.tuples(
            st.sampled_from((b"", b"a", b"b")), st.lists(pages, max_size=3).map(tuple)
        )
        snap = snap._replace(hash_to_block_ids=tuple(draw(st.lists(entry, max_size=3))))
    return snap


@given(_pools())
def test_state_holds_only_where_every_state_invariant_holds(snap: BlockManagerSnapshot) -> None:
    if state_holds(snap):
        for name, predicate in inv.STATE_INVARIANTS.items():
            assert predicate(snap) is None, name


def test_state_holds_confirms_every_state_a_fuzz_run_reaches() -> None:
    """Not vacuous: on the states the spec reaches (all consistent) the shortcut answers."""
    seen: list[bool] = []
    real = bm_checker.state_holds

    def recording(snap: BlockManagerSnapshot) -> bool:
        seen.append(real(snap))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bm_checker.VERDICTS, "passed", set())
        driver = bm_checker.Driver(ImplBlockManager, bm_checker.Config(num_blocks=4))
        patch.setattr(driver.ls, "state_holds", recording)
        checker._episode(
            BM.checker_def,
            driver,
            RandomChooser(random.Random(1)),
            300,
            Counter(),
            bm_checker.OPERATIONS,
        )
    assert seen and all(seen)


def test_a_broken_state_is_reported_by_its_predicate_and_a_broken_shortcut_would_hide_it() -> None:
    """The shortcut stands between a state and its predicates: with it, an inconsistent state is
    still reported (by the predicate, with its message); with a shortcut that always answers
    ``True`` (broken on purpose), it would not be."""
    bad = BlockManagerSnapshot(2, 1, (0,), (1,), (1, 1), (b"", b""), ())  # a free page referenced
    for shortcut, reported in ((state_holds, True), (lambda s: True, False)):
        ls = Lockstep(
            _Fixed(bad),
            _Fixed(bad),
            lambda c: c.state,
            state_invariants=inv.STATE_INVARIANTS,
            validate_first=lambda m, e: False,
            state_holds=shortcut,
        )
        if reported:
            with pytest.raises(Divergence) as caught:
                ls.check_state(bad)
            assert caught.value.check == "free_pages_unreferenced"
        else:
            ls.check_state(bad)


class _Fixed:
    def __init__(self, state: Any) -> None:
        self.state = state


# ----------------------------------------------------------------------------- the same programs
def test_the_fast_chooser_draws_what_randint_and_randrange_draw() -> None:
    fast, plain = RandomChooser(random.Random(7)), random.Random(7)
    items = ("a", "b", "c", "d", "e")
    for i in range(2_000):
        lo, hi = i % 5 - 2, i % 5 - 2 + i % 9
        assert fast.int(lo, hi) == plain.randint(lo, hi)
        assert fast.pick(items[: 1 + i % 5]) == items[plain.randrange(1 + i % 5)]
        assert fast.chance(0.3) == (plain.random() < 0.3)
    with pytest.raises(ValueError):
        fast.int(3, 2)
    with pytest.raises(ValueError):
        fast.pick(())


class _Recorder:
    """A driver whose every operation only records its name (one call per operation)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.ls = SimpleNamespace(op=None, bad=False)

    def __getattr__(self, name: str) -> Any:
        return lambda chooser: self.steps.append(name)


@pytest.mark.parametrize("tuple_facts", [True, False])
def test_the_episode_draws_the_rows_rng_choices_draws(tuple_facts: bool) -> None:
    """Remembered enabled rows (tuple facts) or not, the same row for the same random number."""

    def every_third_off(f: Any) -> bool:
        return (f[0] if tuple_facts else len(f.steps)) % 3 != 0

    table = (Operation("a", 5), Operation("b", 3, every_third_off), Operation("c", 1))

    def facts(d: Any) -> Any:
        return (len(d.steps),) if tuple_facts else d

    plumbing: Any = None
    definition = CheckerDef(
        "M", plumbing, plumbing, plumbing, plumbing, table, plumbing, facts=facts
    )
    d = _Recorder()
    checker._episode(definition, d, RandomChooser(random.Random(3)), 500, Counter(), table)
    rng, expected = random.Random(3), _Recorder()
    while len(expected.steps) < 500:
        now = facts(expected)
        enabled = [op for op in table if op.enabled(now)]
        expected.steps.append(rng.choices(enabled, [op.weight for op in enabled])[0].name)
    assert d.steps == expected.steps


# ----------------------------------------------------------------------------- watchdog, gc, CLI
class SlowPool(ImplBlockManager):
    def get_num_free_blocks(self) -> int:
        time.sleep(3)
        return super().get_num_free_blocks()


def test_one_periodic_watchdog_still_reports_a_call_that_does_not_return() -> None:
    from spec.infinilm.block_manager import BlockManager as SpecBlockManager
    from spec.infinilm.snapshot import read_block_manager

    ls = Lockstep(
        SpecBlockManager(2, 1),
        SlowPool(2, 1),
        read_block_manager,
        state_invariants={},
        validate_first=lambda m, e: False,
    )
    ls.call("get_total_usable_blocks")  # a guarded call that returns: no hang later
    with call_timeout(0.2), pytest.raises(Divergence) as caught:
        ls.call("get_total_usable_blocks")
        ls.call("get_num_free_blocks")
    assert caught.value.check == "hang"
    assert caught.value.steps[-1].method == "get_num_free_blocks"


def test_the_fuzzer_gives_garbage_collection_back() -> None:
    assert gc.isenabled()
    mutant = {m.name: m for m in BM.planted}["counter_not_decremented_in_truncate"]
    assert not BM.fuzz(mutant.cls, "m", 5_000, seed=0).passed  # left through a divergence
    assert gc.isenabled()
    assert BM.fuzz(ImplBlockManager, "impl", 500, seed=0).passed
    assert gc.isenabled()


def test_fuzz_json_reports_calls_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "vllm-lru", "--ops", "300", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ops"] >= 300 and document["divergences"] == 0
    assert document["calls_per_second"] > 0 and document["calls_per_cpu_second"] > 0
    assert document["cpu_seconds"] > 0


# ----------------------------------------------------------------------------- sealed requests
def test_sealed_means_nothing_but_the_owner_refers_to_the_object_or_its_lists() -> None:
    owner = {"a": InferenceRequest("a", [1, 2, 3])}
    assert sealed(owner, "a")
    for reach in (
        lambda r: r,  # the request itself
        lambda r: r.block_table,  # one of its lists
        lambda r: r.sampling_params,  # a plain object it holds
        weakref.ref,  # a weak reference
    ):
        kept = reach(owner["a"])
        assert not sealed(owner, "a")
        del kept
        assert sealed(owner, "a")  # (the counts this module expects hold on this interpreter)
    owner["a"].block_table.append([0])  # a nested list: not plainly immutable
    assert not sealed(owner, "a")


def test_sealed_values_are_judged_alike_on_the_fast_path_and_item_by_item() -> None:
    """``_all_immutable`` decides all-atom containers in one C-level pass; a container with
    anything else in it is judged item by item, so a nested tuple of atoms or an enum member
    still counts as immutable and a nested list or a tuple holding one does not."""
    from spec.infinilm.request import RequestStatus
    from stateful_tests import sealed as sealing

    cases = [
        ([], True),
        ([1, b"x", "s", None, 2.5, True], True),
        ([1, (2, 3)], True),
        ([RequestStatus.FINISHED, 1], True),
        ([1, [2]], False),
        ([(1, [2])], False),
        ([1, {2}], False),
    ]
    for values, immutable in cases:
        assert sealing._all_immutable(values) is immutable, values
        assert all(map(sealing._immutable, values)) is immutable, values
    owner = {"a": InferenceRequest("a", [1, 2, 3])}
    owner["a"].finish_reason = (1, [2])  # a tuple that holds a list: not sealed
    assert not sealed(owner, "a")
    owner["a"].finish_reason = RequestStatus.FINISHED  # an enum member: sealed
    assert sealed(owner, "a")


class KeepsFinishedRequests(ImplScheduler):
    """Keeps every finished request it completes, and once, on a later schedule(), changes one
    that finished two schedules earlier (its computed-token count). Nothing the scheduler
    returns or reads depends on it; only that request's snapshot row shows it."""

    touched_on: int | None = None  # which schedule() call of its scheduler changed it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[tuple[int, Any]] = []
        self.schedules = 0

    def complete_requests(self, requests: Any) -> None:
        requests = list(requests)
        super().complete_requests(requests)
        self.kept += [(self.schedules, r) for r in requests if r.is_finished()]

    def schedule(self) -> Any:
        self.schedules += 1
        old = [r for when, r in self.kept if when <= self.schedules - 2]
        if type(self).touched_on is None and old:
            old[0].num_computed_tokens += 1
            type(self).touched_on = self.schedules
        return super().schedule()


def _scheduler_fuzz(target: Any, ops: int) -> Any:
    return SCHED.fuzz(target, "planted", ops, seed=0)


def test_a_finished_request_changed_later_is_found_at_the_event_that_changed_it() -> None:
    """Rows of finished requests are read once sealed; a target that keeps a reference to one
    is not sealed, so a later change is found by the full compare at that very event."""
    KeepsFinishedRequests.touched_on = None
    result = _scheduler_fuzz(KeepsFinishedRequests, 20_000)
    assert not result.passed and result.failure is not None
    assert result.failure.check == "snapshot" and "requests:" in result.failure.detail
    assert result.failure.steps[-1].method == "step"
    assert _calls_of(result.failure, "step") == KeepsFinishedRequests.touched_on


def test_sealing_without_its_reference_check_would_miss_that_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The previous test bites: with a sealing rule broken on purpose (every finished request
    sealed, references or not) the change goes unseen."""
    monkeypatch.setattr(sched_checker, "sealed", lambda owner, key: True)
    KeepsFinishedRequests.touched_on = None
    result = _scheduler_fuzz(KeepsFinishedRequests, 3_000)
    assert KeepsFinishedRequests.touched_on is not None  # the change was made
    assert result.passed  # and not seen


def test_the_sealed_reader_reads_what_the_full_reader_reads() -> None:
    """Over a fuzz run (connector, aborts, finished and parked requests), every snapshot the
    sealed reader gives equals the full read, and rows do get sealed (not vacuous)."""
    reader_type = sched_checker.SealedReader
    compared = sealed_rows = 0

    class Checked(reader_type):  # type: ignore[misc, valid-type]
        def __call__(self, h: Any) -> Any:
            nonlocal compared, sealed_rows
            snap = super().__call__(h)
            assert snap == read_scheduler(h.s, h.requests)
            compared += 1
            sealed_rows += len(snap.requests) - len(self.open_ids(h))
            return snap

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sched_checker, "SealedReader", Checked)
        assert SCHED.fuzz(ImplScheduler, "impl", 2_000, seed=3, connector=True).passed
    assert compared >= 4_000 and sealed_rows > compared  # more than one sealed row per read


def test_unsealing_reads_a_named_request_again() -> None:
    """What :meth:`SealedReader.unseal` is for: the harness changes the requests an event names
    (an abort marks the status itself), so their rows must be read again."""
    h = sched_checker.EngineHarness(ImplScheduler, sched_checker.Config())
    h.add_request("r0", [1, 2, 3], 4, False, 0, False, False)
    h.requests["r0"].mark_canceled()  # finished and in no queue: sealable once dropped
    h.s.waiting_queue = type(h.s.waiting_queue)()
    reader = sched_checker.SealedReader()
    assert reader.rows(h)[0][1] == "CANCELED" and "r0" not in reader.open_ids(h)
    h.requests["r0"].num_computed_tokens = 7  # (as a harness could, for a named id)
    assert reader.rows(h)[0][5] == 0  # sealed: not read again
    reader.unseal(["r0"])
    assert reader.rows(h)[0][5] == 7


def test_the_scheduler_shortcuts_agree_with_the_predicates_on_the_states_a_run_reaches() -> None:
    """``_holders`` is ``snap.holders``; ``placement_holds`` answers exactly as
    ``request_in_exactly_one_place``, also once a placed id is repeated or a live request is
    dropped from every queue."""
    snaps: list[Any] = []

    class Recording(sched_checker.SealedReader):
        def __call__(self, h: Any) -> Any:
            snaps.append((super().__call__(h), frozenset(h.lost)))
            return snaps[-1][0]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sched_checker, "SealedReader", Recording)
        assert SCHED.fuzz(ImplScheduler, "impl", 1_000, seed=5, connector=True).passed
    for snap, lost in snaps[::5]:
        assert sched_checker._holders(snap, lost) == snap.holders(lost)
        for case in (snap, snap._replace(waiting=snap.waiting + snap.running[:1])):
            assert placement_holds(case, lost) == (
                inv.request_in_exactly_one_place(case, lost) is None
            )
        if snap.waiting:
            dropped = snap._replace(waiting=snap.waiting[1:])
            assert placement_holds(dropped, lost) == (
                inv.request_in_exactly_one_place(dropped, lost) is None
            )


# ----------------------------------------------------------------------------- the same programs
# sha256 (first 16 hex digits) of the (method, arguments) of the first 3,000 lockstep calls of
# ``fuzz(seed=7)`` against impl, as drawn before the fast paths of issue 13: each seed still
# draws the same programs. vllm-lru re-recorded at 523a5cd: its fuzzer picks among the release
# variants, and under r0.34 (no ``touch()``) the touch rules are disabled, so those episodes draw
# other calls.
PROGRAMS = {
    "infinilm-block-manager": "0677800acb1d56dd",
    "infinilm-scheduler": "b7e1ba54aac4f7df",
    "vllm-arc": "63ab0981407abc01",
    "vllm-lru": "57b364f526e01b84",
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_seed_still_draws_the_same_programs(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    comp = components.get(name)
    steps: list[Any] = []
    real = checker._episode

    def recorded(definition: Any, d: Any, *args: Any) -> None:
        try:
            real(definition, d, *args)
        finally:
            steps.extend((s.method, encode(s.args)) for s in d.steps)

    monkeypatch.setattr(checker, "_episode", recorded)
    target = {"infinilm-block-manager": ImplBlockManager, "infinilm-scheduler": ImplScheduler}
    cls = target.get(name, ImplManager)
    assert comp.fuzz(cls, "impl", 3_000, 7).passed
    digest = hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:16]
    assert digest == PROGRAMS[name]


# ----------------------------------------------------------------------------- spec footprints
def _spec_read_mismatches(writes: dict[str, tuple[str, ...]]) -> int:
    """Calls after which the footprint read of the spec (:func:`read_spec` under ``writes``)
    differs from a full read, over a 2,000-call fuzz run."""
    mismatches = 0
    real = bm_checker.read_spec

    def checked(spec: Any, method: str, before: BlockManagerSnapshot) -> BlockManagerSnapshot:
        nonlocal mismatches
        snap = real(spec, method, before)
        mismatches += snap != read_block_manager(spec)
        return snap

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bm_checker, "SPEC_WRITES", writes)
        patch.setattr(bm_checker, "read_spec", checked)
        BM.fuzz(ImplBlockManager, "impl", 2_000, seed=2)
    return mismatches


def test_the_spec_is_read_again_wherever_its_operation_can_change_it() -> None:
    """Each spec operation's footprint (``SPEC_WRITES``) covers what it changes: the footprint
    read equals the full read after every call; a footprint broken on purpose (a release that
    would change nothing) does not."""
    assert _spec_read_mismatches(bm_checker.SPEC_WRITES) == 0
    broken = {**bm_checker.SPEC_WRITES, "free_blocks": ()}
    assert _spec_read_mismatches(broken) > 0
