"""The vLLM CPU-offload checkers (``vllm-arc``, ``vllm-lru``) pass on the impl in every variant,
exercise the paths that matter, bite every planted offload bug, and keep the CLI contract."""

from __future__ import annotations

import copy
import json
import sys
import types
from collections import Counter
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec.cli import main
from spec.vllm import Key
from spec.vllm.offload_manager import VARIANTS
from spec.vllm.offload_manager import CPUOffloadingManager as SpecManager
from spec.vllm.releases import RELEASES, has_call, release_keywords
from stateful_tests import checker, profiles, vllm_offload
from stateful_tests.checker import Example
from stateful_tests.lockstep import invoke, load_trace, save_trace
from stateful_tests.vllm_offload import OPERATIONS

COMPONENTS = {"vllm-arc": "arc", "vllm-lru": "lru"}
BY_POLICY = {policy: components.get(name) for name, policy in COMPONENTS.items()}
CATALOGUE = components.catalogue()
EQUIVALENT_MUTANTS = components.equivalent_mutants()


def check(cls: Any, label: str, settings: Any, *, policy: str, variant: str | None = None) -> Any:
    return BY_POLICY[policy].check(cls, label, settings, variant=variant)


def fuzz(
    cls: Any, label: str, ops: int, seed: int, *, policy: str, variant: str | None = None
) -> Any:
    return BY_POLICY[policy].fuzz(cls, label, ops, seed, variant=variant)


def replay(document: dict[str, Any], cls: Any, label: str) -> Any:
    return components.get(document["component"]).replay(document, cls, label)


def shrink_trace(
    document: dict[str, Any], cls: Any, label: str, *, budget_seconds: float = 10.0
) -> Any:
    return components.get(document["component"]).shrink(
        document, cls, label, budget_seconds=budget_seconds
    )


def mutant_options(m: Any) -> dict[str, Any]:
    """The keywords of the wrappers above that put mutant ``m`` in its configuration."""
    return {"policy": COMPONENTS[m.component], "variant": m.variant}


# r0.28 is the default variant's behaviour and r0.32 r0.31's (no keywords of their own, asserted
# below); every release variant also runs spec against impl in tests/test_vllm_releases.py
SAME_AS = {"r0.28": "the default", "r0.32": "r0.31"}
CASES = [
    (policy, variant)
    for policy in ("arc", "lru")
    for variant in VARIANTS[policy]
    if variant not in SAME_AS
]


def test_the_variants_left_out_above_behave_as_the_ones_kept() -> None:
    assert RELEASES["0.28"] == {} and RELEASES["0.32"] == RELEASES["0.31"]


OFFLOAD_MUTANTS = sorted(n for n, m in CATALOGUE.items() if m.component in COMPONENTS)

REQUIRED_PATHS = {
    "path:eviction",
    "path:failed_eviction",
    "path:guard_fast_fail",
    "path:pool_full",
    "path:protected_input_key",
    "path:evict_while_loading",
    "path:evict_while_pending",
    "path:store_failed",
    "path:load_pins_twice",
    "path:lookup_pending",
    "path:threshold_skipped",
    "raise:prepare_store:InvalidArgument",
    "raise:prepare_load:OffloadStateError",
    "raise:complete_load:OffloadStateError",
    "raise:complete_load:DoubleFreeError",
}
ARC_PATHS = {
    "path:ghost_hit_b1",
    "path:ghost_hit_b2",
    "path:target_moved",
    "path:touch_pending_t1",
    "path:batch_larger_than_t1",
    "path:t1_victim",
    "path:t2_victim",
    "path:t2_pick_above_target",  # T1's iterator exhausted while its virtual size >= target
    "path:victim_after_t2_pick_above_target",  # ... after a T1 victim, with more to come
}


def required(policy: str, variant: str) -> set[str]:
    paths = REQUIRED_PATHS | (ARC_PATHS if policy == "arc" else set())
    if variant.startswith("r") and release_keywords(policy, variant[1:]).get("arc_store_miss"):
        # store misses adapt the ARC target on every store (0.31+), which the explicit programs'
        # T1-then-T2-then-T1 batch does not survive; the other variants keep requiring it
        paths -= {"path:victim_after_t2_pick_above_target"}
    if not has_call(variant, "touch"):
        # 0.34 records a second access only when a request that loaded a block finishes
        # (on_request_finished); kvspec's calls are one fresh request each, so nothing reaches
        # T2 or B2, and the ghost hits that remain are store misses on B1 (docs/vllm-releases.md
        # §15.1)
        paths -= {
            "path:touch_pending_t1",
            "path:ghost_hit_b1",
            "path:ghost_hit_b2",
            "path:target_moved",
            "path:t2_victim",
            "path:t2_pick_above_target",
        }
        if policy == "arc":
            paths |= {"path:store_miss_b1", "path:store_target_moved"}
    return paths | ({"path:t1_fallback_pick"} if variant == "t1_fallback" else set())


