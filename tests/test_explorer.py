"""The exhaustive small-scope explorer (proofs/explorer/) and ``kvspec explore``.

Small scopes only (CI-sized, seconds): impl explored completely for every component; every
block-manager mutant found with a short, replayable counterexample; a saved trace re-run by
``kvspec replay`` fails the same way; the bounds that stop a search report ``complete: false``.
"""

from __future__ import annotations

import json
import pickle
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.infinilm.scheduler import Scheduler as ImplScheduler
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components, kill_matrix
from kvspec import exploration as cli_explore
from kvspec.cli import main
from proofs.explorer import (
    BlockManagerBounds,
    BlockManagerModel,
    Model,
    NotPortable,
    OffloadBounds,
    OffloadModel,
    SchedulerBounds,
    SchedulerModel,
    clone,
    clone_set,
    exact_dumps,
    exact_loads,
    explore,
    rebuild_set,
    set_layout,
    set_state,
)

BM = "infinilm-block-manager"
CATALOGUE = components.catalogue()
BM_MUTANTS = sorted(n for n, m in CATALOGUE.items() if m.component == BM)
SMALL_BM = BlockManagerBounds(pages=2, block_size=2, vocab=2, tables=1, tokens=2)
MUTANT_BM = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=2, tokens=3)
JSON_KEYS = {
    "component",
    "target",
    "bounds",
    "distinct_states",
    "edges",
    "max_depth",
    "seconds",
    "states_per_second",
    "complete",
    "violations",
}


# ----------------------------------------------------------------------------- exact clones
def test_clone_set_keeps_the_table_so_later_iteration_order_is_the_same() -> None:
    """Why the explorer copies set tables: a rebuilt set can iterate differently from the original
    (deleted entries leave dummies), and eviction order is the used set's iteration order."""
    s = {0, 1, 2}
    s.discard(0)
    s.discard(1)
    s.update((0, 1))
    assert list(s) != list(set(s))  # a plain copy already iterates differently
    rng = random.Random(3)
    for _ in range(200):
        a: set[int] = set()
        for _ in range(rng.randint(0, 30)):
            (a.add if rng.random() < 0.6 else a.discard)(rng.randrange(10))
        b = clone_set(a)
        assert set_layout(a) == set_layout(b)
        for _ in range(30):
            x, add = rng.randrange(10), rng.random() < 0.6
            for y in (a, b):
                (y.add if add else y.discard)(x)
            assert list(a) == list(b)


def test_a_set_rebuilt_from_its_table_description_is_laid_out_and_iterates_alike() -> None:
    """What ``--workers`` sends between forked processes: a set as its table (fill, size, finger,
    each element's slot, each dummy's slot), rebuilt exactly — tables of every size, large ints."""
    rng = random.Random(5)
    for _ in range(300):
        universe = rng.choice((4, 8, 13, 40, 1000))
        a: set[int] = set()
        for _ in range(rng.randint(0, 60)):
            (a.add if rng.random() < 0.6 else a.discard)(rng.randrange(universe))
        if a and rng.random() < 0.3:
            a.pop()  # moves the finger
        state = set_state(a)
        b = rebuild_set(pickle.loads(pickle.dumps(state)))
        assert list(a) == list(b) and set_state(b) == state
        if universe <= 256:  # small ints are shared objects: the raw tables are equal too
            assert set_layout(a) == set_layout(b)
        for _ in range(40):
            x, op = rng.randrange(universe), rng.random()
            for y in (a, b):
                if op < 0.5:
                    y.add(x)
                elif op < 0.9:
                    y.discard(x)
                elif y:
                    y.pop()
            assert list(a) == list(b)


class ByIdentity:
    """A set element hashed by its address (a pickled copy hashes elsewhere)."""


def test_exact_copies_pass_their_self_test_here() -> None:
    from proofs.explorer.set_clone import exact_ready

    assert exact_ready()  # (else --workers would fall back to replaying paths)


