"""The block-manager checkers pass on the impl, exercise every rule and path, and bite."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from kvspec import components
from spec.errors import KvspecError, exception_kind
from spec.infinilm.block_manager import BlockManager as SpecBlockManager
from stateful_tests.infinilm_block_manager import OPERATIONS
from stateful_tests.lockstep import load_trace, save_trace
from stateful_tests.profiles import shrink_budget

BM = components.get("infinilm-block-manager")
CATALOGUE = {m.name: m for m in BM.planted}
BLOCK_MANAGER_MUTANTS = sorted(CATALOGUE)
check, fuzz, replay, shrink_trace = BM.check, BM.fuzz, BM.replay, BM.shrink

# Paths a green run must have exercised, or it proves little (eviction, failures, full pools).
REQUIRED_PATHS = {
    "path:eviction",
    "path:quirk_a_evict_one",
    "path:quirk_b_failed_reclaim_evicts",
    "path:allocate_returns_none",
    "path:out_of_blocks",
    "path:pool_full",
    "path:duplicate_hash_pages",
    "path:prefix_hit",
    "path:quiescence_checked",
    "raise:free_blocks:DoubleFreeError",
    "raise:free_blocks:InvalidPageId",
    "raise:truncate_blocks:PageStateError",
    "raise:publish_computed_blocks:RehashError",
    "raise:allocate_slots:InvalidArgument",
    "raise:append_slots:InvalidArgument",
}


def test_lockstep_machine_passes_on_impl_and_exercises_every_rule() -> None:
    result = check(ImplBlockManager, "impl", settings())
    assert result.passed, result.failure
    rules = {k.removeprefix("rule:") for k in result.coverage if k.startswith("rule:")}
    assert rules == {op.name for op in OPERATIONS}
    missing = REQUIRED_PATHS - set(result.coverage)
    assert not missing, f"the machine never exercised {missing}"


def test_fuzzer_runs_a_million_ops_without_divergence() -> None:
    ops = int(os.environ.get("KVSPEC_FUZZ_OPS", "1000000"))
    result = fuzz(ImplBlockManager, "impl", ops, seed=20261130)
    assert result.passed, result.failure
    assert result.steps >= ops
    missing = REQUIRED_PATHS - set(result.coverage)
    assert not missing, f"the fuzzer never exercised {missing}"
    assert not [k for k in result.coverage if k.startswith("path:bad_input_accepted")]


@pytest.mark.parametrize("name", BLOCK_MANAGER_MUTANTS)
def test_mutant_is_killed_by_the_lockstep_machine(name: str) -> None:
    with shrink_budget(5):
        result = check(CATALOGUE[name].cls, f"mutant:{name}", settings())
    assert not result.passed, f"mutant {name} survived the hypothesis lockstep machine"
    assert result.trace is not None and result.trace["steps"]


@pytest.mark.parametrize("name", BLOCK_MANAGER_MUTANTS)
def test_mutant_is_killed_by_the_fuzzer_with_a_short_repro(name: str) -> None:
    mutant = CATALOGUE[name].cls
    result = fuzz(mutant, f"mutant:{name}", 50_000, seed=0)
    assert not result.passed, f"mutant {name} survived 50,000 fuzzed calls"
    assert result.trace is not None
    short = shrink_trace(result.trace, mutant, f"mutant:{name}")
    assert len(short["steps"]) <= 12  # set-order bugs need churn before the order differs
    assert not replay(short, mutant, name).passed
    assert replay(short, ImplBlockManager, "impl").passed


def test_replay_of_a_saved_trace_reproduces_the_failure(tmp_path: Any) -> None:
    mutant = CATALOGUE["lifo_free_list"].cls
    result = fuzz(mutant, "mutant:lifo_free_list", 20_000, seed=1)
    assert result.trace is not None
    path = save_trace(result.trace, tmp_path, "lifo")
    document = load_trace(path)
    again = replay(document, mutant, "mutant:lifo_free_list")
    assert not again.passed and again.failure is not None
    assert again.failure.check == result.failure.check  # type: ignore[union-attr]
    assert replay(document, ImplBlockManager, "impl").passed


class UpstreamStyle(SpecBlockManager):
    """An upstream-like target: same behaviour, but plain builtin exceptions (no kvspec types)."""

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or not callable(attr):
            return attr

        def plain(*args: Any) -> Any:
            try:
                return attr(*args)
            except KvspecError as exc:
                builtin = {
                    "ValueError": ValueError,
                    "IndexError": IndexError,
                    "RuntimeError": RuntimeError,
                    "AssertionError": AssertionError,
                }
                raise builtin[exception_kind(exc)](str(exc)) from None

        return plain


class WrongExceptionKind(ImplBlockManager):
    """Raises RuntimeError where the contract says ValueError (a kind mismatch must be caught)."""

    def try_free_blocks(self, num_required: int) -> bool:
        if num_required < 0:
            raise RuntimeError("negative")
        return super().try_free_blocks(num_required)


def test_targets_are_compared_by_exception_kind() -> None:
    assert fuzz(UpstreamStyle, "upstream-style", 20_000, seed=2).passed
    result = fuzz(WrongExceptionKind, "wrong-kind", 50_000, seed=2)
    assert not result.passed and result.failure is not None
    assert result.failure.check == "exception"
