"""Pure kernels of the legacy (v0.2.9c) algorithms: page reclamation and the running reservation.

The spec's block manager and scheduler call these; ``kvspec crosshair`` compares each with its
optimised counterpart in :mod:`impl.infinilm.kernels` (CrossHair ``diffbehavior``) and checks their
PEP 316 ``pre:``/``post:`` contracts (``crosshair check``). A kernel reads its arguments and returns
a value; it never mutates. Arguments are plain ints, lists and tuples — CrossHair reasons about
those well — with one exception: the reclamation kernels read page metadata through a
:class:`PageTable` (the block managers' own ``blocks`` list), because a plain copy of the used
set's reference counts would cost the production scan more than the scan itself.
:mod:`proofs.crosshair_pairs` gives CrossHair a plain-data view of them (a list of ref counts) and
carries their contracts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = [
    "Candidate",
    "PageTable",
    "RefCounted",
    "admits",
    "legacy_reclaim",
    "per_candidate_admissions",
    "reservations_by_scan",
    "scan_reservation",
]

# An admission check, as the scheduler makes it (reference §5.4): (mamba row available or not
# needed, the candidate's own pages, remote-pending reservations, earlier admits' prefill extra,
# usable pages).
Candidate = tuple[bool, int, int, int, int]


class RefCounted(Protocol):
    """What a reclamation kernel reads of a page: its live reference count."""

    @property
    def ref_count(self) -> int: ...


class PageTable(Protocol):
    """Page metadata by page id: the block manager's ``blocks`` list."""

    def __getitem__(self, page: int, /) -> RefCounted: ...


def legacy_reclaim(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int
) -> tuple[list[int], bool]:
    """The pages legacy ``try_free_blocks`` evicts, in eviction order, and its result (§3.8).

    ``used`` is the used set (its iteration order matters), ``blocks`` the page metadata and
    ``num_free`` the free deque's length. Legacy collects every unreferenced used page (a full
    scan), then evicts them one by one, testing capacity *after* each eviction: hence quirk A (one
    page is evicted even when capacity already suffices, if a candidate exists) and quirk B (on
    failure every candidate has been evicted). The caller evicts the returned pages in order.
    Contract (over a plain list of ref counts): :func:`proofs.crosshair_pairs.legacy_reclaim_on_pages`.
    """
    to_free = [page for page in used if blocks[page].ref_count == 0]  # full scan, set order
    victims: list[int] = []
    for page in to_free:
        victims.append(page)  # evict first (quirk A) ...
        if num_free + len(victims) >= num_required:  # ... then test
            return victims, True
    return victims, num_free + len(victims) >= num_required  # quirk B: every candidate is gone


def scan_reservation(needs: Iterable[int]) -> int:
    """The running queue's reservation, scanned: the sum of every running request's need (§5.4).

    post: __return__ == sum(needs)
    """
    total = 0
    for need in needs:
        total += need
    return total


def admits(running: int, own: int, pending: int, extra: int, usable: int) -> bool:
    """Admission (§5.4): running reservations + the candidate's own pages + remote-pending
    reservations + earlier admits' prefill extra fit in the usable pages.

    post: __return__ == (running + own + pending + extra <= usable)
    """
    return running + own + pending + extra <= usable


def per_candidate_admissions(needs: Sequence[int], candidates: Sequence[Candidate]) -> list[bool]:
    """Legacy admission decisions in one prefill step: every check scans the running queue (§5.4).

    ``needs`` are the running requests' reservations, which do not change during the prefill loop
    (nothing joins or leaves the running queue and no running request generates). A check whose
    mamba pre-check fails is rejected before it reads the reservation.

    post: len(__return__) == len(candidates)
    """
    decisions: list[bool] = []
    for mamba_ok, own, pending, extra, usable in candidates:
        if not mamba_ok:
            decisions.append(False)
            continue
        decisions.append(admits(scan_reservation(needs), own, pending, extra, usable))
    return decisions


def reservations_by_scan(events: Sequence[int]) -> list[int]:
    """The running queue's reservation after each event, by scanning the queue (reference §7).

    An event ``e >= 0`` is ``complete_requests`` re-enqueuing a request whose reservation is ``e``
    at the running tail; ``e < 0`` is the decode loop dequeuing the head (nothing when the queue is
    empty). The queue is a list of the requests' reservations: they do not change while queued.

    post: len(__return__) == len(events)
    """
    queue: list[int] = []
    reservations: list[int] = []
    for event in events:
        if event >= 0:
            queue.append(event)
        elif queue:
            queue.pop(0)
        reservations.append(scan_reservation(queue))
    return reservations
