"""The explorer's speed-ups keep its verdicts: the transition memo, read-only batches, lazy
cloning, symmetry and ``--workers`` each give the same states and the same shortest
counterexamples as the plain search, and a bug only a batched query shows is still found."""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any, SupportsIndex

import pytest

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.infinilm.scheduler import Scheduler as ImplScheduler
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec.cli import main
from proofs.explorer import (
    BlockManagerBounds,
    BlockManagerModel,
    OffloadBounds,
    OffloadModel,
    SchedulerBounds,
    SchedulerModel,
    explore,
)
from spec.infinilm.request import TERMINAL

BM = "infinilm-block-manager"
TERMINAL_NAMES = frozenset(status.name for status in TERMINAL)
CATALOGUE = components.catalogue()
SMALL_BM = BlockManagerBounds(pages=2, block_size=2, vocab=2, tables=2, tokens=2)
SMALL_SCHED = SchedulerBounds(pages=3, requests=2, prompt_tokens=2, max_new=2)


def summary(result: Any) -> tuple[Any, ...]:
    v = result.violations[0] if result.violations else None
    return (
        result.distinct_states,
        result.distinct_snapshots,
        result.complete,
        None if v is None else (v.check, v.depth),
    )


class QueryDriftsTheCounter(ImplBlockManager):
    """A planted bug in a read-only call: the free-page query bumps the hidden counter."""

    def get_num_free_blocks(self) -> int:
        self.num_referenced += 1
        return super().get_num_free_blocks()


class QueryReordersFreePages(ImplBlockManager):
    """A planted bug in a read-only call that the snapshot shows: a query rotates the free list."""

    def can_allocate(self, num_required_blocks: int) -> bool:
        if num_required_blocks == 2:
            self.free_block_ids.rotate(1)
        return super().can_allocate(num_required_blocks)


@pytest.mark.parametrize(
    "target", [ImplBlockManager, QueryDriftsTheCounter, QueryReordersFreePages]
)
def test_memo_and_batches_keep_block_manager_verdicts_and_states(target: Any) -> None:
    model = BlockManagerModel(BM, target, "t", SMALL_BM)
    plain, fast = explore(model, memo=False), explore(model)
    assert summary(plain) == summary(fast)
    if target is ImplBlockManager:
        assert fast.executed_calls < plain.executed_calls == plain.edges
    else:
        assert not fast.passed and fast.violations[0].depth == 1
        assert fast.violations[0].replay == "reproduced"


def test_the_memo_judges_fewer_calls_than_edges() -> None:
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM))
    assert result.passed and result.complete
    assert result.executed_calls < result.edges  # remembered transitions were reused


@pytest.mark.parametrize("name", ["lifo_free_list", "release_returns_pages_to_free_list"])
def test_memo_keeps_a_mutants_shortest_counterexample(name: str) -> None:
    bounds = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=2, tokens=3)
    model = BlockManagerModel(BM, CATALOGUE[name].cls, name, bounds)
    assert summary(explore(model, memo=False))[3] == summary(explore(model))[3] is not None


def test_workers_give_the_serial_states_and_verdicts() -> None:
    model = BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM)
    serial, parallel = explore(model), explore(model, workers=2)
    assert summary(serial) == summary(parallel) and parallel.workers == 2
    assert parallel.edges == serial.edges
    # states crossed as exact copies, none as paths to replay
    assert parallel.transferred_states > 0 and parallel.replayed_paths == 0


