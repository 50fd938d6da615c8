"""Pure kernels of the optimised algorithms: bounded reclamation (#578), the per-step running
reservation (#579) and the incremental reservation counter (the exact-reservation PR).

The production block manager and scheduler call these; ``kvspec crosshair`` shows each one behaves
as its legacy counterpart in :mod:`spec.infinilm.kernels` (CrossHair ``diffbehavior``) and checks
the PEP 316 contracts below (``crosshair check``). Read-only, plain ints, lists and tuples, except
the page table that reclamation reads (see :mod:`spec.infinilm.kernels`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spec.infinilm.kernels import Candidate, PageTable, admits, scan_reservation

__all__ = [
    "add_reservation",
    "bounded_reclaim",
    "per_step_admissions",
    "remove_reservation",
    "reservations_by_counter",
    "snapshot_due",
]


def bounded_reclaim(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, num_candidates: int
) -> tuple[list[int], bool]:
    """PR #578: the pages to evict and the result, scanning only until they are found.

    Arguments as in :func:`spec.infinilm.kernels.legacy_reclaim`, plus ``num_candidates``, the
    number of unreferenced used pages, which the caller knows without a scan (relies on
    referenced_count_matches_live_pages). Evicts the deficit, at least one page (quirk A), at most
    every candidate (quirk B), in set order. The caller evicts the returned pages *after* the scan,
    so the used set sees legacy's sequence of removals. Contract (over a plain list of ref counts):
    :func:`proofs.crosshair_pairs.bounded_reclaim_on_pages`.
    """
    if num_candidates == 0:
        return [], num_free >= num_required
    limit = min(max(num_required - num_free, 1), num_candidates)  # max(.., 1): quirk A
    victims: list[int] = []
    for page in used:
        if blocks[page].ref_count == 0:
            victims.append(page)
            if len(victims) == limit:  # every page that will be evicted is found: stop
                break
    return victims, num_free + len(victims) >= num_required


def snapshot_due(snapshot: int | None, mamba_ok: bool) -> bool:
    """PR #579: take the step's running-reservation snapshot now? Only once per step, and only
    for a check that will read it (its mamba pre-check passes).

    post: __return__ == (snapshot is None and mamba_ok)
    """
    return snapshot is None and mamba_ok


def per_step_admissions(needs: Sequence[int], candidates: Sequence[Candidate]) -> list[bool]:
    """PR #579's admission decisions in one prefill step: the running queue is scanned at most once,
    lazily, and the value is reused by every later check of the step (pending reservations,
    prefill extra and usable pages are still read per check).

    post: len(__return__) == len(candidates)
    post: not any(d for d, c in zip(__return__, candidates) if not c[0])
    """
    snapshot: int | None = None
    decisions: list[bool] = []
    for mamba_ok, own, pending, extra, usable in candidates:
        if snapshot_due(snapshot, mamba_ok):
            snapshot = scan_reservation(needs)
        if not mamba_ok or snapshot is None:
            decisions.append(False)
            continue
        decisions.append(admits(snapshot, own, pending, extra, usable))
    return decisions


def add_reservation(counter: int, need: int) -> int:
    """A request joins the running queue: its reservation joins the counter.

    pre: counter >= 0 and need >= 0
    post: __return__ >= counter
    """
    return counter + need


def remove_reservation(counter: int, need: int) -> int:
    """A request leaves the running queue (decode dequeue, before its is_finished check).

    pre: 0 <= need <= counter
    post: 0 <= __return__ <= counter
    """
    return counter - need


def reservations_by_counter(events: Sequence[int]) -> list[int]:
    """The incremental counter after each event (events as in
    :func:`spec.infinilm.kernels.reservations_by_scan`): only deltas, never a scan. The list of
    reservations stands for the queue's requests: the dequeued one gives back what it added.

    post: len(__return__) == len(events)
    post: all(v >= 0 for v in __return__)
    """
    queued: list[int] = []
    head = 0
    counter = 0
    reservations: list[int] = []
    for event in events:
        if event >= 0:
            queued.append(event)
            counter = add_reservation(counter, event)
        elif head < len(queued):
            counter = remove_reservation(counter, queued[head])
            head += 1
        reservations.append(counter)
    return reservations
