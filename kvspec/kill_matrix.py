"""``kvspec mutants``: the kill matrix — every checker that applies against every planted bug.

The catalogue is every registered component's planted bugs (``kvspec.components.catalogue()``;
each entry names its upstream origin). A *checker* here is a function ``(mutant, budget_seconds)
-> Attempt``; each runs one layer of kvspec against the mutant under a wall-clock budget:

* ``hypothesis`` — the component's lockstep machine under the ``ci`` profile (derandomized);
* ``fuzzer`` — the seeded differential fuzzer, seed after seed until the budget is spent, then
  the failing episode delta-debugged (the repro length is the shrunk trace's);
* ``explorer`` — the exhaustive small-scope explorer at its default bounds (shortest trace);
* ``crosshair`` — ``crosshair diffbehavior`` between the mutant's kernel and the real one, for
  mutants that plant their bug in a pure kernel.

A kill counts only when it happens within the budget; the time to kill is the checker's own
search time (shrinking excluded where the checker allows telling them apart).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from kvspec import components
from kvspec.output import replace_marked
from stateful_tests.checker import Mutant

README_START = "<!-- kill-matrix:start -->"
README_END = "<!-- kill-matrix:end -->"


@dataclass
class Attempt:
    checker: str
    status: str  # killed | survived | over-budget | n/a | error
    seconds: float | None = None
    repro_steps: int | None = None
    check: str | None = None  # the invariant or comparison that failed

    @property
    def killed(self) -> bool:
        return self.status == "killed"


def options(m: Mutant) -> dict[str, Any]:
    """The checker keyword arguments that put a mutant in the configuration its bug lives in."""
    return components.get(m.component).mutant_options(m)


def run_hypothesis(m: Mutant, budget: float) -> Attempt:
    from hypothesis import settings

    from stateful_tests import profiles
    from stateful_tests.profiles import shrink_budget

    started = time.perf_counter()
    with shrink_budget(max(1.0, budget / 2)), _first_divergence() as first:
        r = components.get(m.component).check(
            m.cls,
            f"mutant:{m.name}",
            settings(profiles.get("ci")),
            inputs=m.inputs,
            **options(m),
        )
    if r.passed:
        return Attempt("hypothesis", "survived", r.seconds)
    # time to the first failing program, not to the end of shrinking
    seconds = (first[0] if first else time.perf_counter()) - started
    steps = len(r.trace["steps"]) if r.trace else None
    check = r.failure.check if r.failure else None
    status = "killed" if seconds <= budget else "over-budget"
    return Attempt("hypothesis", status, seconds, steps, check)


@contextmanager
def _first_divergence() -> Iterator[list[float]]:
    """Record when the first ``Divergence`` is built (hypothesis then spends time shrinking)."""
    from stateful_tests.lockstep import Divergence

    seen: list[float] = []
    original = Divergence.__init__

    def recording(self: Divergence, *args: Any, **kwargs: Any) -> None:
        if not seen:
            seen.append(time.perf_counter())
        original(self, *args, **kwargs)

    Divergence.__init__ = recording  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Divergence.__init__ = original  # type: ignore[method-assign]


def run_fuzzer(m: Mutant, budget: float, chunk: int = 5_000) -> Attempt:
    comp = components.get(m.component)
    started = time.perf_counter()
    seed = 0
    while True:
        elapsed = time.perf_counter() - started
        if elapsed > budget:
            return Attempt("fuzzer", "survived", elapsed)
        r = comp.fuzz(m.cls, f"mutant:{m.name}", chunk, seed, inputs=m.inputs, **options(m))
        if not r.passed:
            seconds = time.perf_counter() - started
            trace = r.trace
            if trace is not None:
                trace = comp.shrink(
                    trace, m.cls, f"mutant:{m.name}", budget_seconds=min(10.0, budget), **m.options
                )
            steps = len(trace["steps"]) if trace else None
            check = r.failure.check if r.failure else None
            return Attempt("fuzzer", "killed", seconds, steps, check)
        seed += 1


def run_explorer(m: Mutant, budget: float) -> Attempt:
    """Explore the mutant's component at its default scope within ``budget`` seconds (its own
    variant, or every variant; the options it needs set in every configuration); the repro
    length is the shortest counterexample's."""
    from kvspec import exploration

    comp = components.get(m.component)
    if comp.explorer is None:
        return Attempt("explorer", "n/a")
    started = time.perf_counter()
    result = exploration.explore_component(
        comp,
        m.cls,
        f"mutant:{m.name}",
        variants=[m.variant] if m.variant else None,
        overrides=exploration.bound_overrides(comp, m.options),
        deadline=started + budget,
        scope="default",
        inputs=m.inputs,
    )
    seconds = time.perf_counter() - started
    for _, r in result.runs:
        if r.violations:
            v = r.violations[0]
            return Attempt("explorer", "killed", seconds, v.depth, v.check)
    return Attempt("explorer", "survived", seconds)