class HoldsALocalFunction(ImplBlockManager):
    """A target pickle cannot write (a closure): its states cross workers as paths."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.hook = lambda: None


def test_workers_replay_paths_where_exact_copies_fail_their_self_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from proofs.explorer import parallel

    monkeypatch.setattr(parallel, "exact_ready", lambda: False)
    model = BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM)
    serial, parallel_result = explore(model), explore(model, workers=2)
    assert summary(serial) == summary(parallel_result)
    assert parallel_result.replayed_paths > 0 and parallel_result.transferred_states == 0


def test_workers_replay_paths_where_states_cannot_be_packed() -> None:
    model = BlockManagerModel(BM, HoldsALocalFunction, "t", SMALL_BM)
    serial, parallel = explore(model), explore(model, workers=2)
    assert summary(serial) == summary(parallel) and serial.passed
    assert parallel.replayed_paths > 0 and parallel.transferred_states == 0


def test_scheduler_with_a_connector_is_the_same_with_workers() -> None:
    """Request ids reach the connector's id sets, whose tables hold the ids' addresses: a
    transferred state must keep its interned ids (else its successors would get other keys and
    the parallel search would count states the serial one merges)."""
    bounds = SchedulerBounds(connector=True, requests=1, pages=2, prompt_tokens=2)
    model = SchedulerModel("infinilm-scheduler", ImplScheduler, "impl", bounds)
    serial, parallel = explore(model), explore(model, workers=2)
    # (not distinct_snapshots: a state whose forgotten rows are cut counts the snapshot it was
    # first reached with, and which one comes first depends on the order of the search)
    assert serial.passed and parallel.passed and parallel.complete
    assert parallel.distinct_states == serial.distinct_states
    assert parallel.transferred_states > 0 and parallel.replayed_paths == 0


@pytest.mark.parametrize(
    ("component", "argv"),
    [
        ("vllm-arc", ["--variant", "no_fallback", "--keys", "3", "--capacity", "2"]),
        ("vllm-prefix-cache", ["--variant", "classic", "--blocks", "2"]),
        ("sglang-radix-cache", ["--variant", "lru", "--pages", "2"]),
    ],
)
def test_every_model_sends_exact_copies_between_workers(
    component: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    docs = []
    for workers in ("1", "2"):
        assert main(["explore", component, *argv, "--workers", workers, "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    serial, parallel = docs
    for key in ("distinct_states", "distinct_snapshots", "edges", "complete"):
        assert serial[key] == parallel[key], key
    assert parallel["transferred_states"] > 0
    # the radix cache's sets hold tree nodes, hashed by identity: a copy's nodes hash elsewhere,
    # so those states are replayed from their paths (set_clone.NotPortable); the rest never are
    assert (parallel["replayed_paths"] > 0) is (component == "sglang-radix-cache")


@pytest.mark.parametrize("name", ["lifo_free_list", "publish_deduplicates"])
def test_workers_find_the_shortest_counterexample(name: str) -> None:
    bounds = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=2, tokens=3)
    model = BlockManagerModel(BM, CATALOGUE[name].cls, name, bounds)
    serial, parallel = explore(model), explore(model, workers=2)
    assert not parallel.passed and parallel.violations[0].replay == "reproduced"
    assert parallel.violations[0].depth == serial.violations[0].depth
    assert parallel.violations[0].check == serial.violations[0].check


def test_workers_stop_at_max_states_and_say_so() -> None:
    model = BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM)
    result = explore(model, workers=2, max_states=40)
    assert not result.complete and result.stopped_by == "max_states"
    assert "--max-states" in result.message


def test_scheduler_search_is_the_same_with_batches_and_workers() -> None:
    model = SchedulerModel("infinilm-scheduler", ImplScheduler, "impl", SMALL_SCHED)
    plain = explore(model, memo=False)
    assert plain.passed and plain.complete
    parallel = explore(model, workers=2)
    assert summary(explore(model)) == summary(plain) == summary(parallel)
    assert parallel.transferred_states > 0 and parallel.replayed_paths == 0


@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
def test_offload_symmetry_is_a_quotient_with_the_same_verdict(component: str) -> None:
    """Keys are opaque: the reduced search reaches at most the unreduced one's states and finds
    the same planted counter drift at the same depth."""
    from tests.test_explorer import CounterDriftOnLoadCompletion

    comp = components.get(component)
    variant = comp.variants[-1]
    for target, passes in ((ImplManager, True), (CounterDriftOnLoadCompletion, False)):
        found = []
        for symmetry in (True, False):
            bounds = OffloadBounds(variant=variant, capacity=2, keys=3, symmetry=symmetry)
            model = OffloadModel(component, target, "t", bounds, comp.fixed_options)
            found.append(explore(model))
        reduced, full = found
        assert reduced.passed is full.passed is passes
        if passes:
            assert reduced.complete and full.complete
            assert reduced.distinct_states < full.distinct_states
        else:
            assert summary(reduced)[3] == summary(full)[3]


class _FifoList(list[int]):
    """A free list that hands out its bottom id first (copies keep the type)."""

    def pop(self, index: SupportsIndex = 0) -> int:
        return super().pop(index)

    def copy(self) -> _FifoList:
        return _FifoList(self)


class FifoFreeIdReuse(ImplManager):
    """A planted free-list ORDER bug: freed ids are reused first in, first out (upstream pops the
    last freed one). It depends on the order of the ids, never on their values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._free_list = _FifoList()


