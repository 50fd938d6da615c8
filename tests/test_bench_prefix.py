"""``kvspec bench prefix-cache``: every scenario's fixture ends equal on spec and impl (the bench
refuses to time sides that differ), and the suite yields one row per scenario and pool size."""

from __future__ import annotations

from typing import Any

import pytest

from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from kvspec.bench import bench_prefix


@pytest.mark.parametrize(
    "scenario", ["admit_hits", "free_request", "allocate_evicting", "admit_hits_hybrid"]
)
def test_each_scenario_leaves_spec_and_impl_equal(scenario: str) -> None:
    bench_prefix._check_same(128, scenario)


def test_the_hybrid_hit_is_null_padded_in_the_further_groups() -> None:
    fixture = bench_prefix._Fixture(ImplManager, 256, "admit_hits_hybrid")
    fixture.run()
    full, window, chunk = fixture.m.get_block_ids("hits")
    assert len(full) == len(window) == len(chunk) == bench_prefix.HITS + 1
    assert window[0] == 0 and chunk[0] == 0 and 0 not in full


def test_the_suite_yields_a_row_per_scenario_and_size() -> None:
    calls: list[Any] = []

    def timer(rounds: int, sides: dict[str, Any], *_: Any) -> dict[str, float]:
        calls.append(sorted(sides))
        return {"baseline": 2.0, "impl": 1.0}

    rows = list(bench_prefix.bench_prefix_cache(1, True, timer))
    scenarios = [case["scenario"] for case, _, _ in rows]
    assert scenarios.count("admit_hits_hybrid") == len(bench_prefix.QUICK_CASES)
    assert len(rows) == 4 * len(bench_prefix.QUICK_CASES)
    assert all(c == ["baseline", "impl"] for c in calls)
