"""Explorer scopes (issue 30): named products of option configurations, and reports that say
what a run covered (configurations, option values, operations never reached)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from impl.vllm.kv_cache_manager import KVCacheManager as PrefixImpl
from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec import exploration as cli_explore
from kvspec.cli import main
from proofs import explorer
from proofs.explorer import OffloadBounds, PrefixCacheBounds, SchedulerBounds
from stateful_tests.mutants_vllm import StoreThresholdOffByOne as ThresholdOffByOne
from stateful_tests.mutants_vllm_prefix import (
    ChunkCurrentChunkFreed,
    MambaCountsEveryPosition,
)

TINY = {"capacity": 1, "keys": 2}  # the offload bounds every configuration shares here


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
        ("events", True),
        ("base", True),
    ]
    assert cov["dimensions"]["store_threshold"] == [1, 2]
    assert [r["configuration"] for r in doc["runs"]] == ["store-threshold", "events", "base"]
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
    # and the base leaves the manager's events off: take_events is never offered either
    assert doc["coverage"]["unreached_operations"] == ["take_events", "touch"]


def test_cli_scope(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explore", "vllm-lru", "--variant", "v2", "--capacity", "1", "--keys", "2"]
    assert main([*argv, "--scope", "tracker", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["coverage"]["scope"] == "tracker"
    assert main([*argv, "--scope", "tracker"]) == 0
    text = capsys.readouterr().out
    assert "scope tracker: configurations store-threshold, events, base" in text
    assert "operations never reached: none" in text
    assert main([*argv, "--scope", "wide"]) == 2
    err = capsys.readouterr().err
    assert "no scope 'wide'" in err and len(err.strip().splitlines()) == 1


# the planted bugs that need an option the base scope leaves off (issue 30): (component, mutant)
OPTION_BUGS = (
    ("vllm-prefix-cache", "caching_off_still_caches"),  # enable_caching=False
    ("vllm-prefix-cache", "lookahead_not_clamped"),  # lookahead tokens at max_model_len
    ("vllm-lru", "store_threshold_off_by_one"),  # store_threshold >= 2
    ("sglang-radix-cache", "decode_page_boundary_off_by_one"),  # page_size > 1
    ("sglang-radix-cache", "group_end_keeps_pending"),  # a repeated free_group_end
    ("sglang-radix-cache", "merge_keeps_staging"),  # need_sort=True
)


def _mutant(component: str, name: str) -> Any:
    return next(m for m in components.get(component).planted if m.name == name)


@pytest.mark.parametrize(("component", "name"), OPTION_BUGS)
def test_a_bug_behind_an_option_is_caught_by_the_default_explore(component: str, name: str) -> None:
    comp, m = components.get(component), _mutant(component, name)
    out = cli_explore.explore_component(
        comp, m.cls, f"mutant:{name}", variants=[m.variant] if m.variant else None
    )  # no scope, no bounds: the default scope
    assert out.scope == "default"
    assert not out.passed, f"{name} survived the default explore"
    assert out.configs[-1] != "base", "caught by the base alone: not an option bug"


@pytest.mark.parametrize(("component", "name"), OPTION_BUGS)
def test_a_bug_behind_an_option_is_caught_by_check_with_the_ci_profile(
    component: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["check", component, "--target", f"mutant:{name}", "--profile", "ci", "--json"]
    assert main(argv) == 1, f"{name} survived check --profile ci"
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is False and doc["counterexample"]


def test_without_scope_or_bounds_explore_runs_the_default_scope_and_with_bounds_the_base() -> None:
    assert explorer.default_scope(None) == explorer.default_scope({}) == "default"
    assert explorer.default_scope({"bad_inputs": False}) == "default"  # --inputs well-formed
    assert explorer.default_scope({"capacity": 1}) == "base"


def test_check_and_fuzz_reports_say_which_option_values_they_drew(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stateful_tests.vllm_offload import OPERATIONS as OFFLOAD_OPERATIONS

    assert main(["fuzz", "vllm-lru", "--ops", "2000", "--json"]) == 0
    scope = json.loads(capsys.readouterr().out)["scope"]
    assert scope["dimensions"]["policy"] == ["lru"]
    assert set(scope["dimensions"]["store_threshold"]) <= {1, 2}
    names = {op.name for op in OFFLOAD_OPERATIONS}
    assert set(scope["unreached_operations"]) <= names
    assert main(["check", "vllm-prefix-cache", "--profile", "ci", "--json"]) == 0
    scope = json.loads(capsys.readouterr().out)["scope"]
    assert scope["dimensions"]["enable_caching"] == [False, True]  # caching off is drawn
    assert scope["unreached_operations"] == []
    assert main(["fuzz", "vllm-lru", "--ops", "500"]) == 0
    text = capsys.readouterr().out
    assert "option values drawn: " in text and 'policy "lru"' in text
    assert "operations never reached: " in text


def test_scope_report_reads_the_drawn_configurations() -> None:
    from collections import Counter

    from stateful_tests import vllm_offload
    from stateful_tests.checker import count_config, scope_report

    coverage: Counter[str] = Counter({"rule:lookup": 3})
    for threshold in (2, 1, 2):
        config = vllm_offload.Config(
            policy="lru", variant="v2", num_blocks=2, num_keys=3, store_threshold=threshold
        )
        count_config(coverage, config)
    report = scope_report(vllm_offload.CHECKER, coverage, "all")
    assert report["dimensions"]["store_threshold"] == [1, 2]
    assert coverage["config:store_threshold=2"] == 2
    assert "lookup" not in report["unreached_operations"]
    assert "prepare_store" in report["unreached_operations"]


class EventsLost(ImplManager):
    """Planted for this test: take_events hands out nothing (the events are still cleared)."""

    def take_events(self) -> Any:
        list(super().take_events())
        return iter(())


def test_the_default_offload_scope_takes_the_managers_events() -> None:
    comp = components.get("vllm-lru")
    assert cli_explore.explore_component(comp, EventsLost, "t", scope="base").passed
    out = cli_explore.explore_component(comp, EventsLost, "t", variants=["r0.34"])
    assert not out.passed and out.configs[-1] == "events"
    doc = cli_explore.explore_component(comp, ImplManager, "t", variants=["r0.34"]).to_json()
    assert doc["coverage"]["dimensions"]["events"] == [False, True]
    assert "take_events" not in doc["coverage"]["unreached_operations"]


class PrefixEventsLost(PrefixImpl):
    """Planted for this test: take_events hands out nothing (the queue is still emptied)."""

    def take_events(self) -> Any:
        super().take_events()
        return []


class ExternalBlocksAsNew(PrefixImpl):
    """Planted for this test: blocks for connector-loaded tokens are not allocated at adoption,
    so they come back among the step's new blocks."""

    def _adopt(self, rid: str, hits: Any, num_total: int, num_external: int) -> Any:
        return super()._adopt(rid, hits, num_total, 0)


