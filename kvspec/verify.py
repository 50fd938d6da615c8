"""``kvspec verify``: every stage that exists, on embedded defaults.

Stages, read from the component registry: for every component the lockstep hypothesis machine
(impl vs spec, ``ci`` profile, every variant) and the seeded fuzzer (every variant); the kill
matrix's fuzzer column (every planted bug must die); each component's own extra stages (e.g. the
scheduler's admission soundness and admission predictor); the exhaustive explorer on small
complete scopes; the z3 theorems; a CrossHair subset; the tiny CPU GPU-smoke; every component's
bench suites, quick (side-by-side ratios, reported, never asserted).

With ``jobs`` > 1 the checking stages run side by side on forked worker processes (each stage is
independent and deterministic, so the verdicts are those of a serial run), the costliest first;
the bench stages run afterwards, one at a time, with nothing else of kvspec's running, because
their ratios are timings.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
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
    cpu_seconds: float = 0.0  # the stage's process and the subprocesses it waited for

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "summary": self.summary,
        }


def _cpu() -> float:
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(name: str, body: StageBody) -> Stage:
    started, cpu = time.perf_counter(), _cpu()
    try:
        status, summary = body()
    except Exception as exc:  # a stage that crashes is a failed stage, reported, not a traceback
        status, summary = "fail", f"crashed: {type(exc).__name__}: {exc}"
    return Stage(name, status, time.perf_counter() - started, summary, _cpu() - cpu)


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


def _layer(module: str, **options: Any) -> StageBody:
    """A checking layer's own verify stage (``kvspec.MODULE.verify_stage(**options)``)."""

    def body() -> tuple[str, str]:
        import importlib

        layer = importlib.import_module(f"kvspec.{module}")
        stage: tuple[str, str] = layer.verify_stage(**options)
        return stage

    return body


def default_jobs() -> int:
    """The CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not every platform has affinity masks
        return max(1, os.cpu_count() or 1)


def plan(quick: bool, jobs: int = 1) -> list[tuple[str, StageBody]]:
    """Every stage, in order: (name, body). ``jobs``: how many CrossHair runs the CrossHair
    stage may keep going at once."""
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
        (
            f"crosshair ({'smoke' if quick else 'verify'} subset)",
            _layer("crosshair", quick=quick, jobs=jobs),
        ),
        ("gpu smoke (tiny, CPU)", _layer("smoke")),
    ]
    for comp in every:
        stages += [(f"bench {suite} (quick)", _bench(suite)) for suite in comp.bench_suites]
    return stages


def _is_bench(name: str) -> bool:
    return name.startswith("bench ")


# Submission order on a pool: the stages that take longest (measured on the 2-core machine) go
# first, so that the last one to finish starts early.
_COSTLIEST_FIRST = ("crosshair", "exhaustive explorer", "planted bugs", "check ", "z3")


def _rank(name: str) -> int:
    return next((i for i, p in enumerate(_COSTLIEST_FIRST) if name.startswith(p)), 99)


def _run_planned(quick: bool, jobs: int, index: int) -> Stage:
    """Run stage ``index`` of ``plan(quick, jobs)`` (in a pool worker: bodies are closures and do
    not pickle, so the worker rebuilds the plan, which is cheap and deterministic)."""
    name, body = plan(quick, jobs)[index]
    return _timed(name, body)


def run_all(*, quick: bool, show_progress: bool, console: Console, jobs: int = 1) -> list[Stage]:
    """Every stage of ``plan(quick)``, in plan order; ``jobs`` > 1 runs the checking stages on
    that many forked workers (platforms without ``fork`` run serially)."""
    chosen = plan(quick, jobs)
    done: dict[int, Stage] = {}

    def report(index: int, stage: Stage) -> None:
        done[index] = stage
        if show_progress:
            console.print(
                f"[{len(done)}/{len(chosen)}] {stage.name}: {stage.status} in "
                f"{stage.seconds:.1f}s ({stage.cpu_seconds:.1f} CPU-s)"
            )

    pooled = [i for i, (name, _) in enumerate(chosen) if not _is_bench(name)]
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        if show_progress:
            console.print(f"{len(pooled)} checking stages on {jobs} workers …")
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures: dict[Future[Stage], int] = {
                pool.submit(_run_planned, quick, jobs, i): i
                for i in sorted(pooled, key=lambda i: _rank(chosen[i][0]))
            }
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = futures[future]
                    try:
                        stage = future.result()
                    except Exception as exc:  # a worker that died: the stage failed
                        stage = Stage(chosen[index][0], "fail", 0.0, f"crashed: {exc!r}")
                    report(index, stage)
    for i, (name, body) in enumerate(chosen):
        if i not in done:
            if show_progress:
                console.print(f"[{len(done) + 1}/{len(chosen)}] {name} …")
            report(i, _timed(name, body))
    return [done[i] for i in range(len(chosen))]