def test_exact_pickle_keeps_set_tables_and_aliasing() -> None:
    s = {0, 1, 2}
    s.discard(0)
    s.discard(1)
    s.update((0, 1))
    graph = {"a": s, "b": s, "t": [s, {b"x": {5}}]}
    copy = exact_loads(exact_dumps(graph))
    assert list(copy["a"]) == list(s) != sorted(s)  # pickle alone would give sorted order here
    assert list(pickle.loads(pickle.dumps(s))) == sorted(s)
    assert copy["a"] is copy["b"] is copy["t"][0] and copy["a"] is not s
    assert copy["t"][1] == {b"x": {5}}
    rid, built = sys.intern("r7"), "".join(["r", "7"])
    with pytest.raises(NotPortable, match="hashes differently"):  # hashed by identity
        exact_loads(exact_dumps({ByIdentity(), ByIdentity()}))
    ids = exact_loads(exact_dumps([rid, built, {rid}]))
    assert ids[0] is rid and next(iter(ids[2])) is rid  # interned strings stay the one object
    assert ids[1] == built


def test_block_manager_states_cross_workers_as_exact_copies() -> None:
    """The block-manager model's own packing (kvspec's classes as plain values) gives objects
    the generic clone cannot tell from the originals, mutants' classes kept."""
    from proofs.explorer.set_clone import deep_key

    for cls in (ImplBlockManager, CATALOGUE["lifo_free_list"].cls):
        model = BlockManagerModel(BM, cls, "t", BlockManagerBounds())
        spec, target, gen = model.initial()
        for side in (spec, target):
            side.allocate_slots(4, 0)
            table, _ = side.allocate_slots(2, 0)
            side.publish_computed_blocks(table, [b"\x07" * 16], 0, 2)
            side.free_blocks(table)
            side.used_block_ids.discard(table[0])
            side.used_block_ids.add(table[0])
        gen = ((0, (0, 1), 4, ()),)
        data = model.pack(spec, target, gen)
        assert data[:1] == b"F"  # the fast path, not the generic pickle
        spec2, target2, gen2 = model.unpack(data)
        assert gen2 == gen and type(spec2) is type(spec) and type(target2) is cls
        assert deep_key(spec2) == deep_key(spec) and deep_key(target2) == deep_key(target)
        generic = Model.unpack(model, Model.pack(model, spec, target, gen))  # exact_dumps
        assert deep_key(generic[1]) == deep_key(target)


def test_generic_clone_keeps_aliasing_and_is_independent() -> None:
    shared: list[int] = [1]
    graph = {"a": shared, "b": shared, "s": {3, 4}}
    copy = clone(graph)
    assert copy == graph and copy["a"] is copy["b"] and copy["a"] is not shared
    copy["a"].append(2)
    assert shared == [1]


class HoldsALock(ImplBlockManager):
    """A target with a lock (as upstream's scheduler has, in its janus queues)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        import threading

        self.lock = threading.Lock()


def test_a_target_the_explorer_cannot_copy_is_a_clear_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A lock cannot be made by ``object.__new__``: one line naming the type, exit 2, no
    traceback (the real InfiniLM scheduler gave a ``TypeError`` traceback before)."""
    import threading

    from proofs.explorer import ExplorerUnsupported

    with pytest.raises(ExplorerUnsupported, match=r"cannot copy a _thread\.lock"):
        clone({"lock": threading.Lock()})
    target = f"{__name__}:HoldsALock"
    assert main(["explore", BM, "--target", target, "--pages", "2", "--tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "cannot copy a _thread.lock" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- impl holds
def test_block_manager_impl_is_explored_completely() -> None:
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM))
    assert result.passed and result.complete and result.stopped_by is None
    assert result.distinct_states > 500 and result.edges > 10 * result.distinct_states
    assert result.to_json().keys() >= JSON_KEYS


