"""The explorer at scale (issue 28): its cost against the calls' own (the floor), the workers'
parallel efficiency, the memory bound and how far a stopped search got, at CI-sized scopes.

The figures themselves (pages=4, the workers' speed-up, Ray) are measured by hand and recorded in
docs/explorer.md; these tests pin down that the measurements are there and mean what they say.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from kvspec.cli import main
from proofs.explorer import BlockManagerBounds, BlockManagerModel, engine, explore
from stateful_tests.lockstep import Outcome

BM = "infinilm-block-manager"
SCOPE = BlockManagerBounds(pages=3, block_size=2, vocab=1, tables=2, tokens=3)


def model() -> BlockManagerModel:
    return BlockManagerModel(BM, ImplBlockManager, "impl", SCOPE)


def test_the_floor_counts_only_time_inside_the_two_sides_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = explore(model(), depth=6)
    floor = result.floor
    assert 0 < floor["call_seconds"] < result.cpu_seconds
    assert floor["rest_seconds"] == pytest.approx(
        result.cpu_seconds - result.call_seconds, abs=1e-3
    )
    assert floor["rest_over_calls"] == pytest.approx(
        (result.cpu_seconds - result.call_seconds) / result.call_seconds, abs=0.01
    )
    # a target whose methods take 2 ms more each: the extra lands in call_seconds, not the rest
    slow = type("Slow", (ImplBlockManager,), {})

    slept: list[int] = []

    def sleepy(self: ImplBlockManager) -> int:
        slept.append(1)
        time.sleep(0.002)
        return ImplBlockManager.get_num_free_blocks(self)

    slow.get_num_free_blocks = sleepy  # type: ignore[attr-defined]
    raw = replace(SCOPE, layout_classes=False)  # (a subclass's set tables are never classed)
    slowed = explore(BlockManagerModel(BM, slow, "slow", raw), depth=3)
    quick = explore(BlockManagerModel(BM, ImplBlockManager, "impl", raw), depth=3)
    assert slowed.distinct_states == quick.distinct_states
    assert len(slept) >= 5
    assert slowed.call_seconds - quick.call_seconds >= 0.002 * len(slept) * 0.9
    # the sleep is wall time, not CPU: it lowers the rest (CPU minus calls) — never raises it
    assert slowed.floor["rest_seconds"] <= quick.floor["rest_seconds"] + 1.0


def test_workers_report_their_cpu_and_parallel_efficiency() -> None:
    result = explore(model(), depth=9, workers=2)
    assert len(result.worker_cpu_seconds) == 2 and all(c > 0 for c in result.worker_cpu_seconds)
    eff = result.parallel_efficiency
    assert eff is not None and 0 < eff <= 1.05
    assert result.cpu_seconds >= sum(result.worker_cpu_seconds)
    assert 0 < result.call_seconds < result.cpu_seconds
    assert explore(model(), depth=3).parallel_efficiency is None


def test_a_complete_search_expanded_every_state_it_reached() -> None:
    result = explore(BlockManagerModel(BM, ImplBlockManager, "impl", BlockManagerBounds(pages=2)))
    assert result.complete and result.stopped_by is None
    assert result.expanded_per_depth == result.states_per_depth


@pytest.mark.parametrize("workers", [1, 2])
def test_the_memory_bound_stops_the_search_and_says_how_far_it_got(workers: int) -> None:
    result = explore(model(), max_memory_mb=1.0, workers=workers)
    assert result.passed and not result.complete and result.stopped_by == "max_memory"
    assert "memory bound (1 MB resident)" in result.message and "--max-memory" in result.message
    assert "expanded" in result.message
    done, reached = result.expanded_per_depth, result.states_per_depth
    assert len(done) <= len(reached) and all(d <= r for d, r in zip(done, reached, strict=False))


def test_a_deadline_stop_names_the_depth_it_cut_short() -> None:
    result = explore(model(), deadline=time.perf_counter() + 0.5)
    assert result.stopped_by == "deadline" and not result.complete
    d = len(result.expanded_per_depth) - 1
    assert result.expanded_per_depth[:d] == result.states_per_depth[:d]
    assert result.expanded_per_depth[d] <= result.states_per_depth[d]
    assert f"depth {d} expanded {result.expanded_per_depth[d]:,} of" in result.message


def test_interned_spec_answers_keep_what_the_comparisons_read_apart() -> None:
    key = engine._answer_key
    assert key(Outcome(True)) != key(Outcome(1))  # equal values, other types
    assert key(Outcome(None, ValueError("a"))) != key(Outcome(None, ValueError("b")))
    assert key(Outcome(None, ValueError("a"))) != key(Outcome(None, TypeError("a")))
    assert key(Outcome([1], None, [[2]])) != key(Outcome([1], None, [[3]]))
    assert key(Outcome([1, 2])) == key(Outcome([1, 2]))


def test_cli_reports_the_floor_the_bound_and_the_stop(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explore", BM, "--pages", "3", "--max-memory", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stopped_by"] == "max_memory" and doc["complete"] is False
    assert doc["max_memory_mb"] == 1 and doc["runs"][0]["stopped_by"] == "max_memory"
    assert main(["explore", BM, "--pages", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["complete"] and doc["stopped_by"] is None and doc["floor"]["call_seconds"] > 0
    assert doc["expanded_per_depth"] == doc["states_per_depth"]
    assert doc["max_memory_mb"] is not None  # the default bound (75% of what is available)
    assert main(["explore", BM, "--pages", "2"]) == 0
    out = capsys.readouterr().out
    assert "inside spec and target calls" in out and "per call-second" in out
