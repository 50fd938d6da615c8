"""Seeded differential oracles for generic mutation testing (``kvspec mutants --generic``).

Not collected by the default test run (the file name does not match ``test_*.py``);
``modules.toml`` names these tests, after each component's unit tests, as the oracle that a
cosmic-ray mutant of ``impl/`` must make fail. Each test drives the spec and the *impl* (imported
from the mutated copy: PYTHONPATH points there) in lockstep with the seeded fuzzer, so a kill means
"a lockstep check or an invariant caught the mutant", exactly the checks kvspec ships.

``KVSPEC_GM_OPS`` scales the volume (default 1.0; 0.1 for a quick smoke run).

The oracle sits in ``stateful_tests`` and so may not import ``kvspec`` (the layers point down):
each test names its component's checker definition and fixed options itself, the record the
registry (``kvspec.components``) holds; tests/test_architecture.py checks that the two agree.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from stateful_tests import (
    checker,
    infinilm_block_manager,
    infinilm_scheduler,
    sglang_radix_cache,
    vllm_offload,
    vllm_prefix_cache,
)
from stateful_tests.lockstep import RunResult

SCALE = float(os.environ.get("KVSPEC_GM_OPS", "1.0"))


def _ops(n: int) -> int:
    return max(200, int(n * SCALE))


# component -> (its checker definition, the options its every run takes): the registry's record
COMPONENTS: dict[str, tuple[checker.CheckerDef, dict[str, Any]]] = {
    "infinilm-block-manager": (infinilm_block_manager.CHECKER, {}),
    "infinilm-scheduler": (infinilm_scheduler.CHECKER, {}),
    "vllm-arc": (vllm_offload.CHECKER, {"policy": "arc"}),
    "vllm-lru": (vllm_offload.CHECKER, {"policy": "lru"}),
    "vllm-prefix-cache": (vllm_prefix_cache.CHECKER, {}),
    "sglang-radix-cache": (sglang_radix_cache.CHECKER, {}),
}


def fuzz(
    component: str, target_cls: Any, ops: int, seed: int, variant: str | None = None
) -> RunResult:
    """The component's seeded lockstep fuzzer, spec against ``target_cls`` (the impl)."""
    definition, options = COMPONENTS[component]
    return checker.fuzz(
        component, definition, target_cls, "impl", ops, seed, variant=variant, options=options
    )


# ----------------------------------------------------------------------------- infinilm
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_block_manager_lockstep(seed: int) -> None:
    from impl.infinilm.block_manager import BlockManager

    result = fuzz("infinilm-block-manager", BlockManager, _ops(20_000), seed)
    assert result.passed, result.failure


@pytest.mark.parametrize("reservation", ["legacy", "exact", "tight"])
@pytest.mark.parametrize("seed", [1, 2])
def test_scheduler_lockstep(reservation: str, seed: int) -> None:
    from impl.infinilm.scheduler import Scheduler

    result = fuzz("infinilm-scheduler", Scheduler, _ops(4_000), seed, variant=reservation)
    assert result.passed, result.failure


# ----------------------------------------------------------------------------- vllm
@pytest.mark.parametrize("policy", ["arc", "lru"])
@pytest.mark.parametrize("seed", [1, 2])
def test_offload_lockstep(policy: str, seed: int) -> None:
    from impl.vllm.offload_manager import CPUOffloadingManager

    result = fuzz(f"vllm-{policy}", CPUOffloadingManager, _ops(6_000), seed)
    assert result.passed, result.failure


@pytest.mark.parametrize("variant", ["unhashed_first", "classic"])
@pytest.mark.parametrize("seed", [1, 2])
def test_prefix_cache_lockstep(variant: str, seed: int) -> None:
    from impl.vllm.kv_cache_manager import KVCacheManager

    result = fuzz("vllm-prefix-cache", KVCacheManager, _ops(6_000), seed, variant=variant)
    assert result.passed, result.failure


@pytest.mark.parametrize("variant", ["lru", "fifo", "mru"])
@pytest.mark.parametrize("seed", [1, 2])
def test_radix_cache_lockstep(variant: str, seed: int) -> None:
    from impl.sglang.radix_cache import RadixCache

    result = fuzz("sglang-radix-cache", RadixCache, _ops(6_000), seed, variant=variant)
    assert result.passed, result.failure