def test_scheduler_impl_is_explored_completely_in_every_variant() -> None:
    out = cli_explore.explore_component(
        components.get("infinilm-scheduler"),
        ImplScheduler,
        "impl",
        overrides={"pages": 3, "requests": 2, "prompt_tokens": 2, "max_new": 2},
    )
    doc = out.to_json()
    assert out.passed and doc["complete"]
    assert [r["variant"] for r in doc["runs"]] == ["legacy", "exact", "tight"]
    assert all(r["distinct_states"] > 100 for r in doc["runs"])


@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
def test_offload_impl_is_explored_completely_in_both_variants(component: str) -> None:
    comp = components.get(component)
    out = cli_explore.explore_component(
        comp, ImplManager, "impl", overrides={"capacity": 2, "keys": 3}
    )
    doc = out.to_json()
    assert out.passed and doc["complete"] and len(doc["runs"]) == len(comp.variants)
    assert doc["bounds"]["variants"] == list(comp.variants)


# ----------------------------------------------------------------------------- bugs found
@pytest.mark.parametrize("name", BM_MUTANTS)
def test_block_manager_mutant_is_found_with_a_short_replayable_trace(
    name: str, tmp_path: Path
) -> None:
    replay = components.get(BM).replay
    mutant = CATALOGUE[name].cls
    result = explore(BlockManagerModel(BM, mutant, f"mutant:{name}", MUTANT_BM), save_dir=tmp_path)
    assert not result.passed, f"{name} survived the explorer"
    violation = result.violations[0]
    assert 1 <= violation.depth <= 7  # the fuzzer's shrunk repros are at most 12 calls
    assert violation.replay == "reproduced"
    document = json.loads(Path(str(violation.trace_file)).read_text())
    again = replay(document, mutant, name)
    assert again.failure is not None and again.failure.check == violation.check
    assert replay(document, ImplBlockManager, "impl").passed


@pytest.mark.parametrize(
    "name", ["tight_counter_uses_exact_formula", "decode_mixed_into_prefill_step"]
)
def test_scheduler_mutant_is_found(name: str) -> None:
    m = CATALOGUE[name]
    bounds = SchedulerBounds(variant=m.variant or "legacy", pages=4, requests=2, max_new=3)
    result = explore(SchedulerModel(m.component, m.cls, f"mutant:{name}", bounds))
    assert not result.passed and result.violations[0].replay == "reproduced"
    assert result.violations[0].depth <= 4


class CounterDriftOnLoadCompletion(ImplManager):
    """A planted #45757 bug: the last load completion forgets to count the block as idle."""

    def complete_load(self, keys: Any, req_context: object = None) -> None:
        before = self._num_evictable_cache_blocks
        super().complete_load(keys, req_context)
        self._num_evictable_cache_blocks = before


@pytest.mark.parametrize(
    ("component", "variant"), [("vllm-arc", "t1_fallback"), ("vllm-lru", "v1")]
)
def test_offload_bug_is_found_with_its_shortest_trace(
    component: str, variant: str, tmp_path: Path
) -> None:
    bounds = OffloadBounds(variant=variant, capacity=2, keys=3)
    model = OffloadModel(
        component,
        CounterDriftOnLoadCompletion,
        "drift",
        bounds,
        components.get(component).fixed_options,
    )
    result = explore(model, save_dir=tmp_path)
    violation = result.violations[0]
    assert violation.check == "evictable_counter_matches_scan"
    assert [s["method"] for s in violation.steps] == [
        "prepare_store",
        "complete_store",
        "prepare_load",
        "complete_load",
    ]
    document = json.loads(Path(str(violation.trace_file)).read_text())
    assert document["format"] == "kvspec-trace/1" and document["component"] == component
    assert violation.replay == "reproduced"