def run_crosshair(m: Mutant, budget: float) -> Attempt:
    """``crosshair diffbehavior`` of the planted kernel variant that carries the mutant's bug
    (``n/a`` for bugs outside the pure kernels)."""
    try:
        from proofs import crosshair_checks
    except ImportError:
        return Attempt("crosshair", "n/a")
    verdict = crosshair_checks.kill_planted(m.name, budget)
    if verdict is None:
        return Attempt("crosshair", "n/a")
    status, seconds, kind = verdict
    return Attempt("crosshair", status, seconds, None, kind)


CHECKERS: dict[str, Callable[[Mutant, float], Attempt]] = {
    "hypothesis": run_hypothesis,
    "fuzzer": run_fuzzer,
    "explorer": run_explorer,
    "crosshair": run_crosshair,
}


@dataclass
class Row:
    mutant: Mutant
    attempts: list[Attempt]

    @property
    def killed_by(self) -> list[str]:
        return [a.checker for a in self.attempts if a.killed]

    @property
    def seconds_to_kill(self) -> float | None:
        times = [a.seconds for a in self.attempts if a.killed and a.seconds is not None]
        return min(times) if times else None

    @property
    def repro_steps(self) -> int | None:
        lengths = [a.repro_steps for a in self.attempts if a.killed and a.repro_steps is not None]
        return min(lengths) if lengths else None

    def to_json(self) -> dict[str, Any]:
        m = self.mutant
        return {
            "name": m.name,
            "component": m.component,
            "origin": m.origin,
            "variant": m.variant,
            "killed_by": self.killed_by,
            "seconds_to_kill": None
            if self.seconds_to_kill is None
            else round(self.seconds_to_kill, 3),
            "repro_steps": self.repro_steps,
            "attempts": [
                {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(a).items()}
                for a in self.attempts
            ],
        }


def select(names: Sequence[str] | None, component_names: Sequence[str] | None) -> list[Mutant]:
    """Catalogue entries by name and/or component; ``ValueError`` naming an unknown one."""
    catalogue = components.catalogue()
    chosen = list(catalogue.values())
    if names:
        unknown = [n for n in names if n not in catalogue]
        if unknown:
            raise ValueError(f"unknown mutant(s) {', '.join(unknown)}")
        chosen = [m for m in chosen if m.name in names]
    if component_names:
        for name in component_names:
            components.get(name)  # an unknown component is an error, not an empty selection
        chosen = [m for m in chosen if m.component in component_names]
    return chosen


def run_matrix(
    mutants: Sequence[Mutant],
    checkers: Sequence[str],
    budget: float,
    progress: Callable[[int, str], None] | None = None,
) -> list[Row]:
    rows = []
    for i, m in enumerate(mutants):
        attempts = []
        for name in checkers:
            if progress is not None:
                progress(i, f"{m.name}: {name}")
            try:
                attempts.append(CHECKERS[name](m, budget))
            except Exception as exc:  # a crashing checker is reported, never counted as a kill
                attempts.append(Attempt(name, "error", check=f"{type(exc).__name__}: {exc}"))
        rows.append(Row(m, attempts))
    if progress is not None:
        progress(len(mutants), "done")
    return rows


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    times = [r.seconds_to_kill for r in rows if r.seconds_to_kill is not None]
    lengths = [r.repro_steps for r in rows if r.repro_steps is not None]
    killed = sum(1 for r in rows if r.killed_by)
    return {
        "mutants": len(rows),
        "killed": killed,
        "kill_rate": round(killed / len(rows), 3) if rows else None,
        "median_seconds_to_kill": round(median(times), 3) if times else None,
        "repro_at_most_6_steps": sum(1 for n in lengths if n <= 6),
        "survivors": [r.mutant.name for r in rows if not r.killed_by],
    }


def _cell(a: Attempt) -> str:
    if a.status == "killed":
        steps = f", {a.repro_steps} steps" if a.repro_steps is not None else ""
        return f"✓ {a.seconds:.1f}s{steps}" if a.seconds is not None else "✓"
    return {"survived": "—", "n/a": "n/a", "over-budget": "slow", "error": "error"}[a.status]


def markdown(rows: Sequence[Row], checkers: Sequence[str], budget: float) -> str:
    """The kill matrix as a markdown table (what ``--update-readme`` writes)."""
    s = summary(rows)
    lines = [
        f"Budget {budget:g} s per checker per mutant; ✓ = killed (seconds to kill, shortest "
        "repro), — = survived, n/a = checker does not apply, slow = killed after the budget.",
        "",
        "| mutant | component | origin | " + " | ".join(checkers) + " |",
        "|---|---|---|" + "---|" * len(checkers),
    ]
    for r in rows:
        cells = {a.checker: _cell(a) for a in r.attempts}
        lines.append(
            f"| `{r.mutant.name}` | {r.mutant.component} | {r.mutant.origin} | "
            + " | ".join(cells.get(c, "") for c in checkers)
            + " |"
        )
    lines += [
        "",
        f"{s['killed']}/{s['mutants']} killed; median time to kill "
        f"{s['median_seconds_to_kill']} s; {s['repro_at_most_6_steps']} with a repro of at most "
        "6 steps.",
    ]
    return "\n".join(lines)


def update_readme(readme: Path, table: str) -> None:
    """Replace the text between the kill-matrix markers (``ValueError`` if they are missing)."""
    text = readme.read_text()
    readme.write_text(replace_marked(text, README_START, README_END, table, where=readme))
