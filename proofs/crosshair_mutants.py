"""Planted bugs in the optimised kernels, each with the signature of the kernel (or adapter) it
replaces. ``kvspec crosshair --planted`` runs each against the legacy kernel
(``proofs.crosshair_checks.PLANTED``) and passes only when CrossHair reports the difference: the
evidence that a budget sees bugs of that kind. Each docstring names the hazard it plants; four of
them carry a catalogue mutant's bug (``stateful_tests.mutants``) into the kernel, for the kill
matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from impl.infinilm.kernels import add_reservation, remove_reservation, snapshot_due
from proofs.crosshair_pairs import candidates_of, on_pages  # noqa: F401 (used by contracts)
from spec.infinilm.kernels import Candidate, PageTable, admits, scan_reservation


def _bounded(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, limit: int
) -> tuple[list[int], bool]:
    """The bounded scan with a given bound (``bounded_reclaim``'s loop)."""
    victims: list[int] = []
    if limit <= 0:
        return victims, num_free >= num_required
    for page in used:
        if blocks[page].ref_count == 0:
            victims.append(page)
            if len(victims) == limit:
                break
    return victims, num_free + len(victims) >= num_required


# ----------------------------------------------------------------------------- reclamation (#578)
def _without_quirk_a(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """#578 hazard: ``limit = required - free`` without the ``max(.., 1)`` loses quirk A."""
    return _bounded(used, blocks, num_free, num_required, min(num_required - num_free, candidates))


def _off_by_one(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """An off-by-one bound: one page short of the deficit whenever the deficit is 2 or more."""
    limit = min(max(num_required - num_free - 1, 1), candidates)
    return _bounded(used, blocks, num_free, num_required, limit)


def _limit_ignores_free(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """The bound forgets the pages already free: evicts ``required`` pages, not the deficit."""
    return _bounded(used, blocks, num_free, num_required, min(max(num_required, 1), candidates))


def _result_before_eviction(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """The result is read before the evictions (``len(free)`` captured too early)."""
    limit = min(max(num_required - num_free, 1), candidates)
    victims, _ = _bounded(used, blocks, num_free, num_required, limit)
    return victims, num_free >= num_required


def _evicts_referenced(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """#578 hazard: a candidate filter that also takes pages held once (``ref_count <= 1``)."""
    limit = min(max(num_required - num_free, 1), candidates)
    victims = [page for page in used if blocks[page].ref_count <= 1][:limit] if candidates else []
    return victims, num_free + len(victims) >= num_required


def _in_id_order(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, candidates: int
) -> tuple[list[int], bool]:
    """A plausible "deterministic" rewrite: evict in ascending id order instead of set order."""
    limit = min(max(num_required - num_free, 1), candidates)
    victims = sorted(page for page in used if blocks[page].ref_count == 0)[:limit]
    return victims, num_free + len(victims) >= num_required


reclaim_without_quirk_a = on_pages(_without_quirk_a)
reclaim_off_by_one = on_pages(_off_by_one)
reclaim_limit_ignores_free = on_pages(_limit_ignores_free)
reclaim_result_before_eviction = on_pages(_result_before_eviction)
reclaim_evicts_referenced = on_pages(_evicts_referenced)
reclaim_in_id_order = on_pages(_in_id_order)


def reclaim_one_short_on_pages(
    refs: list[int], num_free: int, num_required: int
) -> tuple[list[int], bool]:
    """The off-by-one bound under ``bounded_reclaim_on_pages``'s contract: ``crosshair check`` must
    report a violated postcondition.

    pre: num_free >= 0 and num_required >= 0
    post: __return__[0] == candidates_of(refs)[: len(__return__[0])]
    post: __return__[1] == (num_free + len(__return__[0]) >= num_required)
    post: (len(__return__[0]) >= 1) == (len(candidates_of(refs)) >= 1)
    post: __return__[1] or __return__[0] == candidates_of(refs)
    post: len(__return__[0]) <= max(num_required - num_free, 1)
    """
    return reclaim_off_by_one(refs, num_free, num_required)


# ----------------------------------------------------------------------------- per-step snapshot (#579)
def per_step_hoists_extra(needs: Sequence[int], candidates: Sequence[Candidate]) -> list[bool]:
    """#579 hazard: the snapshot hoists the first check's whole partial sum (running + pending +
    extra) instead of the running part only, so later checks see a stale prefill extra."""
    snapshot: int | None = None
    decisions: list[bool] = []
    for mamba_ok, own, pending, extra, usable in candidates:
        if snapshot_due(snapshot, mamba_ok):
            snapshot = scan_reservation(needs) + pending + extra
        if not mamba_ok or snapshot is None:
            decisions.append(False)
            continue
        decisions.append(admits(snapshot, own, 0, 0, usable))
    return decisions


# ----------------------------------------------------------------------------- incremental counter
def counter_skips_dequeue(events: Sequence[int]) -> list[int]:
    """Exact-reservation PR hazard: the decode dequeue does not take the reservation out."""
    counter = 0
    reservations: list[int] = []
    for event in events:
        if event >= 0:
            counter = add_reservation(counter, event)
        reservations.append(counter)
    return reservations


def counter_dequeues_tail(events: Sequence[int]) -> list[int]:
    """The dequeue gives back the newest request's reservation instead of the head's."""
    queued: list[int] = []
    counter = 0
    reservations: list[int] = []
    for event in events:
        if event >= 0:
            queued.append(event)
            counter = add_reservation(counter, event)
        elif queued:
            counter = remove_reservation(counter, queued.pop())
        reservations.append(counter)
    return reservations
