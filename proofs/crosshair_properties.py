"""Kernel properties run on Hypothesis' CrossHair backend (``hypothesis-crosshair``).

Each property says "the optimised kernel does what the legacy kernel does" for every input the
strategy can draw; with ``backend="crosshair"`` the inputs are symbolic, so each example is an
execution path explored by CrossHair instead of a random draw. ``kvspec crosshair`` runs this
module with :mod:`proofs.crosshair_backend` (check kind ``backend``); it is not part of the default
test collection.

Environment (set by ``proofs.crosshair_checks``):

* ``KVSPEC_CROSSHAIR_EXAMPLES`` — ``max_examples`` per property (the budget; default 40);
* ``KVSPEC_CROSSHAIR_COUNTER``, ``KVSPEC_CROSSHAIR_ADMISSIONS``, ``KVSPEC_CROSSHAIR_RECLAIM`` —
  ``module:function`` of the optimised kernel under test (default: the real one); the planted
  checks point them at :mod:`proofs.crosshair_mutants` and expect a failing property.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from proofs.crosshair_pairs import legacy_reclaim_on_pages
from spec.infinilm.kernels import per_candidate_admissions, reservations_by_scan

EXAMPLES = int(os.environ.get("KVSPEC_CROSSHAIR_EXAMPLES", "40"))


def _subject(variable: str, default: str) -> Callable[..., Any]:
    module, _, name = os.environ.get(variable, default).partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


counter = _subject("KVSPEC_CROSSHAIR_COUNTER", "impl.infinilm.kernels:reservations_by_counter")
admissions = _subject("KVSPEC_CROSSHAIR_ADMISSIONS", "impl.infinilm.kernels:per_step_admissions")
reclaim = _subject("KVSPEC_CROSSHAIR_RECLAIM", "proofs.crosshair_pairs:try_free_blocks_on_pages")

CROSSHAIR = settings(
    backend="crosshair",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
)

non_negative = st.integers(min_value=0)


@CROSSHAIR
@given(st.lists(st.integers(min_value=-1)))
def test_reservation_counter_matches_scan(events: list[int]) -> None:
    """``reservation_counter_matches_scan``: the incremental counter (deltas on enqueue and on the
    decode dequeue) equals the running queue's scanned reservation after every event."""
    assert counter(events) == reservations_by_scan(events)


@CROSSHAIR
@given(
    st.lists(st.integers()),
    st.lists(st.tuples(st.booleans(), st.integers(), st.integers(), st.integers(), st.integers())),
)
def test_per_step_snapshot_admits_as_per_candidate_scan(
    needs: list[int], candidates: list[tuple[bool, int, int, int, int]]
) -> None:
    """PR #579: one lazy snapshot per step gives every admission decision the legacy per-check
    scan gives (the running queue does not change within the prefill loop)."""
    assert admissions(needs, candidates) == per_candidate_admissions(needs, candidates)


@CROSSHAIR
@given(st.lists(non_negative), non_negative, non_negative)
def test_bounded_reclaim_evicts_as_legacy(
    refs: list[int], num_free: int, num_required: int
) -> None:
    """PR #578: the impl's bounded scan evicts the same pages in the same order, with the same result
    (``refs``: the used pages' ref counts in set order, as in :func:`proofs.crosshair_pairs.used_set`)."""
    assert reclaim(refs, num_free, num_required) == legacy_reclaim_on_pages(
        refs, num_free, num_required
    )
