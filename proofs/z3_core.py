"""The z3 theorem machinery: a theorem is a list of proof obligations, each checked by refutation.

A theorem is a function whose docstring states the claim in plain words and which returns its
:class:`Obligation` s. An obligation ``premises ⊢ goal`` holds when ``premises ∧ ¬goal`` is
*unsat*. Outcomes (docs/design.md, "kvspec prove"):

* ``proved`` — every obligation is unsat;
* ``counterexample`` — some obligation is sat; the detail names it and prints the model's values
  of the obligation's ``show`` terms (the variables a reader needs);
* ``failed`` — z3 answered ``unknown`` (timeout included), the per-theorem time budget ran out,
  or building the query raised. ``unknown`` is never a pass.

A theorem *passes* when its status equals its expected outcome, so a claim we expect z3 to refute
(``exact <= legacy``) is registered with ``expected="counterexample"``.

The time budget is per theorem (``timeout_ms``): each obligation's solver gets what is left of it.
Theorems register themselves with :func:`theorem` into :data:`REGISTRY` in definition order.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

PROVED = "proved"
COUNTEREXAMPLE = "counterexample"
FAILED = "failed"
DEFAULT_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class Obligation:
    """``premises ⊢ goal``; ``show`` names the terms to print from a counterexample."""

    name: str
    premises: Sequence[z3.BoolRef]
    goal: z3.BoolRef
    show: Mapping[str, Any] = field(default_factory=dict)  # z3 terms (or Python constants)


@dataclass(frozen=True)
class Theorem:
    name: str
    expected: str  # proved | counterexample
    build: Callable[[], Sequence[Obligation]]
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    # turns a counterexample's shown values into a sentence (e.g. replayed through the spec)
    confirm: Callable[[Mapping[str, Any]], str] | None = None

    @property
    def statement(self) -> str:
        """The claim in plain words: the builder's docstring."""
        return inspect.getdoc(self.build) or ""


@dataclass
class Result:
    name: str
    expected: str
    status: str  # proved | counterexample | failed
    seconds: float
    detail: str
    # refuted obligation -> the model's values of its ``show`` terms, in obligation order
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # refuted obligation -> replay sentence

    @property
    def passed(self) -> bool:
        return self.status == self.expected

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "expected": self.expected,
            "status": self.status,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
        }


REGISTRY: dict[str, Theorem] = {}


def theorem(
    expected: str = PROVED,
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    name: str | None = None,
    confirm: Callable[[Mapping[str, Any]], str] | None = None,
) -> Callable[[Callable[[], Sequence[Obligation]]], Callable[[], Sequence[Obligation]]]:
    """Register the decorated obligation builder as a theorem (its name, unless ``name``)."""
    if expected not in (PROVED, COUNTEREXAMPLE):
        raise ValueError(f"expected must be {PROVED!r} or {COUNTEREXAMPLE!r}, got {expected!r}")

    def register(build: Callable[[], Sequence[Obligation]]) -> Callable[[], Sequence[Obligation]]:
        key = name or build.__name__
        if key in REGISTRY:
            raise ValueError(f"theorem {key!r} is registered twice")
        REGISTRY[key] = Theorem(key, expected, build, timeout_ms, confirm)
        return build

    return register


def _value(model: z3.ModelRef, term: Any) -> Any:
    if not isinstance(term, z3.ExprRef):  # a Python constant inside a transition table
        return term
    v = model.eval(term, model_completion=True)
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        fraction = v.as_fraction()
        return int(fraction) if fraction.denominator == 1 else float(fraction)
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    return str(v)


def check(th: Theorem, timeout_ms: int | None = None) -> Result:
    """Check every obligation of ``th`` within its time budget (``timeout_ms`` overrides it)."""
    budget = th.timeout_ms if timeout_ms is None else timeout_ms
    started = time.perf_counter()

    def elapsed_ms() -> float:
        return (time.perf_counter() - started) * 1000

    def result(status: str, detail: str, **extra: Any) -> Result:
        return Result(th.name, th.expected, status, time.perf_counter() - started, detail, **extra)

    try:
        obligations = list(th.build())
    except Exception as exc:  # a theorem that cannot be built is a failed theorem, reported
        return result(FAILED, f"building the query raised {type(exc).__name__}: {exc}")
    models: dict[str, dict[str, Any]] = {}  # refuted obligation -> its shown values
    notes: dict[str, str] = {}
    for ob in obligations:
        for query, vacuity in ((z3.And(*ob.premises, z3.Not(ob.goal)), False), (None, True)):
            if vacuity and ob.name in models:
                break  # a counterexample already shows the premises are satisfiable
            left = budget - elapsed_ms()
            if left < 1:
                return result(FAILED, f"timeout: {budget} ms spent before obligation {ob.name!r}")
            solver = z3.Solver()
            solver.set("timeout", max(1, int(left)))
            solver.add(*ob.premises)
            if query is not None:
                solver.add(z3.Not(ob.goal))
            answer = solver.check()
            what = "its premises alone" if vacuity else "obligation"
            if answer == z3.unknown:
                reason = solver.reason_unknown()
                return result(
                    FAILED,
                    f"z3 answered unknown on {what} {ob.name!r} ({reason}; budget {budget} ms)",
                )
            if vacuity and answer == z3.unsat:  # a proof from contradictory premises proves nothing
                return result(FAILED, f"vacuous: the premises of {ob.name!r} are unsatisfiable")
            if not vacuity and answer == z3.sat:
                model = solver.model()
                values = {label: _value(model, term) for label, term in ob.show.items()}
                models[ob.name] = values
                if th.confirm is not None:
                    try:
                        notes[ob.name] = th.confirm(values)
                    except Exception as exc:  # a replay is a cross-check: report it, keep the model
                        notes[ob.name] = f"replay raised {type(exc).__name__}: {exc}"
    if elapsed_ms() > budget:
        return result(FAILED, f"timeout: {elapsed_ms():.0f} ms > budget {budget} ms")
    if not models:
        return result(PROVED, f"{len(obligations)} obligation(s) unsat, premises satisfiable")
    parts = [describe(name, values, notes.get(name)) for name, values in models.items()]
    return result(COUNTEREXAMPLE, " | ".join(parts), models=models, notes=notes)


def describe(obligation: str, values: Mapping[str, Any], note: str | None = None) -> str:
    """``obligation: k=v, ...[; note]`` — one refuted obligation in words."""
    text = f"{obligation}: " + ", ".join(f"{k}={v}" for k, v in values.items())
    return f"{text}; {note}" if note else text
