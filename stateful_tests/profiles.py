"""Hypothesis profiles, registered in one place (imported by conftest.py and the CLI).

* ``ci``: derandomized, no deadline, no example database, bounded examples — the same commit gives
  the same result twice.
* ``dev``: random seeds and the local example database, a few hundred runs.
* ``deep``: local soak runs; thousands of runs of longer programs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("ci", "dev", "deep")
# No explain phase: it re-runs every shrunk program many times and our step tables say more.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_QUIET = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    report_multiple_bugs=False,
    suppress_health_check=_QUIET,
    phases=_PHASES,
)
settings.register_profile(
    "dev",
    max_examples=500,
    stateful_step_count=60,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=_QUIET,
    phases=_PHASES,
)
settings.register_profile(
    "deep",
    max_examples=5000,
    stateful_step_count=150,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=_QUIET,
    phases=_PHASES,
)


def get(name: str) -> settings:
    """The registered profile ``name`` (``ValueError`` naming the choices otherwise)."""
    if name not in PROFILES:
        raise ValueError(
            f"unknown hypothesis profile {name!r}; choose one of {', '.join(PROFILES)}"
        )
    return settings.get_profile(name)


_SLOW_SHRINK_NOTICE = "WARNING: Hypothesis has spent more than five minutes"


@contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Bound hypothesis' shrinking time (the engine documents this constant as monkeypatchable);
    hypothesis' own notice when the bound is hit is left out (it names a fixed five minutes)."""
    from hypothesis.internal.conjecture import engine
    from hypothesis.reporting import current_reporter, with_reporter

    old = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    outer = current_reporter()

    def quiet(value: object) -> None:
        # the engine's notice at this deadline always says "five minutes": it would misreport
        # the bound set here
        if not str(value).startswith(_SLOW_SHRINK_NOTICE):
            outer(value)

    try:
        with with_reporter(quiet):
            yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old