class _Recording(OffloadModel):
    """An offload model that keeps every state key it computes (one per reached snapshot)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: set[Any] = set()  # keys; with no reduction, the snapshots

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        found = super().key(snap, gen, spec, target)
        self.seen.add(found)
        return found


# (component, variant, capacity, keys): every variant family at 2 blocks, LRU at 3 too
BLOCK_SYMMETRY_SCOPES = [
    ("vllm-arc", "no_fallback", 2, 3),
    ("vllm-arc", "t1_fallback", 2, 3),
    ("vllm-arc", "r0.31", 2, 3),
    ("vllm-lru", "v2", 3, 3),
    ("vllm-lru", "v1", 3, 3),
    ("vllm-lru", "r0.33", 2, 3),
]


def _offload_search(component: str, target: Any, bounds: OffloadBounds) -> tuple[Any, set[Any]]:
    model = _Recording(component, target, "t", bounds, components.get(component).fixed_options)
    return explore(model), model.seen


@pytest.mark.parametrize(("component", "variant", "capacity", "keys"), BLOCK_SYMMETRY_SCOPES)
def test_offload_block_symmetry_is_exactly_the_quotient(
    component: str, variant: str, capacity: int, keys: int
) -> None:
    """Block ids are opaque labels too: with keys and issued ids renamed, the search reaches
    exactly the classes of the states the unreduced search reaches (no class lost, none made
    up), strictly fewer states, the same verdict; so does renaming ids alone."""
    from proofs.explorer.model_offload import _relabel, _relabel_blocks

    def bounds(symmetry: bool, block_symmetry: bool) -> OffloadBounds:
        return OffloadBounds(
            variant=variant,
            capacity=capacity,
            keys=keys,
            symmetry=symmetry,
            block_symmetry=block_symmetry,
        )

    full, snaps = _offload_search(component, ImplManager, bounds(False, False))
    keyed, by_keys = _offload_search(component, ImplManager, bounds(True, False))
    both, by_both = _offload_search(component, ImplManager, bounds(True, True))
    ids, by_ids = _offload_search(component, ImplManager, bounds(False, True))
    for result in (full, keyed, both, ids):
        assert result.passed and result.complete
    assert by_keys == {_relabel(s) for s in snaps}
    assert by_both == {_relabel_blocks(s) for s in snaps}
    assert by_ids == {_relabel_blocks(s, rename_keys=False) for s in snaps}
    assert both.distinct_states == len(by_both) < keyed.distinct_states < full.distinct_states
    assert ids.distinct_states == len(by_ids) < full.distinct_states


def _renamed(snap: Any, keys: dict[Any, Any], ids: dict[int, int]) -> Any:
    """``snap`` under a renaming of keys and ids (the blocks rebuilt in id order)."""
    p = snap.policy
    blocks = tuple(sorted((ids.get(b, b), keys[k], r) for b, k, r in p.blocks))
    fields = {
        name: tuple(keys[k] for k in getattr(p, name))
        for name in ("t1", "t2", "b1", "b2", "order")
        if hasattr(p, name)
    }
    return snap._replace(
        free_list=tuple(ids.get(b, b) for b in snap.free_list),
        policy=p._replace(blocks=blocks, **fields),
    )


@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
def test_offload_block_canonical_form_is_exactly_the_orbit(component: str) -> None:
    """On every reached state, the canonical form is as fine as the orbits under every renaming
    of keys and issued ids (brute force: the least renamed state) and no finer; ids not handed
    out yet are never renamed (a state holding one stays apart)."""
    from itertools import permutations

    from proofs.explorer.model_offload import _relabel_blocks

    variant, capacity, keys = {"vllm-arc": ("no_fallback", 2, 3), "vllm-lru": ("v2", 3, 4)}[
        component
    ]
    bounds = OffloadBounds(
        variant=variant, capacity=capacity, keys=keys, symmetry=False, block_symmetry=False
    )
    _, snaps = _offload_search(component, ImplManager, bounds)
    key_names = [dict(enumerate(p)) for p in permutations(range(keys))]
    pairs = set()
    moved_fresh = 0
    for snap in snaps:
        issued = range(snap.num_allocated_blocks)
        orbit = [
            _renamed(snap, names, dict(zip(issued, p, strict=True)))
            for names in key_names
            for p in permutations(issued)
        ]
        pairs.add((_relabel_blocks(snap), min(orbit, key=repr)))
        fresh = snap.num_blocks - 1
        if snap.num_allocated_blocks <= fresh and snap.policy.blocks:
            moved_fresh += 1
            b = snap.policy.blocks[0][0]
            swapped = _renamed(snap, key_names[0], {b: fresh})
            assert _relabel_blocks(swapped) != _relabel_blocks(snap)
    canonical, orbits = ({pair[i] for pair in pairs} for i in (0, 1))
    assert len(pairs) == len(canonical) == len(orbits) < len(snaps)
    assert moved_fresh


@pytest.mark.parametrize(("component", "variant", "capacity", "keys"), BLOCK_SYMMETRY_SCOPES)
@pytest.mark.parametrize("bug", ["CounterDriftOnLoadCompletion", "FifoFreeIdReuse"])
def test_offload_block_symmetry_keeps_shortest_counterexamples(
    component: str, variant: str, capacity: int, keys: int, bug: str
) -> None:
    """A planted counter drift and a planted free-list order bug (FIFO reuse) are found with
    block-id symmetry on as off: the same check after the same number of calls."""
    from tests.test_explorer import CounterDriftOnLoadCompletion

    target, expected = {
        "CounterDriftOnLoadCompletion": (
            CounterDriftOnLoadCompletion,
            ("evictable_counter_matches_scan", 4),
        ),
        # store two keys, fail both stores (ids pushed 0, 1), store one: LIFO reuses 1
        "FifoFreeIdReuse": (FifoFreeIdReuse, ("return_value", 4)),
    }[bug]
    found = []
    for block_symmetry in (True, False):
        bounds = OffloadBounds(
            variant=variant, capacity=capacity, keys=keys, block_symmetry=block_symmetry
        )
        result, _ = _offload_search(component, target, bounds)
        assert not result.passed
        found.append(summary(result)[3])
        assert result.violations[0].replay == "reproduced"
    assert found == [expected, expected]


def test_offload_block_symmetry_has_a_cli_switch(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["vllm-lru", "--variant", "v1", "--capacity", "2", "--keys", "3"]
    on = _explore_json(args, capsys)
    off = _explore_json([*args, "--no-block-symmetry"], capsys)
    assert [run["reductions"]["block_symmetry"] for run in (*on["runs"], *off["runs"])] == [
        True,
        False,
    ]
    assert on["distinct_states"] < off["distinct_states"]


def test_cli_reports_speed_memory_and_workers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explore", BM, "--pages", "2", "--tables", "1", "--tokens", "2", "--json"]
    assert main([*argv, "--workers", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["complete"] and doc["workers"] == 2
    assert doc["edges_per_second"] > 0 and doc["peak_memory_mb"] > 0
    assert main([*argv, "--no-memo"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["distinct_states"] == doc["distinct_states"]
    assert plain["executed_calls"] == plain["edges"]


def test_scheduler_harness_clone_is_the_generic_clone() -> None:
    """The unrolled harness clone copies what the generic one does, aliases and set tables kept."""
    from proofs.explorer.set_clone import clone, deep_key

    model = SchedulerModel(
        "infinilm-scheduler", ImplScheduler, "impl", SchedulerBounds(connector=True)
    )
    for h in model.initial()[:2]:
        h.add_request("r0", [0, 0, 0], 2, False, 0, False, False)
        h.add_request("r1", [0], 2, False, 1, True, True)
        h.step([])
        h.step([])
        generic, fast = clone(h), model.clone(h)
        for name in vars(h):
            if name not in ("config", "types"):  # frozen: shared by the fast clone
                assert deep_key(getattr(generic, name)) == deep_key(getattr(fast, name)), name
        s = fast.s
        assert s.speculative_cache_ops.block_manager is s.cache_manager
        assert s.connector is fast.connector and s.cache_manager is not h.s.cache_manager
        assert all(fast.requests[r.request_id] is r for r in s.running_queue._items)
        fast.step([])  # the copy moves on alone
        assert deep_key(h.s) == deep_key(clone(h).s) != deep_key(fast.s)


class WithOwnAttribute(ImplBlockManager):
    """A target kvspec cannot read whole (an attribute of its own): no memo, no lazy cloning."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.calls = 0


