"""Seeded differential oracles for generic mutation testing (``kvspec mutants --generic``).

Not collected by the default test run (the file name does not match ``test_*.py``);
``modules.toml`` names these tests, after each component's unit tests, as the oracle that a
cosmic-ray mutant of ``impl/`` must make fail. Each test drives the spec and the *impl* (imported
from the mutated copy: PYTHONPATH points there) in lockstep with the seeded fuzzer, so a kill means
"a lockstep check or an invariant caught the mutant", exactly the checks kvspec ships.

``KVSPEC_GM_OPS`` scales the volume (default 1.0; 0.1 for a quick smoke run).
"""

from __future__ import annotations

import os

import pytest

SCALE = float(os.environ.get("KVSPEC_GM_OPS", "1.0"))


def _ops(n: int) -> int:
    return max(200, int(n * SCALE))


# ----------------------------------------------------------------------------- infinilm
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_block_manager_lockstep(seed: int) -> None:
    from impl.infinilm.block_manager import BlockManager
    from kvspec import components

    result = components.get("infinilm-block-manager").fuzz(BlockManager, "impl", _ops(20_000), seed)
    assert result.passed, result.failure


@pytest.mark.parametrize("reservation", ["legacy", "exact", "tight"])
@pytest.mark.parametrize("seed", [1, 2])
def test_scheduler_lockstep(reservation: str, seed: int) -> None:
    from impl.infinilm.scheduler import Scheduler
    from kvspec import components

    result = components.get("infinilm-scheduler").fuzz(
        Scheduler, "impl", _ops(4_000), seed, variant=reservation
    )
    assert result.passed, result.failure


# ----------------------------------------------------------------------------- vllm
@pytest.mark.parametrize("policy", ["arc", "lru"])
@pytest.mark.parametrize("seed", [1, 2])
def test_offload_lockstep(policy: str, seed: int) -> None:
    from impl.vllm.offload_manager import CPUOffloadingManager
    from kvspec import components

    result = components.get(f"vllm-{policy}").fuzz(CPUOffloadingManager, "impl", _ops(6_000), seed)
    assert result.passed, result.failure


@pytest.mark.parametrize("variant", ["unhashed_first", "classic"])
@pytest.mark.parametrize("seed", [1, 2])
def test_prefix_cache_lockstep(variant: str, seed: int) -> None:
    from impl.vllm.kv_cache_manager import KVCacheManager
    from kvspec import components

    result = components.get("vllm-prefix-cache").fuzz(
        KVCacheManager, "impl", _ops(6_000), seed, variant=variant
    )
    assert result.passed, result.failure


@pytest.mark.parametrize("variant", ["lru", "fifo", "mru"])
@pytest.mark.parametrize("seed", [1, 2])
def test_radix_cache_lockstep(variant: str, seed: int) -> None:
    from impl.sglang.radix_cache import RadixCache
    from kvspec import components

    result = components.get("sglang-radix-cache").fuzz(
        RadixCache, "impl", _ops(6_000), seed, variant=variant
    )
    assert result.passed, result.failure
