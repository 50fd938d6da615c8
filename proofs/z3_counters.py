"""Counter bookkeeping: each incremental counter of impl/ equals the scan it replaces, inductively.

The frame argument, once: a counter ``C`` that is meant to equal ``Σ_x [pred(x)]`` over a pool of
any size is preserved by a transition that changes one element ``x`` (all others untouched) iff the
counter's update equals ``[pred(x')] − [pred(x)]``. So each proof obligation quantifies over the
number ``rest`` of other elements satisfying the predicate (any pool size), one element's before and
after state, and the update the impl code makes — transcribed below next to the line it models.
Operations that touch several elements (``free_blocks`` over a table, ``evict(n)``) are sequences
of one-element transitions, each covered.

* ``block_manager_counter_tracks_live_pages``: ``num_referenced`` (PR #576) ==
  ``|{p : ref(p) > 0}|`` (invariant ``referenced_count_matches_live_pages``), hence
  ``get_total_usable_blocks() = N − num_referenced`` equals the legacy scan;
* ``scheduler_reservation_counter_matches_scan``: ``_num_reserved`` == Σ over the running queue of
  the variant's reservation (``reservation_counter_matches_scan``), for ``exact`` and ``tight``;
* ``offload_evictable_counter_matches_scan``: ``_num_evictable_cache_blocks`` (#45757) == the
  number of cached blocks with ``ref_cnt == 0`` (``evictable_counter_matches_scan``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from proofs.z3_arith import Z3, exact, tight
from proofs.z3_core import Obligation, theorem


def _ind(b: Any) -> z3.ArithRef:
    return z3.If(b, 1, 0)


# ------------------------------------------------------------------------ block manager (#576)
@dataclass(frozen=True)
class PageTransition:
    """One page's reference count ``r`` → ``after(r)``, allowed when ``pre(r)``; the impl adds
    ``delta(r)`` to ``num_referenced``."""

    name: str
    pre: Callable[[Any], Any]
    after: Callable[[Any], Any]
    delta: Callable[[Any], Any]


BLOCK_MANAGER: tuple[PageTransition, ...] = (
    # _allocate_block: a free page (free_pages_unreferenced: ref 0) is reset to 1; counter += 1
    PageTransition("_allocate_block", lambda r: r == 0, lambda r: 1, lambda r: 1),
    # get_computed_blocks: pin a hit; `if block.ref_count == 0: num_referenced += 1`
    PageTransition(
        "get_computed_blocks pin", lambda r: r >= 0, lambda r: r + 1, lambda r: _ind(r == 0)
    ),
    # free_blocks: ref > 0 (else DoubleFreeError before any change); `if ref == 1: -= 1`
    PageTransition("free_blocks", lambda r: r >= 1, lambda r: r - 1, lambda r: -_ind(r == 1)),
    # truncate_blocks: validated ref == 1; `ref_count = 0; num_referenced -= 1`
    PageTransition("truncate_blocks discard", lambda r: r == 1, lambda r: 0, lambda r: -1),
    # _deallocate_block (reclaim / truncate's return to the free list): ref == 0 asserted; no change
    PageTransition("_deallocate_block", lambda r: r == 0, lambda r: 0, lambda r: 0),
    # publish_computed_blocks: hashes only
    PageTransition("publish_computed_blocks", lambda r: r >= 0, lambda r: r, lambda r: 0),
)


def block_manager_obligations(
    transitions: Sequence[PageTransition] = BLOCK_MANAGER,
) -> list[Obligation]:
    pool, rest, counter, r = z3.Ints("N rest num_referenced ref")
    obligations = [
        Obligation(
            "init: no page referenced, counter 0",
            [pool >= 1, counter == 0, rest == 0, r == 0],
            counter == rest + _ind(r > 0),
            {"N": pool},
        )
    ]
    for t in transitions:
        after, delta = t.after(r), t.delta(r)
        obligations.append(
            Obligation(
                t.name,
                [
                    pool >= 1,
                    rest >= 0,
                    rest <= pool - 1,
                    r >= 0,
                    t.pre(r),
                    counter == rest + _ind(r > 0),
                ],
                z3.And(
                    after >= 0, counter + delta == rest + _ind(after > 0), counter + delta <= pool
                ),
                {
                    "N": pool,
                    "other live pages": rest,
                    "ref": r,
                    "ref'": after,
                    "counter delta": delta,
                },
            )
        )
    free, used = z3.Ints("free used")
    obligations.append(
        Obligation(
            "usable = N - counter equals the legacy scan",
            # free/used partition the pool; live pages are used pages (free pages unreferenced)
            [pool >= 1, free >= 0, used >= 0, free + used == pool, counter >= 0, counter <= used],
            free + (used - counter) == pool - counter,
            {"N": pool, "free": free, "used": used, "num_referenced": counter},
        )
    )
    return obligations


@theorem(timeout_ms=5000)
def block_manager_counter_tracks_live_pages() -> list[Obligation]:
    """For every block-manager transition that changes one page's reference count (allocate, pin a
    prefix hit, release, truncate, evict, publish), impl's ``num_referenced`` update equals the
    change in the number of pages with ref > 0, for any pool size and any other pages (frame
    argument) — so ``referenced_count_matches_live_pages`` is inductive, and
    ``get_total_usable_blocks() = N − num_referenced`` equals legacy's
    ``len(free) + |{used : ref == 0}|``."""
    return block_manager_obligations()


# ------------------------------------------------------------------------ scheduler counter
@dataclass(frozen=True)
class ReservationCounter:
    """The running-queue counter: the scan's per-request term and the impl's two updates.

    Terms take ``(P, M, T, B)`` (T = len(table)); ``on_dequeue`` also gets ``finished``.
    """

    scan: Callable[[Any, Any, Any, Any], Any]
    on_enqueue: Callable[[Any, Any, Any, Any], Any]
    on_dequeue: Callable[[Any, Any, Any, Any, Any], Any]


def reservation_counter(variant: str) -> ReservationCounter:
    """impl/infinilm/scheduler.py: ``_reserve`` on ``complete_requests``' re-enqueue,
    ``_unreserve`` right after the decode loop's dequeue, *before* the ``is_finished`` check."""
    formula = exact if variant == "exact" else tight

    def term(P: Any, M: Any, T: Any, B: Any) -> Any:
        return formula(P, M, T, B, Z3)

    return ReservationCounter(term, term, lambda P, M, T, B, finished: term(P, M, T, B))