def test_a_target_kvspec_cannot_read_whole_is_explored_without_the_memo() -> None:
    model = BlockManagerModel(BM, WithOwnAttribute, "own", SMALL_BM)
    result = explore(model)
    assert result.reductions["memo"] is False and result.passed and result.complete
    assert summary(result) == summary(explore(model, memo=False))
    assert result.executed_calls >= result.edges  # every edge was run


# ---------------------------------------------------------------------- set-table classes
def test_set_tables_of_one_class_iterate_alike_under_every_operation() -> None:
    """The classes are a bisimulation, checked on CPython's own sets: two tables of one class,
    put through the same random operations, iterate in the same order after every step."""
    import random

    from proofs.explorer.set_classes import layout_classes, tables
    from proofs.explorer.set_clone import clone_set

    classes, sets = layout_classes(3), tables(3)
    assert len(set(classes.values())) < len(classes)  # the classes do merge tables (34 of 51)
    members: dict[int, list[set[int]]] = {}
    for key, s in sets.items():
        members.setdefault(classes[key], []).append(s)
    rng = random.Random(5)
    merged = [group for group in members.values() if len(group) > 1]
    assert merged
    for group in merged:
        for other in group[1:]:
            for _ in range(40):
                a, b = clone_set(group[0]), clone_set(other)
                for _ in range(12):
                    op, k = rng.choice(("add", "discard", "pop", "copy", "clear")), rng.randrange(3)
                    if op in ("add", "discard"):
                        getattr(a, op)(k), getattr(b, op)(k)
                    elif op == "pop" and a:
                        assert a.pop() == b.pop()
                    elif op == "copy":
                        a, b = a.copy(), b.copy()
                    elif op == "clear":
                        a.clear(), b.clear()
                    assert list(a) == list(b)