# ----------------------------------------------------------------------------- impl vs spec
@pytest.mark.parametrize(("policy", "variant"), CASES)
def test_impl_agrees_with_spec_under_the_lockstep_machine(policy: str, variant: str) -> None:
    result = check(ImplManager, "impl", profiles.get("ci"), policy=policy, variant=variant)
    assert result.passed, result.failure
    rules = {k.removeprefix("rule:") for k in result.coverage if k.startswith("rule:")}
    expected = {op.name for op in OPERATIONS} - ({"touch_ghosts"} if policy == "lru" else set())
    if not has_call(variant, "touch"):  # 0.34 has no touch(): neither rule may be drawn
        expected -= {"touch", "touch_ghosts"}
    assert rules == expected
    missing = required(policy, variant) - {"path:t1_fallback_pick"} - set(result.coverage)
    assert not missing, f"the machine never exercised {missing}"


@pytest.mark.parametrize(("policy", "variant"), CASES)
def test_impl_agrees_with_spec_under_the_fuzzer(policy: str, variant: str) -> None:
    result = fuzz(ImplManager, "impl", 15_000, seed=4, policy=policy, variant=variant)
    assert result.passed, result.failure
    assert result.steps >= 15_000
    missing = required(policy, variant) - set(result.coverage)
    assert not missing, f"the fuzzer never exercised {missing}"


def test_spec_against_itself_passes_with_drawn_variants() -> None:
    for policy in ("arc", "lru"):
        assert fuzz(SpecManager, "spec", 3_000, seed=1, policy=policy).passed


# ----------------------------------------------------------------------------- planted bugs
def test_at_least_eight_offload_mutants_cover_o1_to_o9() -> None:
    assert len(OFFLOAD_MUTANTS) >= 8
    origins = " ".join(CATALOGUE[n].origin for n in OFFLOAD_MUTANTS)
    for tag in ("O1", "O2", "O3", "O4", "O5", "O6", "O8", "O9"):
        assert f"({tag}" in origins, f"no planted bug from {tag}"
    for name in OFFLOAD_MUTANTS:
        m = CATALOGUE[name]
        assert m.variant is None or m.variant in VARIANTS[COMPONENTS[m.component]]
        doc = m.cls.__doc__ or ""
        # an upstream bug (O1..O10), or one planted for an option the base scope leaves off
        upstream = m.origin.startswith("vLLM") and doc.startswith("O")
        assert upstream or (m.origin.startswith("planted (issue 30)") and doc.startswith("Planted"))


@pytest.mark.parametrize("name", OFFLOAD_MUTANTS)
def test_offload_mutant_is_killed_by_the_fuzzer_with_a_short_repro(name: str) -> None:
    m = CATALOGUE[name]
    result = fuzz(m.cls, f"mutant:{name}", 50_000, seed=0, **mutant_options(m))
    assert not result.passed, f"mutant {name} survived 50,000 calls"
    assert result.trace is not None
    short = shrink_trace(result.trace, m.cls, f"mutant:{name}", budget_seconds=5)
    assert len(short["steps"]) <= 15
    assert not replay(short, m.cls, f"mutant:{name}").passed
    assert replay(short, ImplManager, "impl").passed


# No offload mutant survives the ci machine; a survivor would be listed here (strict xfail).
HYPOTHESIS_SURVIVORS: set[str] = set()
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]  # killing is the question, not the repro


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="survives the ci profile"))
        if n in HYPOTHESIS_SURVIVORS
        else n
        for n in OFFLOAD_MUTANTS
    ],
)
def test_offload_mutant_is_killed_by_the_lockstep_machine(name: str) -> None:
    m = CATALOGUE[name]
    result = check(
        m.cls,
        f"mutant:{name}",
        settings(profiles.get("ci"), phases=NO_SHRINK),
        **mutant_options(m),
    )
    assert not result.passed, f"mutant {name} survived the hypothesis machine"


@pytest.mark.parametrize("name", sorted(EQUIVALENT_MUTANTS))
def test_equivalent_mutant_is_not_reported(name: str) -> None:
    """A change proved observably equivalent (docs/vllm.md §2.3) must not be called a bug."""
    m = EQUIVALENT_MUTANTS[name]
    assert name not in CATALOGUE
    for variant in VARIANTS["arc"]:
        result = fuzz(m.cls, f"mutant:{name}", 10_000, seed=2, policy="arc", variant=variant)
        assert result.passed, result.failure


