"""Pure kernels of the optimised algorithms: the per-step running reservation (#579) and the
incremental reservation counter (the exact-reservation PR). Bounded reclamation (#578) is inlined
in :meth:`impl.infinilm.block_manager.BlockManager.try_free_blocks`, where CrossHair checks the
method itself (:func:`proofs.crosshair_pairs.try_free_blocks_on_pages`).

The production scheduler calls these; ``kvspec crosshair`` shows each one behaves as its legacy
counterpart in :mod:`spec.infinilm.kernels` (CrossHair ``diffbehavior``) and checks the PEP 316
contracts below (``crosshair check``). Read-only, plain ints, lists and tuples.
"""

from __future__ import annotations

from collections.abc import Sequence

from spec.infinilm.kernels import Candidate, admits, scan_reservation

__all__ = [
    "add_reservation",
    "per_step_admissions",
    "remove_reservation",
    "reservations_by_counter",
    "snapshot_due",
]


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