MID_BM = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=1, tokens=2)


@pytest.mark.parametrize("target", [ImplBlockManager, QueryDriftsTheCounter])
def test_set_table_classes_are_a_quotient_with_the_same_verdict(target: Any) -> None:
    """Fewer states (kvspec's own classes), the same snapshots, the same verdict; a mutant's
    tables stay raw (only the spec's are classed) and its counterexample is the same."""
    from dataclasses import replace

    results = [
        explore(BlockManagerModel(BM, target, "t", replace(MID_BM, layout_classes=on)))
        for on in (True, False)
    ]
    reduced, full = results
    assert reduced.reductions["layout_classes"] and not full.reductions["layout_classes"]
    assert summary(reduced)[1:] == summary(full)[1:]  # snapshots, completeness, counterexample
    if target is ImplBlockManager:
        assert reduced.passed and reduced.distinct_states < full.distinct_states


def test_set_table_classes_keep_an_eviction_order_bugs_shortest_counterexample() -> None:
    from dataclasses import replace

    bounds = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=2, tokens=3)
    cls = CATALOGUE["reclaim_in_id_order"].cls
    found = [
        summary(explore(BlockManagerModel(BM, cls, "m", replace(bounds, layout_classes=on))))[3]
        for on in (True, False)
    ]
    assert found[0] == found[1] == ("identical_eviction_order", 7)


def test_set_tables_of_other_classes_stay_raw() -> None:
    model = BlockManagerModel(BM, QueryDriftsTheCounter, "t", MID_BM)
    spec, target, _ = model.initial()
    for obj in (spec, target):
        obj.allocate_slots(2, 0)
    assert type(model._whole(spec)[1]) is int  # a class number
    assert type(model._whole(target)[1]) is tuple  # the raw table (a subclass may add any id)


