"""The fuzzer's fast paths check as much as the plain checks did.

What the shortcuts could get wrong, each pinned by a test that fails if it did:

* the verdict memo (:class:`~stateful_tests.lockstep.Verdicts`) remembers only states that passed,
  keyed by the whole state, so a state differing in one field is checked afresh;
* :func:`~stateful_tests.fastpath.ledger_holds` answers ``True`` only where the predicates it
  stands for hold (a property over arbitrary snapshots and ledgers, edge cases included);
* divergences only the full snapshot compare sees (no return value, no invariant), and a drift of
  a target-only counter, are still found — at the very call that makes them;
* the seeded draws are the same programs as before (same chooser results, same weighted rows);
* one periodic watchdog still turns a call that never returns into a ``hang``;
* the fuzzer hands garbage collection back as it found it; ``kvspec fuzz --json`` reports
  calls per second.
"""

from __future__ import annotations

import gc
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec.cli import main
from spec import invariants as inv
from spec.infinilm.snapshot import BlockManagerSnapshot
from stateful_tests import checker
from stateful_tests.checker import CheckerDef, Operation
from stateful_tests.fastpath import ledger_holds
from stateful_tests.lockstep import (
    Divergence,
    Lockstep,
    RandomChooser,
    Verdicts,
    call_timeout,
)

BM = components.get("infinilm-block-manager")
ARC = components.get("vllm-arc")


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
def test_ledger_holds_only_where_both_predicates_hold(
    case: tuple[BlockManagerSnapshot, int, list[list[int]]],
) -> None:
    snap, usable, tables = case
    if ledger_holds(snap, usable, tables):
        assert inv.referenced_count_matches_live_pages(snap, usable, tables) is None
        assert inv.no_live_eviction(snap, tables) is None


def test_ledger_holds_confirms_a_consistent_ledger() -> None:
    """Not vacuous: the common, consistent case takes the fast path."""
    snap = BlockManagerSnapshot(4, 2, (3,), (0, 1, 2), (2, 1, 0, 0), (b"",) * 4, ())
    assert ledger_holds(snap, 2, [[0, 1], [0]])
    assert not ledger_holds(snap, 3, [[0, 1], [0]])  # the counter is off by one
    assert not ledger_holds(snap, 2, [[0, 1], [0, 3]])  # a free page is held


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