def reservation_counter_obligations(impl: ReservationCounter) -> list[Obligation]:
    counter, scan, rest, B, P, M, T = z3.Ints("counter scan rest B P M T")
    finished = z3.Bool("finished")
    request = [B >= 1, P >= 1, M >= 1, T >= 0]
    term = impl.scan(P, M, T, B)
    shown = {"B": B, "P": P, "M": M, "len(table)": T, "finished": finished, "scan term": term}
    enqueue = impl.on_enqueue(P, M, T, B)
    dequeue = impl.on_dequeue(P, M, T, B, finished)
    return [
        Obligation(
            "init: empty queue, counter 0",
            [counter == 0, scan == 0],
            z3.And(counter == scan, scan >= 0),
        ),
        Obligation(
            "complete_requests re-enqueues a live request",
            [*request, counter == scan, scan >= 0],
            z3.And(counter + enqueue == scan + term, scan + term >= 0),
            {**shown, "counter += ": enqueue},
        ),
        Obligation(
            # frame: P, M and the table of a queued request do not change while it is queued
            "decode loop dequeues a request (finished or not)",
            [*request, rest >= 0, rest + term == scan, counter == scan],
            z3.And(counter - dequeue == rest, counter - dequeue >= 0),
            {**shown, "counter -= ": dequeue},
        ),
    ]


@theorem(timeout_ms=5000)
def scheduler_reservation_counter_matches_scan() -> list[Obligation]:
    """For ``exact`` and ``tight``, impl's incremental ``num_reserved_decode_blocks`` equals the scan
    Σ over the running queue of the variant's reservation after every enqueue (``complete_requests``
    re-enqueue) and every dequeue (the decode loop, before the ``is_finished`` check, so finished
    requests leave the counter too), and never goes negative — given that a queued request's P, M
    and table do not change while it is queued (nothing but the decode loop touches it)."""
    obligations = []
    for variant in ("exact", "tight"):
        for ob in reservation_counter_obligations(reservation_counter(variant)):
            obligations.append(Obligation(f"{variant}: {ob.name}", ob.premises, ob.goal, ob.show))
    return obligations


