"""``kvspec verify``: every stage that exists, on embedded defaults.

Stages: lockstep hypothesis machines (impl vs spec, ``ci`` profile) and seeded fuzzers for the
block manager, the scheduler (three variants) and the offload manager (ARC and LRU, two variants
each); the kill matrix's fuzzer column (every planted bug must die); admission soundness and the
kept counterexamples; the admission predictor on the example manifest; the exhaustive explorer on
small complete scopes; the z3 theorems; a quick CrossHair subset; the tiny CPU GPU-smoke; quick
side-by-side benches (ratios, reported, never asserted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

COMPONENT = "infinilm-block-manager"
COMPONENTS = ("infinilm-block-manager", "infinilm-scheduler", "vllm-arc", "vllm-lru")


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


def _mutants(components: tuple[str, ...], budget: float) -> Callable[[], tuple[str, str]]:
    """The kill matrix's fuzzer column: every planted bug of these components must die."""

    def body() -> tuple[str, str]:
        from kvspec import mutants

        rows = mutants.run_matrix(mutants.select(None, components), ["fuzzer"], budget)
        s = mutants.summary(rows)
        if s["survivors"]:
            return "fail", f"{s['killed']} killed; survived: {', '.join(s['survivors'])}"
        return "pass", (
            f"all {s['killed']} planted bugs killed by the fuzzer (median "
            f"{s['median_seconds_to_kill']} s; {s['repro_at_most_6_steps']} repros ≤ 6 steps)"
        )

    return body


def _offload_check() -> tuple[str, str]:
    from hypothesis import settings

    from impl.vllm.offload_manager import CPUOffloadingManager
    from stateful_tests import profiles
    from stateful_tests.profiles import shrink_budget
    from stateful_tests.vllm_offload import VARIANTS, check

    parts = []
    for policy, variants in VARIANTS.items():
        for variant in variants:
            with shrink_budget(30):
                r = check(
                    CPUOffloadingManager,
                    "impl",
                    settings(profiles.get("ci"), max_examples=60),
                    policy=policy,
                    variant=variant,
                )
            if not r.passed:
                return "fail", f"{policy} {variant}: {r.failure.check}: {r.failure.detail}" if (
                    r.failure
                ) else f"{policy} {variant}"
            parts.append(f"{policy} {variant} {r.examples}/{r.steps:,}")

    return "pass", "programs/calls: " + "; ".join(parts)


def _offload_fuzz(ops: int) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from impl.vllm.offload_manager import CPUOffloadingManager
        from stateful_tests.vllm_offload import VARIANTS, fuzz

        parts = []
        for policy, variants in VARIANTS.items():
            for variant in variants:
                r = fuzz(CPUOffloadingManager, "impl", ops, 0, policy=policy, variant=variant)
                if not r.passed:
                    detail = f"{r.failure.check}: {r.failure.detail}" if r.failure else ""
                    return "fail", f"{policy} {variant}: {detail}"
                parts.append(f"{policy} {variant} {r.steps:,} ({r.steps / r.seconds:,.0f}/s)")
        return "pass", "; ".join(parts)

    return body


def _scheduler_check() -> tuple[str, str]:
    from hypothesis import settings

    from impl.infinilm.scheduler import Scheduler
    from spec.infinilm.scheduler import RESERVATIONS
    from stateful_tests import profiles
    from stateful_tests.infinilm_scheduler import check
    from stateful_tests.profiles import shrink_budget

    parts = []
    for variant in RESERVATIONS:
        with shrink_budget(30):
            r = check(
                Scheduler,
                "impl",
                settings(profiles.get("ci"), max_examples=60),
                reservation=variant,
            )
        if not r.passed:
            return (
                "fail",
                f"{variant}: {r.failure.check}: {r.failure.detail}" if r.failure else variant,
            )
        parts.append(f"{variant} {r.examples} programs/{r.steps:,} events")
    return "pass", "; ".join(parts)


def _scheduler_fuzz(events: int) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from impl.infinilm.scheduler import Scheduler
        from spec.infinilm.scheduler import RESERVATIONS
        from stateful_tests.infinilm_scheduler import fuzz

        parts = []
        for variant in RESERVATIONS:
            r = fuzz(Scheduler, "impl", events, seed=0, reservation=variant)
            if not r.passed:
                return (
                    "fail",
                    f"{variant}: {r.failure.check}: {r.failure.detail}" if r.failure else variant,
                )
            parts.append(f"{variant} {r.steps:,} events ({r.steps / r.seconds:,.0f}/s)")
        return "pass", "; ".join(parts)

    return body


