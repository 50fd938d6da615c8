"""The scheduler benches (``kvspec bench schedule|capacity|admission``): shape and fixtures.

Benchmarks report ratios measured side by side; nothing here asserts a timing (docs/design.md).
What is pinned: every suite runs quickly with ``--quick``, emits one JSON document of well-formed
rows with positive ratios, and its fixtures are the ones the rows claim (both sides on equal state).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.infinilm.scheduler import Scheduler as ImplScheduler
from kvspec import bench
from kvspec.cli import main
from spec.infinilm.block_manager import BlockManager as SpecBlockManager
from spec.infinilm.scheduler import Scheduler as SpecScheduler
from spec.infinilm.scheduler import exact_blocks

ROWS = {"schedule": 5, "capacity": 3, "admission": 2}


def check_row(row: dict[str, Any]) -> None:
    assert isinstance(row["case"], dict) and row["case"]
    assert {"baseline", "impl"} <= set(row["case"])  # each side says what it runs
    for key in ("baseline_us", "impl_us", "ratio"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row)
    if "goal" in row:
        assert row["goal"] >= 1.0
        assert row["meets_goal"] == (row["ratio"] >= row["goal"])


@pytest.mark.parametrize("suite", list(ROWS))
def test_suite_quick_rows(suite: str) -> None:
    rows = bench.run_suite(suite, quick=True, rounds=7)
    assert len(rows) == ROWS[suite]
    for row in rows:
        assert row.ratio > 0
        check_row(row.to_json())


@pytest.mark.parametrize("suite", list(ROWS))
def test_cli_json(suite: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", suite, "--quick", "--rounds", "7", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # exactly one document
    assert document["suite"] == suite
    assert len(document["rows"]) == ROWS[suite]
    for row in document["rows"]:
        check_row(row)


def test_suites_are_registered() -> None:
    assert {"schedule", "capacity", "admission"} <= set(bench.SUITES)
    with pytest.raises(ValueError, match="unknown bench suite"):
        bench.run_suite("nosuch", quick=True)


def test_goals() -> None:
    # PR #579's ratios, floored at 1.0; PR #576's fixture has a goal only at 32,768 pages; the
    # exact-scan row of the admission bench has the exact-reservation PR's 22x.
    assert [max(bench.SCHEDULE_PR[c], 1.0) for c in bench.SCHEDULE_CASES] == [
        1.05,
        1.0,
        4.9,
        10.9,
        19.8,
    ]
    assert bench.CAPACITY_GOALS == {32768: 300.0}
    assert bench.ADMISSION_GOAL == 22.0


# ----------------------------------------------------------------------------- fixtures
def running_state(sched: Any) -> list[tuple[int, int, int, int]]:
    return [
        (
            r.get_prompt_length(),
            r.get_num_generated_tokens(),
            r.sampling_params.max_tokens,
            len(r.block_table),
        )
        for r in sched.running_queue
    ]


@pytest.mark.parametrize(("running", "waiting"), bench.SCHEDULE_CASES)
def test_schedule_fixture_admits_every_waiting_request(running: int, waiting: int) -> None:
    batches = []
    for cls in (SpecScheduler, ImplScheduler):
        sched = bench._schedule_fixture(cls, running, waiting)
        assert running_state(sched) == [(1, 1, 512, 1)] * running
        out = sched.schedule()
        assert out is not None and out.is_prefill
        batches.append([r.request_id for r in out.scheduled_requests])
    assert batches[0] == batches[1] == [f"w{i}" for i in range(waiting)]


@pytest.mark.parametrize("pages", bench.CAPACITY_CASES[:2])
def test_capacity_fixture(pages: int) -> None:
    spec = bench._capacity_fixture(SpecScheduler, SpecBlockManager, "legacy", pages)
    impl = bench._capacity_fixture(ImplScheduler, ImplBlockManager, "exact", pages)
    assert isinstance(spec.cache_manager, SpecBlockManager)
    assert isinstance(impl.cache_manager, ImplBlockManager)
    assert running_state(spec) == running_state(impl)
    assert len(running_state(spec)) == bench.CAPACITY_RUNNING
    assert [g for _, g, _, _ in running_state(spec)][0::31] == [8, 64]  # g spread over 8..64
    for sched in (spec, impl):
        bm = sched.cache_manager
        assert not bm.free_block_ids  # every page allocated ...
        assert bm.get_total_usable_blocks() == pages // 2  # ... and half of the pool released
    scan = sum(exact_blocks(r, 16) for r in impl.running_queue)
    assert impl.num_reserved_decode_blocks == scan  # the incremental counter is maintained


def test_admission_fixture_sides_differ_only_in_reservation() -> None:
    sides = {
        "legacy": bench._admission_fixture(SpecScheduler, "legacy"),
        "exact": bench._admission_fixture(SpecScheduler, "exact"),
        "incremental": bench._admission_fixture(ImplScheduler, "exact"),
    }
    states = {name: running_state(s) for name, s in sides.items()}
    assert len(states["legacy"]) == bench.ADMISSION_RUNNING
    assert states["legacy"] == states["exact"] == states["incremental"]
    for sched in sides.values():
        assert isinstance(sched.cache_manager, ImplBlockManager)
    assert (
        sides["incremental"].num_reserved_decode_blocks == sides["exact"].num_reserved_decode_blocks
    )
    candidate = bench._candidate()
    assert sides["exact"].can_accept_request(candidate, 0) == sides[
        "incremental"
    ].can_accept_request(candidate, 0)