# ----------------------------------------------------------------------------- traces
def test_saved_trace_replays_the_same_failure(tmp_path: Path) -> None:
    name = "arc_missing_t1_fallback"
    m = CATALOGUE[name]
    result = fuzz(m.cls, f"mutant:{name}", 50_000, seed=0, policy="arc", variant=m.variant)
    assert result.trace is not None and result.failure is not None
    assert result.trace["component"] == "vllm-arc"
    assert result.trace["config"]["variant"] == "t1_fallback"
    path = save_trace(result.trace, tmp_path, "offload")
    document = load_trace(path)
    again = replay(document, m.cls, f"mutant:{name}")
    assert not again.passed and again.failure is not None
    assert again.failure.check == result.failure.check
    assert again.steps == len(document["steps"])
    assert replay(document, ImplManager, "impl").passed


# ----------------------------------------------------------------------------- CLI
def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "--json"])
    out, _ = capsys.readouterr()
    document = json.loads(out)
    assert isinstance(document, dict)
    return rc, document


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvspec: "), err
    return lines[0]


@pytest.fixture
def small_ci_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's ``ci`` profile with fewer programs: this file tests the command, not the impl."""
    small = settings(
        max_examples=30, deadline=None, database=None, phases=NO_SHRINK, derandomize=True
    )
    monkeypatch.setattr(profiles, "get", lambda name: small)


def test_cli_check_arc_with_t1_fallback(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    small_ci_profile: None,
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "check", "vllm-arc", "--variant", "t1_fallback")
    assert rc == 0, doc["counterexample"]
    assert doc["component"] == "vllm-arc" and doc["target"] == "impl"
    assert doc["passed"] is True and doc["counterexample"] is None
    assert doc["examples"] > 0 and doc["steps"] > 0


def test_cli_fuzz_lru_v1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(
        capsys, "fuzz", "vllm-lru", "--variant", "v1", "--ops", "2000", "--seed", "0"
    )
    assert rc == 0
    assert doc.keys() >= {"component", "target", "ops", "seconds", "ops_per_second", "divergences"}
    assert doc["component"] == "vllm-lru" and doc["ops"] == 2000 and doc["divergences"] == 0
    assert not (tmp_path / ".kvspec").exists()


def test_cli_mutant_target_fails_and_its_trace_replays(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    target = "mutant:lru_missing_mark_non_evictable"
    rc, doc = run_json(capsys, "fuzz", "vllm-lru", "--target", target, "--ops", "20000")
    assert rc == 1 and doc["divergences"] == 1
    cx = doc["counterexample"]
    assert cx["check"] == "lru_order_consistent" and cx["steps"]
    rc, replayed = run_json(capsys, "replay", cx["trace_file"])
    assert rc == 1 and replayed["counterexample"]["check"] == cx["check"]
    rc, replayed = run_json(capsys, "replay", cx["trace_file"], "--target", "impl")
    assert rc == 0 and replayed["passed"] is True


def test_cli_check_mutant_target_exits_1(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    small_ci_profile: None,
) -> None:
    monkeypatch.chdir(tmp_path)
    target = "mutant:store_protects_nothing"
    rc, doc = run_json(capsys, "check", "vllm-arc", "--target", target, "--shrink-seconds", "2")
    assert rc == 1 and doc["passed"] is False
    assert doc["counterexample"]["check"] == "no_live_eviction"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("check", "vllm-arc", "--variant", "v1"), "unknown vllm-arc variant 'v1'"),
        (("fuzz", "vllm-lru", "--variant", "t1_fallback"), "unknown vllm-lru variant"),
        (("fuzz", "vllm-lru", "--soundness"), "--soundness applies to infinilm-scheduler"),
        (("check", "vllm-lru", "--target", "mutant:store_protects_nothing"), "no mutant"),
    ],
)
def test_cli_bad_offload_arguments_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    assert message in one_line_error(capsys, *argv)


# ----------------------------------------------------------------------------- --target vllm
def test_target_vllm_without_vllm_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # vllm not importable, even where installed
    for component in COMPONENTS:
        line = one_line_error(capsys, "check", component, "--target", "vllm")
        assert "--target vllm needs an importable vllm.v1.kv_offload.cpu.manager" in line


