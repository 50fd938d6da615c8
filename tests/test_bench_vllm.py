"""The vLLM offload benches (``kvspec bench arc|lru``): shape, fixture and the agreement check.

Benchmarks report ratios measured side by side; nothing here asserts a timing (docs/design.md).
What is pinned: both suites run quickly with ``--quick`` and emit one JSON document of well-formed
rows; the fixture is the one the rows claim (a full cache, T1 and T2 non-empty, T1's front being
loaded, one ``prepare_store`` evicting half of it); and a bench whose impl does different work
from the spec raises instead of reporting a ratio.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from impl.vllm.arc import ARCCachePolicy as ImplARC
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import bench
from kvspec.cli import main
from spec.vllm import BlockStatus, Key
from spec.vllm.offload_manager import CPUOffloadingManager as SpecManager

ROWS = {"arc": 2, "lru": 3}  # --quick: ARC at 200/1,000; LRU v2 at 200/1,000 and v1 at 1,000


def check_row(row: dict[str, Any]) -> None:
    assert isinstance(row["case"], dict) and row["case"]
    case = row["case"]
    assert {"policy", "num_blocks", "pinned", "stored", "evicted", "baseline", "impl"} <= set(case)
    assert case["stored"] == case["evicted"] == case["num_blocks"] // 2  # half of a full cache
    for key in ("baseline_us", "impl_us", "ratio"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row)
    if "goal" in row:
        assert row["goal"] == case["pr_ratio"] == bench.ARC_PR[case["num_blocks"]]
        assert row["meets_goal"] == (row["ratio"] >= row["goal"])


@pytest.mark.parametrize("suite", list(ROWS))
def test_suite_quick_rows(suite: str) -> None:
    rows = bench.run_suite(suite, quick=True, rounds=7)
    assert len(rows) == ROWS[suite]
    assert [r.case["num_blocks"] for r in rows][:2] == bench.OFFLOAD_QUICK_CASES
    for row in rows:
        assert row.ratio > 0
        assert row.case["policy"] == suite
        check_row(row.to_json())


@pytest.mark.parametrize("suite", list(ROWS))
def test_cli_json(suite: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", suite, "--quick", "--rounds", "7", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # exactly one document
    assert document["suite"] == suite
    assert len(document["rows"]) == ROWS[suite]
    for row in document["rows"]:
        check_row(row)


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "lru", "--quick", "--rounds", "7"]) == 0
    assert "bench lru" in capsys.readouterr().out


def test_suites_are_registered() -> None:
    assert {"arc", "lru"} <= set(bench.SUITES) and {"arc", "lru"} <= set(bench.BENCHES)


def test_goals_are_the_pr_ratios() -> None:
    assert bench.ARC_PR == {1_000: 16.5, 5_000: 81.0, 10_000: 142.0}
    assert bench.OFFLOAD_CASES == [1_000, 5_000, 10_000]
    assert bench.OFFLOAD_QUICK_CASES == [200, 1_000]


# ----------------------------------------------------------------------------- the fixture
def test_arc_rows_describe_both_lists_and_the_pins() -> None:
    rows = list(bench.bench_arc(7, quick=True))
    for row in rows:
        case = row.case
        n = case["num_blocks"]
        assert case["t1"] + case["t2"] == n and case["t1"] > 0 and case["t2"] > 0
        assert 0 < case["pinned"] < case["t1"]
        assert case["target_t1_size"] == 0.0
        # T1's idle blocks run out before half the cache is evicted: both lists give victims
        assert case["evicted_t1"] == case["t1"] - case["pinned"]
        assert case["evicted_t2"] == case["evicted"] - case["evicted_t1"] > 0
    assert rows[-1].goal == 16.5  # the 1,000-block row carries PR #50992's ratio


@pytest.mark.parametrize(("policy", "lru"), [("arc", "v2"), ("lru", "v2"), ("lru", "v1")])
def test_fixture_is_full_and_equal_on_both_sides(policy: str, lru: str) -> None:
    plan = bench._offload_plan(200)
    spec = bench._offload_fixture(SpecManager, plan, policy, lru)
    impl = bench._offload_fixture(ImplManager, plan, policy, lru)
    assert spec.snapshot() == impl.snapshot()
    assert spec._num_allocated_blocks == 200 and not spec._free_list  # full, nothing free
    assert len(plan.new) == 100 and not set(plan.new) & {k for r in plan.requests for k in r}
    blocks = dict(spec._policy.items())
    assert all(blocks[k].ref_cnt == 1 for k in plan.pinned)  # being loaded
    assert sum(b.ref_cnt == 0 for b in blocks.values()) == 200 - len(plan.pinned)
    assert impl._num_evictable_cache_blocks == spec._num_evictable_cache_blocks
    if policy == "arc":
        reused = {k for r in plan.reused for k in r}
        assert set(spec._policy.t2) == reused  # seen again once ready: promoted
        assert set(tuple(spec._policy.t1)[: len(plan.pinned)]) == set(plan.pinned)  # T1's front


def test_same_work_returns_the_common_result() -> None:
    plan = bench._offload_plan(200)
    spec = bench._offload_fixture(SpecManager, plan, "arc", "v2")
    impl = bench._offload_fixture(ImplManager, plan, "arc", "v2")
    stored, ids, evicted = bench._same_work(spec, impl, plan.new, 100)
    assert stored == list(plan.new) and len(ids) == len(evicted) == 100
    assert not set(evicted) & set(plan.pinned)  # loading blocks are never victims


# ----------------------------------------------------------------------------- broken impls
class ReversedEvictedKeys(ImplManager):
    """Evicts the right blocks but reports them in reverse order."""

    def prepare_store(self, keys: Any, req_context: object = None) -> Any:
        out = super().prepare_store(keys, req_context)
        if out is None:
            return None
        return dataclasses.replace(out, evicted_keys=out.evicted_keys[::-1])


class EvictsLoadingBlocks(ImplARC):
    """An eviction that forgets loads pin a block (upstream eligibility is ``ref_cnt == 0``)."""

    def evict(self, n: int, protected: AbstractSet[Key]) -> list[tuple[Key, BlockStatus]] | None:
        loading = {k: b.ref_cnt for k, b in self.items() if b.ref_cnt > 0}
        blocks = dict(self.items())
        for key in loading:
            blocks[key].ref_cnt = 0
        try:
            return super().evict(n, protected)
        finally:
            for key, ref_cnt in loading.items():
                blocks[key].ref_cnt = ref_cnt


class LoadingBlocksEvicted(ImplManager):
    def __init__(self, num_blocks: int, cache_policy: Any = "lru", **kw: Any) -> None:
        super().__init__(num_blocks, cache_policy, **kw)
        if cache_policy == "arc":
            self._policy = EvictsLoadingBlocks(num_blocks)


class TouchIgnored(ImplManager):
    """Builds a different fixture: ``touch`` does nothing (no T2 under ARC)."""

    def touch(self, keys: Any, req_context: object = None) -> None:
        return


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (ReversedEvictedKeys, "prepare_store differs"),
        (LoadingBlocksEvicted, "prepare_store differs"),
        (TouchIgnored, "bench fixture differs"),
    ],
)
def test_arc_disagreement_raises(broken: type, message: str) -> None:
    with pytest.raises(bench.BenchMismatch, match=message):
        list(bench.bench_arc(7, quick=True, impl_cls=broken))


def test_lru_disagreement_raises() -> None:
    with pytest.raises(bench.BenchMismatch, match="prepare_store differs"):
        list(bench.bench_lru(7, quick=True, impl_cls=ReversedEvictedKeys))


class GhostsReversed(ImplManager):
    """Returns the right result but leaves ARC's B1 ghost list in reverse order."""

    def prepare_store(self, keys: Any, req_context: object = None) -> Any:
        out = super().prepare_store(keys, req_context)
        b1 = self._policy.b1
        for key in list(b1)[-2::-1]:
            b1.move_to_end(key)
        return out


def test_disagreement_on_state_alone_raises() -> None:
    with pytest.raises(bench.BenchMismatch, match="state after prepare_store differs"):
        list(bench.bench_arc(7, quick=True, impl_cls=GhostsReversed))