def test_scope_gaps_name_unreached_operations_and_one_sided_options() -> None:
    full = {"dimensions": {"caching": [False, True], "block_size": [1]}, "unreached_operations": []}
    assert cli_explore.scope_gaps(full) == []
    gappy = {"dimensions": {"caching": [True], "variant": ["a"]}, "unreached_operations": ["touch"]}
    assert cli_explore.scope_gaps(gappy) == [
        "operation touch never reached",
        "option caching explored True only",
    ]


def test_the_verify_explorer_stage_fails_on_a_scope_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    # the SGLang cache with its option configurations dropped: need_sort and the free groups
    # stay off, and the stage must fail rather than report "complete"
    from proofs.explorer.model_sglang import RadixCacheBounds

    comp = components.get("sglang-radix-cache")
    monkeypatch.setattr(RadixCacheBounds, "SCOPES", {"default": (("base", {}),)})
    monkeypatch.setattr(components, "all_components", lambda: [comp])
    status, summary = cli_explore.verify_stage()
    assert status == "fail"
    assert "option need_sort explored False only" in summary
    assert "operation group_end never reached" in summary


def test_an_option_configuration_the_overrides_rule_out_is_left_out() -> None:
    # a mutant's PD connector applied to the scheduler's default scope: no Mamba configuration
    from proofs.explorer.entry import plan

    names = [n for n, _, _ in plan(SchedulerBounds, "default", ["tight"], {}, component="s")]
    assert "mamba" in names
    kept = plan(SchedulerBounds, "default", ["tight"], {"connector": True}, component="s")
    assert "mamba" not in [n for n, _, _ in kept] and "base" in [n for n, _, _ in kept]
    with pytest.raises(ValueError, match="do not go together"):  # the base itself: an error
        plan(SchedulerBounds, "base", ["tight"], {"connector": True, "mamba": True}, component="s")


@pytest.mark.parametrize(
    ("planted", "variant", "configuration", "values"),
    [
        (PrefixEventsLost, "unhashed_first", "events", [False, True]),
        (ExternalBlocksAsNew, "unhashed_first", "external", [0, 1]),
        # issue 26: 0.34's hybrid coordinator. (The window configuration is not here: its one
        # catch, window_run_not_reset, came from the mutant handing out a raw map entry as a
        # block; the honest mutant, and every other window mutant, survive it — an open gap.)
        (ChunkCurrentChunkFreed, "r0.34", "chunk", [0, 2]),
        (MambaCountsEveryPosition, "r0.34", "mamba", [False, True]),
    ],
)
def test_a_prefix_cache_option_configuration_catches_its_planted_bug(
    planted: Any, variant: str, configuration: str, values: list[Any]
) -> None:
    """Each prefix-cache option configuration of the default scope catches a bug the base
    cannot reach, and the report lists the option's values."""
    comp = components.get("vllm-prefix-cache")
    assert cli_explore.explore_component(
        comp, planted, "t", variants=[variant], scope="base"
    ).passed
    out = cli_explore.explore_component(comp, planted, "t", variants=[variant])
    assert not out.passed and out.configs[-1] == configuration
    assert out.to_json()["coverage"]["dimensions"][configuration] == values
