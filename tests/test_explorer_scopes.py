"""Explorer scopes (issue 30): named products of option configurations, and reports that say
what a run covered (configurations, option values, operations never reached)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec import exploration as cli_explore
from kvspec.cli import main
from proofs import explorer
from proofs.explorer import OffloadBounds, PrefixCacheBounds, SchedulerBounds

TINY = {"capacity": 1, "keys": 2}  # the offload bounds every configuration shares here


class ThresholdOffByOne(ImplManager):
    """Planted: a key is stored after ``store_threshold - 1`` offers (the counts still kept).
    Identical to the impl at ``store_threshold=1``, the base scope's only value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.store_threshold >= 2:
            self.store_threshold -= 1


def _explore(cls: Any, scope: str | None, **overrides: Any) -> Any:
    # no depth bound: count_saturation keeps the tracker's counts finite in the state key
    comp = components.get("vllm-lru")
    return cli_explore.explore_component(
        comp, cls, "t", variants=["v2"], overrides={**TINY, **overrides}, scope=scope
    )


def test_every_bounds_class_names_a_default_and_a_base_scope() -> None:
    for bounds, product in (
        (OffloadBounds, "tracker"),
        (PrefixCacheBounds, "default"),
        (SchedulerBounds, "default"),
    ):
        found = explorer.scopes(bounds)
        assert {"default", "base", product} <= set(found)
        assert found["base"] == (("base", {}),)
        names = [n for n, _ in found[product]]
        assert names[-1] == "base" and len(names) > 1  # options first, then the base
        for dim in explorer.dimensions(bounds):
            assert dim in {f for f in bounds.__dataclass_fields__}


def test_an_unknown_scope_is_a_value_error_naming_the_scopes() -> None:
    with pytest.raises(ValueError, match=r"no scope 'wide' \(scopes: base, default, tracker\)"):
        explorer.configurations(OffloadBounds, "wide", component="vllm-lru")


def test_default_scope_reports_each_configuration_and_the_values_covered() -> None:
    out = _explore(ImplManager, "tracker")
    doc = out.to_json()
    assert out.passed
    cov = doc["coverage"]
    assert cov["scope"] == "tracker"
    assert [(c["name"], c["explored"]) for c in cov["configurations"]] == [
        ("store-threshold", True),
        ("base", True),
    ]
    assert cov["dimensions"]["store_threshold"] == [1, 2]
    assert [r["configuration"] for r in doc["runs"]] == ["store-threshold", "base"]
    assert cov["unreached_operations"] == []


def test_base_scope_says_which_option_values_it_left_out() -> None:
    doc = _explore(ImplManager, None).to_json()
    assert doc["coverage"]["scope"] == "base"
    assert doc["coverage"]["dimensions"]["store_threshold"] == [1]


def test_a_bug_behind_a_non_default_option_needs_the_scope() -> None:
    assert _explore(ThresholdOffByOne, "base").passed  # threshold 1: the bug is out of reach
    out = _explore(ThresholdOffByOne, "tracker")
    assert not out.passed
    assert out.configs[-1] == "store-threshold"


def test_default_offload_scope_runs_the_tracker_on_the_newest_release() -> None:
    comp = components.get("vllm-lru")
    out = cli_explore.explore_component(comp, ImplManager, "t", overrides=TINY, scope="default")
    doc = out.to_json()
    assert out.passed
    runs = [(r["configuration"], r["variant"]) for r in doc["runs"]]
    assert runs[0] == ("store-threshold", "r0.34")
    assert 2 in doc["coverage"]["dimensions"]["store_threshold"]


def test_count_saturation_is_a_reported_reduction() -> None:
    out = _explore(ImplManager, "tracker")
    first = out.to_json()["runs"][0]
    assert first["reductions"]["count_saturation"] is True


def test_unreached_operations_are_reported() -> None:
    # the r0.34 release has no touch(): its alphabet never offers it
    comp = components.get("vllm-lru")
    doc = cli_explore.explore_component(
        comp, ImplManager, "t", variants=["r0.34"], overrides=TINY
    ).to_json()
    assert doc["coverage"]["unreached_operations"] == ["touch"]


def test_cli_scope(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explore", "vllm-lru", "--variant", "v2", "--capacity", "1", "--keys", "2"]
    assert main([*argv, "--scope", "tracker", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["coverage"]["scope"] == "tracker"
    assert main([*argv, "--scope", "tracker"]) == 0
    text = capsys.readouterr().out
    assert "scope tracker: configurations store-threshold, base" in text
    assert "operations never reached: none" in text
    assert main([*argv, "--scope", "wide"]) == 2
    err = capsys.readouterr().err
    assert "no scope 'wide'" in err and len(err.strip().splitlines()) == 1
