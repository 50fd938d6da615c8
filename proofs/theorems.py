"""Every kvspec z3 theorem, in one ordered list, and the runner behind ``kvspec prove``.

Modules (each theorem's docstring is its plain-words statement):

* :mod:`proofs.z3_arith` — ceiling-division lemmas; the reservation formulas of ``legacy``,
  ``exact`` and ``tight`` against the true remaining need; ``exact <= legacy`` refuted;
* :mod:`proofs.z3_admission` — admission soundness as an inductive invariant of an abstract
  scheduler, per variant, without and with a PD connector (the §9.11 requeue refuted);
* :mod:`proofs.z3_counters` — the block manager's live-page counter, the scheduler's incremental
  reservation counter and the offload manager's evictable counter, transition by transition;
* :mod:`proofs.z3_arc` — ARC's target and list bounds (``arc_lists_bounded``), inductive over the
  offload manager's transitions.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence

from proofs import z3_admission, z3_arc, z3_arith, z3_counters  # importing registers them
from proofs.z3_core import REGISTRY, Result, Theorem, check

__all__ = ["THEOREMS", "Result", "Theorem", "check", "run", "select"]

_ORDER = [m.__name__ for m in (z3_arith, z3_admission, z3_counters, z3_arc)]
THEOREMS: dict[str, Theorem] = dict(
    sorted(REGISTRY.items(), key=lambda item: _ORDER.index(item[1].build.__module__))
)


def select(patterns: Sequence[str] | None) -> list[Theorem]:
    """Theorems whose name equals or matches (``fnmatch``) one of ``patterns``, in list order; all
    when None.

    Raises ``ValueError`` naming a pattern that matches nothing.
    """
    if not patterns:
        return list(THEOREMS.values())
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in THEOREMS):
            raise ValueError(f"no theorem named or matching {pattern!r}")
    return [
        t for name, t in THEOREMS.items() if any(fnmatch.fnmatchcase(name, p) for p in patterns)
    ]


def run(
    theorems: Iterable[Theorem],
    timeout_ms: int | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Check each theorem in order (``timeout_ms`` overrides every per-theorem budget)."""
    results = []
    for th in theorems:
        r = check(th, timeout_ms)
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results