def _soundness(events: int) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from pathlib import Path

        from spec.infinilm.scheduler import RESERVATIONS
        from spec.infinilm.scheduler import Scheduler as Spec
        from stateful_tests.infinilm_scheduler import fuzz, replay
        from stateful_tests.lockstep import load_trace

        folder = Path(__file__).resolve().parent.parent / "stateful_tests" / "counterexamples"
        parts = []
        for variant in RESERVATIONS:
            r = fuzz(
                Spec,
                "spec",
                events,
                seed=0,
                reservation=variant,
                soundness=True,
                speculation=False,
                connector=False,
            )
            if not r.passed:
                return (
                    "fail",
                    f"{variant} unsound without a connector: {r.failure.detail}"
                    if r.failure
                    else variant,
                )
            trace = load_trace(folder / f"admission_soundness_{variant}.json")
            again = replay(trace, Spec, "spec", soundness=True)
            if again.passed:
                return "fail", f"{variant}: the kept PD counterexample no longer fails"
            parts.append(
                f"{variant}: sound without PD in {events:,} events, "
                f"{len(trace['steps'])}-event PD counterexample"
            )
        return "pass", "; ".join(parts)

    return body


def _admission() -> tuple[str, str]:
    from pathlib import Path

    from kvspec.admission import load_manifest, predict

    manifest = Path(__file__).resolve().parent.parent / "examples" / "admission_manifest.json"
    result = predict(load_manifest(manifest))
    admitted = {v: d["admitted"] for v, d in result.items()}
    return "pass", "example manifest, wave-2 admitted: " + ", ".join(
        f"{v} {n}" for v, n in admitted.items()
    )


# the case fields a bench summary names (default: every integer field)
_SUMMARY_KEYS = {"arc": ("num_blocks", "evicted"), "lru": ("variant", "num_blocks", "evicted")}


def _bench(suite: str) -> Callable[[], tuple[str, str]]:
    def body() -> tuple[str, str]:
        from kvspec.bench import run_suite

        rows = run_suite(suite, quick=True)
        keys = _SUMMARY_KEYS.get(suite)
        parts = [
            "/".join(
                str(v)
                for k, v in r.case.items()
                if (k in keys if keys else isinstance(v, int) and k != "pr_ratio")
            )
            + f": {r.ratio:,.1f}×"
            + ("" if r.goal is None or r.ratio >= r.goal else f" (goal {r.goal:g}×)")
            for r in rows
        ]
        return "pass", "; ".join(parts)

    return body


def _explore() -> tuple[str, str]:
    from kvspec import explore

    return explore.verify_stage()


def _prove() -> tuple[str, str]:
    from kvspec import prove

    return prove.verify_stage()


def _crosshair() -> tuple[str, str]:
    from kvspec import crosshair

    return crosshair.verify_stage()


def _smoke() -> tuple[str, str]:
    from kvspec import smoke

    return smoke.verify_stage()


def run_all(*, quick: bool, show_progress: bool, console: Console) -> list[Stage]:
    plan: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        (f"check {COMPONENT} (impl, ci profile)", _check),
        (f"fuzz {COMPONENT} (impl, seed 0)", _fuzz(50_000 if quick else 300_000)),
        ("check infinilm-scheduler (impl, 3 variants)", _scheduler_check),
        ("fuzz infinilm-scheduler (impl, 3 variants)", _scheduler_fuzz(5_000 if quick else 30_000)),
        ("check vllm-arc/vllm-lru (impl, 4 variants)", _offload_check),
        ("fuzz vllm-arc/vllm-lru (impl, 4 variants)", _offload_fuzz(5_000 if quick else 30_000)),
        (
            "planted bugs (kill matrix, fuzzer column)",
            _mutants(tuple(COMPONENTS), 10.0 if quick else 30.0),
        ),
        ("admission soundness (spec)", _soundness(5_000 if quick else 30_000)),
        ("admission predictor (example manifest)", _admission),
        ("exhaustive explorer (small scopes)", _explore),
        ("z3 theorems (kvspec prove)", _prove),
        ("crosshair (quick subset)", _crosshair),
        ("gpu smoke (tiny, CPU)", _smoke),
        ("bench reclaim (quick)", _bench("reclaim")),
        ("bench usable (quick)", _bench("usable")),
        ("bench schedule (quick)", _bench("schedule")),
        ("bench capacity (quick)", _bench("capacity")),
        ("bench admission (quick)", _bench("admission")),
        ("bench arc (quick)", _bench("arc")),
        ("bench lru (quick)", _bench("lru")),
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