def test_spec_answers_read_only_calls_from_its_snapshot_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What lets the explorer ask the spec once per snapshot: on every pair reached (set tables
    raw, so one snapshot has many), each remembered answer is the spec's own answer."""
    from dataclasses import replace

    from proofs.explorer import engine
    from stateful_tests.lockstep import compare_outcomes

    checked = []
    batch = engine.Expander._batch

    def checking(self: Any, pid: int, gen: Any, edges: Any, memo: Any, target: Any) -> Any:
        spec_p, _, snap = self.objects[pid]
        answers = self.spec_answers.get(hash(snap), {})
        for _, edge, ident in edges:
            if ident in answers:
                own = engine._call(self.dup(spec_p), edge)
                assert compare_outcomes(answers[ident], own) is None, edge.method
                checked.append(ident)
        return batch(self, pid, gen, edges, memo, target)

    monkeypatch.setattr(engine.Expander, "_batch", checking)
    bounds = replace(MID_BM, layout_classes=False)
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", bounds))
    assert result.passed and result.complete and len(checked) > 1000


# --------------------------------------------------------------- finished requests forgotten
SCHEDULER_MUTANTS = [
    "running_reservation_reused_across_steps",
    "counter_not_decremented_on_dequeue",
    "tight_counter_uses_exact_formula",
    "candidate_pinned_pages_counted_as_usable",
    "decode_mixed_into_prefill_step",
]  # the scheduler mutants a 2-request scope finds


def _finished_rows_cut(snap: Any, gen: Any) -> Any:
    """A scheduler snapshot with every finished request's row cut down to its id (what the
    reduced search keys a forgotten request by; without a connector nothing else names them)."""
    return snap._replace(
        requests=tuple((r[0],) if r[1] in TERMINAL_NAMES else r for r in snap.requests)
    )


@pytest.mark.parametrize("requests", [2, 3])
def test_forgetting_finished_requests_is_a_quotient_with_the_same_states_seen(
    requests: int,
) -> None:
    """Keyed without finished requests' prompts, outputs and final rows, the scheduler search
    reaches fewer states but every snapshot the full search reaches up to those rows (the full
    search's snapshots, each with its finished rows cut to their ids, are the reduced search's
    snapshots so cut), and passes alike."""
    found = []
    for forget in (True, False):
        bounds = SchedulerBounds(
            pages=3, requests=requests, prompt_tokens=2, max_new=2, forget_finished=forget
        )
        model = SchedulerModel("infinilm-scheduler", ImplScheduler, "impl", bounds)
        model.observable = _finished_rows_cut  # type: ignore[method-assign]
        found.append(explore(model))
    reduced, full = found
    assert reduced.passed and full.passed and reduced.complete and full.complete
    assert reduced.distinct_snapshots == full.distinct_snapshots
    assert reduced.distinct_states < full.distinct_states
    assert reduced.reductions["forget_finished"] and not full.reductions["forget_finished"]


def test_a_finished_row_is_cut_only_when_both_sides_forgot_it_and_nothing_names_it() -> None:
    from proofs.explorer.model_scheduler import _frozen_rows_collapsed
    from spec.infinilm.snapshot import SchedulerSnapshot

    rows = (
        ("r0", "FINISHED", (), (), 0, 3, 0, 0, -1, 1),
        ("r1", "RUNNING", (1,), (2,), 1, 2, 0, 0, -1, 0),
    )
    snap = SchedulerSnapshot(
        waiting=(),
        running=("r1",),
        remote=(),
        finished_receiving=(),
        failed_receiving=(),
        pending_free_blocks=(),
        pending_kv_decode_blocks=0,
        cache_stats=(),
        requests=rows,
        mamba=(),
        block_manager=None,
    )
    assert _frozen_rows_collapsed(snap, set()) is snap
    assert _frozen_rows_collapsed(snap, {"r0"}).requests == (("r0",), rows[1])
    parked = snap._replace(pending_free_blocks=(("r0", (2,)),))
    assert _frozen_rows_collapsed(parked, {"r0"}) is parked  # named elsewhere: kept whole
    assert _frozen_rows_collapsed(snap._replace(failed_receiving=("r0",)), {"r0"}).requests == rows


