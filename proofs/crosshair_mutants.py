"""Planted bugs in the optimised kernels, each with the signature of the kernel (or adapter) it
replaces. ``kvspec crosshair --planted`` runs each against the legacy kernel
(``proofs.crosshair_checks.PLANTED``) and passes only when CrossHair reports the difference: the
evidence that a budget sees bugs of that kind. Each docstring names the hazard it plants; eight of
them carry a catalogue mutant's bug (``stateful_tests.mutants_*``) into the kernel, for the kill
matrix (``proofs.crosshair_checks.CATALOGUE_KERNELS``).

The ARC victim-selection variants (vLLM #50992/#55461, reference §7.1 O5/O6) change one step of
``impl.vllm.arc.one_pass_victims`` each and run through the adapters of
``proofs.crosshair_pairs`` (``arc_on_flags``, ``every_n``). One of them is *not* a bug:
``arc_decrement_on_t2_pick`` is equivalent to the kernel (``proofs.crosshair_checks.EQUIVALENT``
shows CrossHair finding no difference; its docstring says why there is none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.infinilm.kernels import add_reservation, remove_reservation, snapshot_due
from impl.vllm.arc import one_pass_victims
from proofs.crosshair_pairs import (  # noqa: F401 (used by contracts)
    Method,
    arc_on_flags,
    arc_well_formed,
    candidates_of,
    every_n,
    method_on_pages,
    on_pages,
)
from spec.infinilm.kernels import Candidate, PageTable, admits, scan_reservation
from stateful_tests.planting import method_with

K = TypeVar("K")
B = TypeVar("B")


def _bounded(
    used: Iterable[int], blocks: PageTable, num_free: int, num_required: int, limit: int
) -> tuple[list[int], bool]:
    """The bounded scan with a given bound (the loop of the impl's ``try_free_blocks``)."""
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


def _method_with(old: str, new: str) -> Method:
    """The production ``try_free_blocks`` with one source change: the code that runs, planted,
    rather than a re-written copy of it (:func:`stateful_tests.planting.method_with`)."""
    method: Method = method_with(ImplBlockManager.try_free_blocks, old, new)
    return method


# Planted in the method itself (issue: the inlined scan must still be checked as it runs).
reclaim_method_one_page_path_widened = method_on_pages(
    _method_with("if limit <= 1:", "if limit <= 2:")
)
reclaim_method_result_strict = method_on_pages(
    _method_with(
        "return num_free + len(victims) >= num_required",
        "return num_free + len(victims) > num_required",
    )
)


def reclaim_one_short_on_pages(
    refs: list[int], num_free: int, num_required: int
) -> tuple[list[int], bool]:
    """The off-by-one bound under ``try_free_blocks_on_pages``' contract: ``crosshair check`` must
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


# ----------------------------------------------------------------------------- ARC victims (#50992)
def _next_eligible(
    entries: Iterator[tuple[K, B]], eligible: Callable[[K, B], bool]
) -> tuple[K, B] | None:
    for key, block in entries:
        if eligible(key, block):
            return key, block
    return None


def _next_or_raise(
    entries: Iterator[tuple[K, B]], eligible: Callable[[K, B], bool]
) -> tuple[K, B] | None:
    """``next(...)`` without a default: ``StopIteration`` when no eligible entry is left."""
    return next((key, block) for key, block in entries if eligible(key, block))


def _one_pass_variant(
    t1: Iterable[tuple[K, B]],
    t2: Iterable[tuple[K, B]],
    t1_size: int,
    target: int,
    n: int,
    t1_fallback: bool,
    eligible: Callable[[K, B], bool],
    *,
    advance: Callable[..., tuple[K, B] | None] = _next_eligible,
    restart_after_t2_pick: bool = False,
    fallback_restarts_t1: bool = False,
    decrement_on_t2_pick: bool = False,
) -> list[tuple[K, B, bool]] | None:
    """``impl.vllm.arc.one_pass_victims`` with one step open to change (the kernel-level twin of
    ``stateful_tests.mutants_vllm._OnePassARC``)."""
    t1 = list(t1)  # restartable, as the policy's ``items()`` views are
    t1_iter, t2_iter = iter(t1), iter(t2)
    virtual = t1_size
    picks: list[tuple[K, B, bool]] = []
    for _ in range(n):
        entry = advance(t1_iter, eligible) if virtual >= target else None
        from_t1 = entry is not None
        if entry is None:
            entry = advance(t2_iter, eligible)
            if entry is not None and restart_after_t2_pick:
                t1_iter = iter(t1)
        if entry is None and t1_fallback:
            if fallback_restarts_t1:
                t1_iter = iter(t1)
            entry = advance(t1_iter, eligible)
            from_t1 = entry is not None
        if entry is None:
            return None
        if from_t1 or decrement_on_t2_pick:
            virtual -= 1
        picks.append((*entry, from_t1))
    return picks


def _restart_after_t2_pick(*args: Any) -> list[tuple[Any, Any, bool]] | None:
    """O5, #50992 hazard: the T1 iterator starts over after a T2 pick; an exhausted T1 scan then
    re-selects a block already taken (a duplicate victim)."""
    return _one_pass_variant(*args, restart_after_t2_pick=True)


def _stop_iteration(*args: Any) -> list[tuple[Any, Any, bool]] | None:
    """O5, #50992 hazard: ``next(...)`` without a default, so ``StopIteration`` escapes when a
    list has no further eligible entry (e.g. T1 exhausted while its virtual size is >= target)."""
    return _one_pass_variant(*args, advance=_next_or_raise)


def _no_fallback(
    t1: Any, t2: Any, t1_size: int, target: int, n: int, t1_fallback: bool, eligible: Any
) -> list[tuple[Any, Any, bool]] | None:
    """O6, #55461: asked for the T1 fallback, selection still gives up once T2 has no eligible
    entry (the #50992 code)."""
    return one_pass_victims(t1, t2, t1_size, target, n, False, eligible)


def _fallback_restarts_t1(*args: Any) -> list[tuple[Any, Any, bool]] | None:
    """O5/O6, #55461 hazard: the fallback starts a fresh T1 scan instead of reusing the T1
    iterator, re-selecting a block already taken."""
    return _one_pass_variant(*args, fallback_restarts_t1=True)


def _decrement_on_t2_pick(*args: Any) -> list[tuple[Any, Any, bool]] | None:
    """EQUIVALENT, not a bug (reference §2.3): the virtual T1 size also drops on T2 picks. Once a
    victim comes from T2, either the virtual size is already below ``target`` (and only falls
    further) or T1 has no eligible entry left (and never will, eligibility being fixed), so no
    selection changes."""
    return _one_pass_variant(*args, decrement_on_t2_pick=True)


# diffbehavior against ``proofs.crosshair_pairs.arc_rescan_every_n`` (or ``..._with_fallback``)
arc_restart_after_t2_pick = every_n(arc_on_flags(_restart_after_t2_pick, False))
arc_stop_iteration = every_n(arc_on_flags(_stop_iteration, False))
arc_no_fallback_with_fallback = every_n(arc_on_flags(_no_fallback, True))
arc_fallback_restarts_t1_with_fallback = every_n(arc_on_flags(_fallback_restarts_t1, True))
arc_decrement_on_t2_pick = every_n(arc_on_flags(_decrement_on_t2_pick, False))
arc_decrement_on_t2_pick_with_fallback = every_n(arc_on_flags(_decrement_on_t2_pick, True))


_restart_on_flags = arc_on_flags(_restart_after_t2_pick, False)


def arc_restart_after_t2_pick_on_flags(
    t1: list[bool], t2: list[bool], target: int, n: int
) -> list[tuple[int, bool]] | None:
    """The restarted T1 iterator under ``arc_one_pass_on_flags``' contract: ``crosshair check``
    must report a violated postcondition (a duplicate victim), with no legacy kernel to compare.

    pre: target >= 0 and n >= 0
    post: arc_well_formed(t1, t2, n, __return__)
    post: __return__ is not None or n > sum(t2)
    """
    return _restart_on_flags(t1, t2, target, n)