# ------------------------------------------------------------------------ offload counter
@dataclass(frozen=True)
class BlockTransition:
    """One offload block ``(cached, ref_cnt)`` → ``after``, allowed when ``pre``; impl's counter
    update ``delta``. ``ref_cnt``: -1 store pending, 0 idle (evictable), > 0 loading."""

    name: str
    pre: Callable[[Any, Any], Any]
    after: Callable[[Any, Any], tuple[Any, Any]]
    delta: Callable[[Any, Any], Any]


OFFLOAD: tuple[BlockTransition, ...] = (
    # prepare_store: insert(key, BlockStatus(id)) for a key not cached: pending, not counted
    BlockTransition(
        "prepare_store insert", lambda c, r: z3.Not(c), lambda c, r: (True, -1), lambda c, r: 0
    ),
    # complete_store(success): `ref_cnt = 0; _num_evictable_cache_blocks += 1`
    BlockTransition(
        "complete_store success",
        lambda c, r: z3.And(c, r == -1),
        lambda c, r: (True, 0),
        lambda c, r: 1,
    ),
    # complete_store(failure): policy.remove(key) — "a pending block was never counted"
    BlockTransition(
        "complete_store failure",
        lambda c, r: z3.And(c, r == -1),
        lambda c, r: (False, r),
        lambda c, r: 0,
    ),
    # complete_store of a key not cached or already ready: skipped
    BlockTransition(
        "complete_store skip",
        lambda c, r: z3.Or(z3.Not(c), r >= 0),
        lambda c, r: (c, r),
        lambda c, r: 0,
    ),
    # prepare_load: `if ref_cnt == 0: -= 1`; ref_cnt += 1 (validated: cached and ready)
    BlockTransition(
        "prepare_load pin",
        lambda c, r: z3.And(c, r >= 0),
        lambda c, r: (True, r + 1),
        lambda c, r: -_ind(r == 0),
    ),
    # complete_load: ref_cnt -= 1; `if ref_cnt == 0: += 1` (validated: ref_cnt ≥ times)
    BlockTransition(
        "complete_load unpin",
        lambda c, r: z3.And(c, r >= 1),
        lambda c, r: (True, r - 1),
        lambda c, r: _ind(r - 1 == 0),
    ),
    # prepare_store eviction: the policy picks only ref_cnt == 0 blocks; `-= len(evicted)`
    BlockTransition(
        "evict victim", lambda c, r: z3.And(c, r == 0), lambda c, r: (False, r), lambda c, r: -1
    ),
    # touch / lookup: order and tracker only
    BlockTransition("touch", lambda c, r: c, lambda c, r: (c, r), lambda c, r: 0),
)


def _idle(cached: Any, ref: Any) -> z3.ArithRef:
    return _ind(z3.And(cached, ref == 0))


def offload_obligations(transitions: Sequence[BlockTransition] = OFFLOAD) -> list[Obligation]:
    evictable, rest = z3.Ints("evictable rest")
    cached, ref = z3.Bool("cached"), z3.Int("ref_cnt")
    well_formed = z3.Implies(cached, ref >= -1)
    obligations = [
        Obligation(
            "init / reset_cache: nothing cached, counter 0",
            [evictable == 0, rest == 0, z3.Not(cached)],
            rest + _idle(cached, ref) == evictable,
        )
    ]
    for t in transitions:
        cached2, ref2 = t.after(cached, ref)
        delta = t.delta(cached, ref)
        obligations.append(
            Obligation(
                t.name,
                [
                    rest >= 0,
                    well_formed,
                    t.pre(cached, ref),
                    rest + _idle(cached, ref) == evictable,
                ],
                z3.And(
                    evictable + delta == rest + _idle(cached2, ref2),
                    z3.Implies(cached2, ref2 >= -1),
                ),
                {
                    "other idle blocks": rest,
                    "cached": cached,
                    "ref_cnt": ref,
                    "ref_cnt'": ref2,
                    "counter delta": delta,
                },
            )
        )
    return obligations


@theorem(timeout_ms=5000)
def offload_evictable_counter_matches_scan() -> list[Obligation]:
    """For every offload-manager transition of one block (store insert, store completion success /
    failure / skip, load pin and unpin, eviction of a victim, touch) impl's
    ``_num_evictable_cache_blocks`` update equals the change in the number of cached blocks with
    ``ref_cnt == 0``, for any number of other blocks; ``reset_cache`` sets both to 0. So the
    #45757 guard (``need > evictable → None``) reads the exact count and never changes a result."""
    return offload_obligations()