@pytest.mark.parametrize("name", SCHEDULER_MUTANTS)
def test_forgetting_finished_requests_keeps_shortest_counterexamples(name: str) -> None:
    m = CATALOGUE[name]
    found = []
    for forget in (True, False):
        bounds = SchedulerBounds(
            variant=m.variant or "legacy", pages=4, requests=2, max_new=3, forget_finished=forget
        )
        found.append(explore(SchedulerModel(m.component, m.cls, name, bounds)))
    reduced, full = found
    assert not full.passed
    assert summary(reduced)[3] == summary(full)[3]


def test_only_unreachable_finished_requests_are_forgotten() -> None:
    """A finished request that anything but the harness's dict still refers to, or a lost one,
    keeps its whole row in the key."""
    from proofs.explorer.model_scheduler import _forgotten
    from stateful_tests import infinilm_scheduler as sched

    config = sched.Config(
        num_blocks=4, block_size=2, max_batch_size=2, max_num_batched_tokens=8, mamba=False
    )
    h = sched.EngineHarness(ImplScheduler, config)
    for rid in ("r0", "r1", "r2"):
        h.add_request(rid, [0, 0, 0], 1, False, 0, False, False)
    assert _forgotten(h) == set()  # queued: live and reachable
    h.step([])  # prefill of r0 and r1; max_tokens 1: both finish
    finished = {rid for rid, r in h.requests.items() if r.is_finished()}
    assert finished and _forgotten(h) == finished
    held = h.requests[sorted(finished)[0]]  # a second reference: reachable, so remembered
    assert sorted(finished)[0] not in _forgotten(h)
    del held
    h.lost.add(sorted(finished)[-1])
    assert sorted(finished)[-1] not in _forgotten(h)


# --------------------------------------------------------------- copies kept after self-loops
@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
def test_copies_kept_after_self_loops_give_the_same_search(
    component: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offload copies serve the next call after a self-loop that left the hidden state alone: the
    same states and verdicts as fresh copies for every call (a planted counter drift too)."""
    from tests.test_explorer import CounterDriftOnLoadCompletion

    comp = components.get(component)
    variant = comp.variants[-1]
    for target in (ImplManager, CounterDriftOnLoadCompletion):
        bounds = OffloadBounds(variant=variant, capacity=2, keys=3)
        model = OffloadModel(component, target, "t", bounds, comp.fixed_options)
        kept = summary(explore(model))
        with monkeypatch.context() as m:
            m.setattr(model, "hidden", lambda obj: None)
            assert summary(explore(model)) == kept


def test_offload_hidden_state_is_what_the_snapshot_leaves_out() -> None:
    """``_hidden`` changes with the counters the snapshot does not show, and is unknown (no
    copies kept) for a manager with an attribute kvspec does not know."""
    from proofs.explorer.model_offload import _clone_offload, _hidden
    from stateful_tests.vllm_offload import Config, ManagerHarness

    config = Config(policy="arc", variant="no_fallback", num_blocks=2, num_keys=3)
    h = ManagerHarness(ImplManager, config)
    copy = _clone_offload(h)
    assert _hidden(copy) == _hidden(h) is not None
    copy.m.stores_skipped_in_current_batch += 1
    assert _hidden(copy) != _hidden(h)
    copy = _clone_offload(h)
    copy.m._num_evictable_cache_blocks += 1
    assert _hidden(copy) != _hidden(h)
    copy.m.extra = 1
    assert _hidden(copy) is None


def _explore_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main(["explore", *args, "--json"])
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_a_pair_in_the_next_frontier_keeps_its_objects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last call of a state runs on the pair's own objects only when no state of the next
    frontier shares the pair (the prefix-cache model's pairs carry several generator models):
    the same shortest counterexample as with copies for every call."""
    args = [
        "vllm-prefix-cache",
        "--target",
        "mutant:same_block_twice_in_free_queue",
        "--scope",
        "base",
    ]
    consumed = _explore_json(args, capsys)
    from proofs.explorer import engine

    expand = engine.Expander.expand
    monkeypatch.setattr(
        engine.Expander, "expand", lambda self, pid, gid, last=False: expand(self, pid, gid)
    )
    copied = _explore_json(args, capsys)
    found = [(v["check"], v["depth"]) for v in consumed["violations"]]
    assert found == [(v["check"], v["depth"]) for v in copied["violations"]]
    assert found == [("identical_eviction_order", 9)]
    assert consumed["distinct_states"] == copied["distinct_states"]