# ----------------------------------------------------------------------------- bounds
def test_max_states_stops_the_search_and_says_it_is_incomplete() -> None:
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM), max_states=50)
    assert result.passed and not result.complete and result.stopped_by == "max_states"
    assert result.distinct_states == 50 and "--max-states" in result.message


def test_depth_bound_reports_incomplete() -> None:
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", SMALL_BM), depth=2)
    assert result.passed and not result.complete and result.stopped_by == "depth"
    assert result.max_depth == 2


# ----------------------------------------------------------------------------- the CLI
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["explore", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_document_and_exit_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    small = ("--pages", "2", "--tables", "1", "--tokens", "2")
    rc, out, _ = run_cli(capsys, BM, *small, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc.keys() >= JSON_KEYS and doc["complete"] and doc["violations"] == []
    rc, out, _ = run_cli(capsys, BM, *small, "--max-states", "40", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["complete"] is False and doc["distinct_states"] == 40
    assert "--max-states" in doc["runs"][0]["message"]


def test_cli_counterexample_is_saved_and_kvspec_replay_fails_the_same_way(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(
        capsys, BM, "--pages", "3", "--tokens", "3", "--target", "mutant:lifo_free_list", "--json"
    )
    doc = json.loads(out)
    assert rc == 1 and len(doc["violations"]) == 1
    violation = doc["violations"][0]
    assert violation["check"] == "identical_eviction_order" and violation["depth"] == 2
    rc = main(["replay", violation["trace_file"], "--json"])
    replayed = json.loads(capsys.readouterr().out)
    assert rc == 1 and replayed["counterexample"]["check"] == violation["check"]
    assert main(["replay", violation["trace_file"], "--target", "impl", "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["no-such-component"], "unknown component"),
        ([BM, "--keys", "3"], "--keys does not apply"),
        ([BM, "--variant", "exact"], "--variant does not apply"),
        (["infinilm-scheduler", "--variant", "loose"], "unknown infinilm-scheduler variant"),
        ([BM, "--pages", "9"], "pages must be in [1, 8]"),
        ([BM, "--target", "mutant:no_such_bug"], "no mutant"),
        ([BM, "--max-states", "0"], "--max-states must be at least 1"),
        ([BM, "--max-memory", "0"], "--max-memory must be positive"),
    ],
)
def test_cli_could_not_run_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err


def test_kvspec_explore_is_a_cli_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["explore", "vllm-lru", "--capacity", "1", "--keys", "2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["complete"]
    assert doc["bounds"]["variants"] == list(components.get("vllm-lru").variants)


def test_verify_stage_passes_on_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    # the stage's own scopes are the ones explored above; tiny ones keep this test quick
    tiny = {
        BM: {"pages": 1, "tables": 1, "tokens": 2},
        "infinilm-scheduler": {"pages": 2, "requests": 1, "prompt_tokens": 2, "max_new": 1},
        "vllm-arc": {"capacity": 1, "keys": 2},
        "vllm-lru": {"capacity": 1, "keys": 2},
        "vllm-prefix-cache": {"blocks": 2, "requests": 1, "max_model_len": 2},
        "sglang-radix-cache": {"pages": 1, "requests": 1, "prompt_tokens": 1, "max_len": 2},
    }
    for name, scope in tiny.items():
        comp = components.get(name)
        assert comp.explorer is not None
        plan = replace(comp.explorer, verify_scope=scope)
        monkeypatch.setitem(components._REGISTRY, name, replace(comp, explorer=plan))
    status, summary = cli_explore.verify_stage()
    assert status == "pass", summary
    assert "infinilm-block-manager" in summary and "vllm-lru" in summary
    assert "sglang-radix-cache" in summary


def test_explore_mutant_reports_a_kill_for_the_kill_matrix() -> None:
    attempt = kill_matrix.run_explorer(CATALOGUE["release_returns_pages_to_free_list"], 30.0)
    assert attempt.status == "killed" and attempt.repro_steps == 2
