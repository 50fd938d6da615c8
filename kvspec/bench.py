"""The one bench harness: baseline (the spec = legacy algorithm) and impl, same fixture, interleaved.

Ratios, not absolute times, are the result (``ratio = baseline / impl``): the machines here are
shared and noisy, so both sides are measured in the same run, round by round, and the median of
each side is compared. Only the operation itself is timed; fixtures are built and restored outside
the timing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from spec.infinilm.block_manager import BlockManager as SpecBlockManager

# The fixture of InfiniLM PR #578: (pages, unreferenced, requested). The PR measured 19x, 315x,
# 33x, 137x, 1.0x and 0.92x on these; kvspec's goals are in GOALS.
RECLAIM_CASES = [
    (512, 256, 1),
    (8192, 4096, 1),
    (8192, 4096, 16),
    (32768, 16384, 16),
    (8192, 0, 1),
    (8192, 4096, 8192),
]
RECLAIM_GOALS = {
    (512, 256, 1): 19.0,
    (8192, 4096, 1): 315.0,
    (8192, 4096, 16): 33.0,
    (32768, 16384, 16): 137.0,
    (8192, 0, 1): 50.0,
    (8192, 4096, 8192): 1.0,
}
USABLE_CASES = [512, 8192, 32768]
HASHES = [bytes([i + 1]) * 16 for i in range(3)]  # three repeating hashes: duplicate-hash pages
SUITES = ("reclaim", "usable")


@dataclass
class Row:
    case: dict[str, Any]
    baseline_us: float
    impl_us: float
    goal: float | None = None

    @property
    def ratio(self) -> float:
        return self.baseline_us / self.impl_us if self.impl_us > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "case": self.case,
            "baseline_us": round(self.baseline_us, 3),
            "impl_us": round(self.impl_us, 3),
            "ratio": round(self.ratio, 2),
        }
        if self.goal is not None:
            out["goal"] = self.goal
            out["meets_goal"] = self.ratio >= self.goal
        return out


def _reclaim_fixture(cls: Callable[[int, int], Any], pages: int, unreferenced: int) -> Any:
    """Pool fully allocated; the first ``unreferenced`` pages released and indexed (3 hashes)."""
    bm = cls(pages, 1)
    table, _ = bm.allocate_slots(pages)
    head = table[:unreferenced]
    bm.publish_computed_blocks(head, [HASHES[p % 3] for p in head], 0, len(head))
    bm.free_blocks(head)
    return bm


def _restore(bm: Any) -> None:
    """Take every reclaimed page back, re-publish it under its hash and release it (untimed)."""
    n = len(bm.free_block_ids)
    if n:
        table, _ = bm.allocate_slots(n)
        bm.publish_computed_blocks(table, [HASHES[p % 3] for p in table], 0, n)
        bm.free_blocks(table)


def _interleaved(
    rounds: int,
    sides: dict[str, Any],
    method: str,
    args: tuple[Any, ...],
    restore: Callable[[Any], None],
    calls: int = 1,
) -> dict[str, float]:
    """Median microseconds per call of ``method(*args)``; the sides alternate within every round.

    The bound method is looked up before the clock starts, so only the call itself is timed.
    """
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            fn = getattr(sides[name], method)
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn(*args)
            samples[name].append((time.perf_counter_ns() - t0) / 1000 / calls)
            restore(sides[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_reclaim(rounds: int, quick: bool = False) -> Iterator[Row]:
    cases = RECLAIM_CASES if not quick else [c for c in RECLAIM_CASES if c[0] <= 8192]
    for pages, unreferenced, requested in cases:
        sides = {
            "baseline": _reclaim_fixture(SpecBlockManager, pages, unreferenced),
            "impl": _reclaim_fixture(ImplBlockManager, pages, unreferenced),
        }
        med = _interleaved(rounds, sides, "try_free_blocks", (requested,), _restore)
        yield Row(
            {"pages": pages, "unreferenced": unreferenced, "requested": requested},
            med["baseline"],
            med["impl"],
            RECLAIM_GOALS[(pages, unreferenced, requested)],
        )


def bench_usable(rounds: int, quick: bool = False, calls: int = 20) -> Iterator[Row]:
    for pages in USABLE_CASES if not quick else USABLE_CASES[:2]:
        sides = {
            "baseline": _reclaim_fixture(SpecBlockManager, pages, pages // 2),
            "impl": _reclaim_fixture(ImplBlockManager, pages, pages // 2),
        }
        med = _interleaved(rounds, sides, "get_total_usable_blocks", (), lambda bm: None, calls)
        yield Row({"pages": pages, "unreferenced": pages // 2}, med["baseline"], med["impl"])


def run_suite(suite: str, *, quick: bool = False, rounds: int | None = None) -> list[Row]:
    """All rows of ``suite`` (``reclaim`` or ``usable``); at least 7 rounds."""
    n = max(7, rounds if rounds is not None else (7 if quick else 21))
    if suite == "reclaim":
        return list(bench_reclaim(n, quick))
    if suite == "usable":
        return list(bench_usable(n, quick))
    raise ValueError(f"unknown bench suite {suite!r}; choose one of {', '.join(SUITES)}")
