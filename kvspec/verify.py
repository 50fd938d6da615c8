"""``kvspec verify``: every stage that exists, on embedded defaults.

Stages (later components and layers add theirs here):
1. lockstep hypothesis machine, impl vs spec, ``ci`` profile;
2. seeded differential fuzzer, impl vs spec;
3. planted bugs: every block-manager mutant must diverge under the fuzzer;
4. quick side-by-side benches (ratios, reported, never asserted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

COMPONENT = "infinilm-block-manager"


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | skip
    seconds: float
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "summary": self.summary,
        }


def _timed(name: str, body: Callable[[], tuple[str, str]]) -> Stage:
    started = time.perf_counter()
    try:
        status, summary = body()
    except Exception as exc:  # a stage that crashes is a failed stage, reported, not a traceback
        status, summary = "fail", f"crashed: {type(exc).__name__}: {exc}"
    return Stage(name, status, time.perf_counter() - started, summary)


def _check() -> tuple[str, str]:
    from impl.infinilm.block_manager import BlockManager
    from stateful_tests import profiles
    from stateful_tests.infinilm_block_manager import check
    from stateful_tests.profiles import shrink_budget

    with shrink_budget(30):
        r = check(BlockManager, "impl", profiles.get("ci"))
    rules = sum(1 for k in r.coverage if k.startswith("rule:"))
    if r.passed:
        return "pass", f"{r.examples} programs, {r.steps:,} calls, {rules} rules exercised"
    return "fail", f"{r.failure.check}: {r.failure.detail}" if r.failure else "failed"


def _fuzz(ops: int) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from impl.infinilm.block_manager import BlockManager
        from stateful_tests.infinilm_block_manager import fuzz

        r = fuzz(BlockManager, "impl", ops, seed=0)
        rate = r.steps / r.seconds if r.seconds else 0.0
        paths = sorted(k.removeprefix("path:") for k in r.coverage if k.startswith("path:"))
        if r.passed:
            return "pass", f"{r.steps:,} ops at {rate:,.0f} ops/s; paths: {', '.join(paths)}"
        return "fail", f"{r.failure.check}: {r.failure.detail}" if r.failure else "failed"

    return body


def _mutants(ops: int) -> tuple[str, str]:
    from stateful_tests.infinilm_block_manager import fuzz
    from stateful_tests.mutants import CATALOGUE

    survivors = []
    killed = 0
    for name, m in CATALOGUE.items():
        if m.component != COMPONENT:
            continue
        if fuzz(m.cls, f"mutant:{name}", ops, seed=0).passed:
            survivors.append(name)
        else:
            killed += 1
    if survivors:
        return "fail", f"{killed} killed; survived: {', '.join(survivors)}"
    return "pass", f"all {killed} planted bugs killed by the fuzzer"


def _bench(suite: str) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from kvspec.bench import run_suite

        rows = run_suite(suite, quick=True)
        parts = [
            f"{'/'.join(str(v) for v in r.case.values())}: {r.ratio:,.1f}×"
            + ("" if r.goal is None or r.ratio >= r.goal else f" (goal {r.goal:g}×)")
            for r in rows
        ]
        return "pass", "; ".join(parts)

    return body


def run_all(*, quick: bool, show_progress: bool, console: Console) -> list[Stage]:
    plan: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        (f"check {COMPONENT} (impl, ci profile)", _check),
        (f"fuzz {COMPONENT} (impl, seed 0)", _fuzz(50_000 if quick else 300_000)),
        (f"planted bugs {COMPONENT}", lambda: _mutants(5_000 if quick else 20_000)),
        ("bench reclaim (quick)", _bench("reclaim")),
        ("bench usable (quick)", _bench("usable")),
    ]
    stages = []
    for i, (name, body) in enumerate(plan, 1):
        if show_progress:
            console.print(f"[{i}/{len(plan)}] {name} …")
        stage = _timed(name, body)
        if show_progress:
            console.print(f"      {stage.status} in {stage.seconds:.1f}s")
        stages.append(stage)
    return stages