class _UpstreamShaped(ImplManager):
    """A stand-in with upstream's shape: its constructor (``cache_policy_module_path``, no kvspec
    variant keywords) and a required positional ``req_context``."""

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
    ) -> None:
        assert cache_policy_module_path is None
        super().__init__(num_blocks, cache_policy, enable_events, store_threshold, max_tracker_size)  # type: ignore[arg-type]

    def lookup(self, key: Key, req_context: object) -> Any:  # type: ignore[override]
        return super().lookup(key, req_context)

    def prepare_load(self, keys: Collection[Key], req_context: object) -> Any:  # type: ignore[override]
        return super().prepare_load(keys, req_context)

    def complete_load(self, keys: Collection[Key], req_context: object) -> None:  # type: ignore[override]
        super().complete_load(keys, req_context)

    def touch(self, keys: Collection[Key], req_context: object) -> None:  # type: ignore[override]
        super().touch(keys, req_context)

    def prepare_store(self, keys: Collection[Key], req_context: object) -> Any:  # type: ignore[override]
        return super().prepare_store(keys, req_context)

    def complete_store(  # type: ignore[override]
        self, keys: Collection[Key], req_context: object, success: bool = True
    ) -> None:
        super().complete_store(keys, req_context, success)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm.v1.kv_offload.cpu.manager`` importable, holding :class:`_UpstreamShaped`."""
    names = ["vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType("vllm.v1.kv_offload.cpu.manager")
    module.CPUOffloadingManager = _UpstreamShaped  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    version = types.ModuleType("vllm._version")
    version.version = "0.28.0"  # type: ignore[attr-defined]  # the stand-in behaves as 0.28
    monkeypatch.setitem(sys.modules, version.__name__, version)


def test_target_vllm_goes_through_the_adapter(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fake_vllm: None,
) -> None:
    monkeypatch.chdir(tmp_path)
    for component, variant in (("vllm-lru", "v2"), ("vllm-arc", "no_fallback")):
        rc, doc = run_json(
            capsys, "fuzz", component, "--target", "vllm", "--variant", variant, "--ops", "3000"
        )
        assert rc == 0, doc["counterexample"]
        assert doc["target"] == "vllm"
    # upstream's version decides the variant: one without the #55461 fallback diverges from it
    rc, doc = run_json(
        capsys, "fuzz", "vllm-arc", "--target", "vllm", "--variant", "t1_fallback", "--no-shrink"
    )
    assert rc == 1 and doc["counterexample"]["check"] == "return_value"


# ----------------------------------------------------------------------------- spec vs impl at every capacity
# spec vs impl through the offload components' own checker (equal results, exception kinds and
# snapshots after every call; invariants; atomic failures), at capacities 1..6 in every variant.
LOCKSTEP_PATHS = {
    "path:eviction",
    "path:failed_eviction",
    "path:guard_fast_fail",
    "raise:prepare_store:InvalidArgument",
    "raise:prepare_load:OffloadStateError",
    "raise:complete_load:OffloadStateError",
}


@pytest.mark.parametrize(
    ("component", "variant"),
    [
        ("vllm-arc", "no_fallback"),
        ("vllm-arc", "t1_fallback"),
        ("vllm-lru", "v1"),
        ("vllm-lru", "v2"),
    ],
)
def test_seeded_lockstep_spec_vs_impl(component: str, variant: str) -> None:
    comp = components.get(component)
    coverage: Counter[str] = Counter()
    for capacity in range(1, 7):
        for threshold in (1, 2):
            config = {"num_blocks": capacity, "num_keys": 2 * capacity + 3}
            config |= {"store_threshold": threshold, "max_tracker_size": 2 * capacity + 2}
            example = Example(capacity * 10 + threshold, steps=2_000, config=config)
            result = comp.run_example(ImplManager, "impl", example, variant=variant)
            assert result.passed, result.failure
            coverage.update(result.coverage)
    wanted = LOCKSTEP_PATHS | ({"path:ghost_hit_b1"} if component == "vllm-arc" else set())
    wanted |= {"path:t1_fallback_pick"} if variant == "t1_fallback" else set()
    assert wanted <= set(coverage), wanted - set(coverage)


def test_t1_fallback_only_ever_turns_a_failed_store_into_a_success() -> None:
    """#55461 (§2.3 facts): a ``prepare_store`` that the fallback variant answers differently from
    the same state without the fallback is one that failed without it."""
    seen = Counter()

    class ShadowDriver(vllm_offload.Driver):
        def call(self, method: str, *args: Any) -> Any:
            shadow_out = None
            if method == "prepare_store":
                shadow = copy.deepcopy(self.spec_h)
                shadow.m._policy.t1_fallback = False
                shadow_out = invoke(shadow, method, args)
            out = super().call(method, *args)
            if shadow_out is not None and shadow_out.describe() != out.describe():
                assert shadow_out.raised is None and shadow_out.returned is None, out.describe()
                seen["changed"] += 1
            return out

    shadowed = replace(vllm_offload.CHECKER, driver=lambda t, c, o, r: ShadowDriver(t, c))
    result = checker.fuzz(
        "vllm-arc",
        shadowed,
        SpecManager,
        "spec",
        40_000,
        3,
        variant="t1_fallback",
        options={"policy": "arc"},
    )
    assert result.passed, result.failure
    assert seen["changed"] > 0
