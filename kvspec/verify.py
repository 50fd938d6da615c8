"""``kvspec verify``: every stage that exists, on embedded defaults.

Stages, read from the component registry: for every component the lockstep hypothesis machine
(impl vs spec, ``ci`` profile, every variant) and the seeded fuzzer (every variant); the kill
matrix's fuzzer column (every planted bug must die); each component's own extra stages (e.g. the
scheduler's admission soundness and admission predictor); the exhaustive explorer on small
complete scopes; the z3 theorems; a quick CrossHair subset; the tiny CPU GPU-smoke; every
component's bench suites, quick (side-by-side ratios, reported, never asserted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from kvspec import components
from kvspec.components import Component, resolve

StageBody = Callable[[], tuple[str, str]]


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


def _timed(name: str, body: StageBody) -> Stage:
    started = time.perf_counter()
    try:
        status, summary = body()
    except Exception as exc:  # a stage that crashes is a failed stage, reported, not a traceback
        status, summary = "fail", f"crashed: {type(exc).__name__}: {exc}"
    return Stage(name, status, time.perf_counter() - started, summary)


def _per_variant(
    comp: Component, run: Callable[[Any, str, str | None], Any], describe: Callable[[Any], str]
) -> StageBody:
    """A stage running ``run(impl class, label, variant)`` once per variant (or once), failing at
    the first failed run; the summary is ``describe(result)`` per variant."""

    def body() -> tuple[str, str]:
        from kvspec.targets import load_target

        label, cls = load_target(comp.name, "impl")
        parts = []
        variants: list[str | None] = [*comp.variants] or [None]
        for variant in variants:
            r = run(cls, label, variant)
            prefix = f"{variant} " if variant else ""
            if not r.passed:
                detail = f"{r.failure.check}: {r.failure.detail}" if r.failure else "failed"
                return "fail", prefix + detail
            parts.append(prefix + describe(r))
        return "pass", "; ".join(parts)

    return body


def _check(comp: Component) -> StageBody:
    """The hypothesis machine (and explicit programs) against the impl, once per variant."""
    from hypothesis import settings

    from stateful_tests import profiles
    from stateful_tests.profiles import shrink_budget

    base = profiles.get("ci")
    n = comp.verify.check_examples
    chosen = base if n is None else settings(base, max_examples=n)

    def run(cls: Any, label: str, variant: str | None) -> Any:
        with shrink_budget(30):
            return comp.check(cls, label, chosen, variant=variant)

    def describe(r: Any) -> str:
        rules = sum(1 for k in r.coverage if k.startswith("rule:"))
        return f"{r.examples} programs/{r.steps:,} calls/{rules} rules"

    return _per_variant(comp, run, describe)


def _fuzz(comp: Component, quick: bool) -> StageBody:
    """The seeded fuzzer against the impl, once per variant (seed 0)."""
    ops = comp.verify.fuzz_ops[0 if quick else 1]

    def describe(r: Any) -> str:
        rate = r.steps / r.seconds if r.seconds else 0.0
        paths = sum(1 for k in r.coverage if k.startswith("path:"))
        return f"{r.steps:,} calls at {rate:,.0f}/s, {paths} paths"

    return _per_variant(
        comp, lambda cls, label, v: comp.fuzz(cls, label, ops, 0, variant=v), describe
    )


def _mutants(budget: float) -> StageBody:
    """The kill matrix's fuzzer column: every planted bug of every component must die."""

    def body() -> tuple[str, str]:
        from kvspec import kill_matrix

        rows = kill_matrix.run_matrix(kill_matrix.select(None, None), ["fuzzer"], budget)
        s = kill_matrix.summary(rows)
        if s["survivors"]:
            return "fail", f"{s['killed']} killed; survived: {', '.join(s['survivors'])}"
        return "pass", (
            f"all {s['killed']} planted bugs killed by the fuzzer (median "
            f"{s['median_seconds_to_kill']} s; {s['repro_at_most_6_steps']} repros ≤ 6 steps)"
        )

    return body


def _extra(comp: Component, ref: Any, quick: bool) -> StageBody:
    return lambda: resolve(ref)(comp, quick)


def _bench(suite: str) -> StageBody:
    def body() -> tuple[str, str]:
        from kvspec.bench import run_suite, summary_cell

        rows = run_suite(suite, quick=True)
        return "pass", "; ".join(summary_cell(suite, r) for r in rows)

    return body


def _layer(module: str) -> StageBody:
    """A checking layer's own verify stage (``kvspec.MODULE.verify_stage``)."""

    def body() -> tuple[str, str]:
        import importlib

        stage: tuple[str, str] = importlib.import_module(f"kvspec.{module}").verify_stage()
        return stage

    return body


def plan(quick: bool) -> list[tuple[str, StageBody]]:
    """Every stage, in order: (name, body)."""
    stages: list[tuple[str, StageBody]] = []
    every = components.all_components()
    for comp in every:
        n = len(comp.variants)
        which = f", {n} variants" if n else ""
        stages.append((f"check {comp.name} (impl{which})", _check(comp)))
        stages.append((f"fuzz {comp.name} (impl{which})", _fuzz(comp, quick)))
    stages.append(("planted bugs (kill matrix, fuzzer column)", _mutants(10.0 if quick else 30.0)))
    for comp in every:
        stages += [(name, _extra(comp, ref, quick)) for name, ref in comp.verify.stages]
    stages += [
        ("exhaustive explorer (small scopes)", _layer("exploration")),
        ("z3 theorems (kvspec prove)", _layer("prove")),
        ("crosshair (quick subset)", _layer("crosshair")),
        ("gpu smoke (tiny, CPU)", _layer("smoke")),
    ]
    for comp in every:
        stages += [(f"bench {suite} (quick)", _bench(suite)) for suite in comp.bench_suites]
    return stages


def run_all(*, quick: bool, show_progress: bool, console: Console) -> list[Stage]:
    chosen = plan(quick)
    stages = []
    for i, (name, body) in enumerate(chosen, 1):
        if show_progress:
            console.print(f"[{i}/{len(chosen)}] {name} …")
        stage = _timed(name, body)
        if show_progress:
            console.print(f"      {stage.status} in {stage.seconds:.1f}s")
        stages.append(stage)
    return stages
