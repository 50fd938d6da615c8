"""Admission soundness: an inductive invariant of an abstract InfiniLM scheduler, per variant.

The question (docs/formal.md, "Admission soundness"): with no preemption (reference §5.9), can a decode
step find the pool empty? The lockstep search says no without a PD connector and yes with one.
Here it is proved (or refuted) for every pool size, page size, prompt and output length.

**Abstract state.** ``U`` = usable pages = ``N − |{p : ref(p) > 0}|`` (free pages plus unreferenced
cached pages: what ``get_total_usable_blocks`` returns and what a reclaim can hand out). Every
request with pages is in one class: *running* (in the running queue), *batch* (admitted to this
step's prefill batch), *pending* (remote-pending, PD), *in flight* (dequeued into this step's decode
batch), *waiting-with-pages* (re-queued after a partial remote failure, §9.11). For a request,
``need`` = pages it will still allocate (``max(⌈(P+M−1)/B⌉ − len(table), 0)``, the least cover:
``reservation_tight_is_minimal``) and ``counted`` = what admission counts for it: the variant's
running reservation, the prefill extra ``exact`` for batch admits, the variant's remote reservation
for pending requests, 0 for waiting-with-pages (admission does not see them), and — bookkeeping
only — ``need`` for in-flight requests (no admission runs while a step is in flight). Aggregates:
``Nv`` = Σ need and ``Av`` = Σ counted over the classes admission sees (and in-flight), ``F`` = Σ
need in flight, ``W`` = Σ need waiting-with-pages.

**Invariant.** ``Σ need ≤ U`` over the requests admission sees, and per request ``need ≤
counted`` (the reservation theorems). A transition acts on one request; the others are a frame
(``rest`` aggregates, each satisfying the per-request inequality), so the proof holds for any
number of requests. Safety follows: a decode step that needs a page has ``need ≥ 1``
(``decode_page_is_reserved``), so ``U ≥ 1`` — a reclaim finds a page.

**Transitions** (as the spec implements them; reference §5.3–§5.6): admission of a fresh
candidate (k cached pages, k·B ≤ P−1, z of them unreferenced and pinned before the check; the check
``Av + ⌈(P−k·B+M)/B⌉ ≤ U − z``; the prefill allocates ``⌈P/B⌉ − k`` pages); a rejected candidate
changes nothing (pins are undone, evictions keep ``U``); end of step: batch → running with g = 1
or finished; decode: running → in flight (``append_slot``: a page iff ``(P+g−1) mod B = 0``), then
in flight → running (g+1 < M) or finished; any request leaving (finish, abort, full remote failure,
parking in ``pending_free_blocks``) releases or parks pages, ``U`` never drops. With a connector
also: asynchronous admission (→ pending), promotion (pending → in flight, no allocation), partial
failure (pending → waiting-with-pages) and the §9.11 requeue (waiting-with-pages → batch, no
admission check).

**Assumptions** (stated, not proved): no speculative draft tokens (``append_verify_slots`` may
allocate beyond M, §9.15); ``max_tokens ≥ 1`` and the engine finishes a request at g = M (§9.16);
prefill is not chunked (one admission allocates the whole prompt); mamba rows only make admission
reject (their failure path releases the new pages, which stay usable, §9.13); the running queue's
reservation is the scan (the counters equal it: ``scheduler_reservation_counter_matches_scan``);
``U`` is the live-page count (``block_manager_counter_tracks_live_pages``); requests are
single-threaded between ``schedule()`` calls (aborts are applied before it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from proofs.z3_arith import (
    Z3,
    candidate_facts,
    candidate_term,
    decode_facts,
    exact,
    need,
    remote_table,
    running_table,
)
from proofs.z3_arith import remote_reservation as remote_formula
from proofs.z3_arith import running_reservation as running_formula
from proofs.z3_core import COUNTEREXAMPLE, PROVED, Obligation, theorem

RunningReservation = Callable[[Any, Any, Any, Any], Any]  # (P, g, M, B) -> pages
RemoteReservation = Callable[[Any, Any, Any], Any]  # (P, M, B) -> pages


@dataclass(frozen=True)
class Reservations:
    """What a variant's admission counts for running and remote-pending requests."""

    running: RunningReservation
    remote: RemoteReservation


def variant_reservations(variant: str) -> Reservations:
    return Reservations(
        lambda P, g, M, B: running_formula(variant, P, g, M, B, Z3),
        lambda P, M, B: remote_formula(variant, P, M, B, Z3),
    )


@dataclass(frozen=True)
class State:
    usable: z3.ArithRef  # U: usable pages
    need: z3.ArithRef  # Nv: Σ need over requests admission sees (+ in flight)
    counted: z3.ArithRef  # Av: Σ counted over the same requests
    flight: z3.ArithRef  # F: Σ need in flight
    waiting: z3.ArithRef  # W: Σ need waiting-with-pages (invisible to admission)


def _state(tag: str) -> State:
    return State(*z3.Ints(f"U{tag} Nv{tag} Av{tag} F{tag} W{tag}"))


def invariant(s: State) -> list[z3.BoolRef]:
    return [
        s.usable >= 0,
        s.need >= 0,
        s.need <= s.counted,
        s.need <= s.usable,
        s.flight >= 0,
        s.flight <= s.need,
        s.waiting >= 0,
    ]


class _Builder:
    """Shared variables and helpers for one soundness theorem's obligations."""

    def __init__(self, res: Reservations) -> None:
        self.res = res
        self.B, self.P, self.M, self.g = z3.Ints("B P M g")
        self.k, self.z = z3.Ints("k z")
        self.n_rest, self.a_rest, self.f_rest, self.w_rest = z3.Ints("Nrest Arest Frest Wrest")
        self.s, self.t = _state(""), _state("'")

    def request(self) -> list[z3.BoolRef]:
        return [self.B >= 1, self.P >= 1, self.M >= 1]

    def rest(self) -> list[z3.BoolRef]:
        """Every other request satisfies need ≤ counted, so their sums do too."""
        return [
            self.n_rest >= 0,
            self.n_rest <= self.a_rest,
            self.f_rest >= 0,
            self.f_rest <= self.n_rest,
            self.w_rest >= 0,
        ]

    def show(self, **extra: Any) -> dict[str, Any]:
        s, t = self.s, self.t
        shown: dict[str, Any] = {
            "B": self.B,
            "P": self.P,
            "M": self.M,
            "usable": s.usable,
            "visible_need": s.need,
            "visible_counted": s.counted,
            "waiting_with_pages_need": s.waiting,
        }
        shown.update(extra)
        shown.update({"usable'": t.usable, "visible_need'": t.need})
        return shown

    def step(
        self,
        name: str,
        pre: list[z3.BoolRef],
        post: list[z3.BoolRef],
        goals: list[Any],
        **show: Any,
    ) -> Obligation:
        return Obligation(
            name,
            [*invariant(self.s), *pre, *post],
            z3.And(*invariant(self.t), *goals),
            self.show(**show),
        )

    # ----------------------------------------------------------------- transitions
    def admit(self, *, asynchronous: bool) -> Obligation:
        """A fresh candidate passes the check and is allocated its prompt pages."""
        B, P, M, k, z, s, t = self.B, self.P, self.M, self.k, self.z, self.s, self.t
        T = remote_table(P, B)
        n = need(P, M, T, B)
        counted = self.res.remote(P, M, B) if asynchronous else exact(P, M, T, B)
        own = candidate_term(P, k, M, B)
        pre = [
            *self.request(),
            s.flight == 0,  # admission runs in the prefill phase: nothing in flight
            k >= 0,
            k * B <= P - 1,  # the P−1 prefix-hit cap (§9.7)
            z >= 0,
            z <= k,
            z <= s.usable,  # pinned unreferenced pages were usable
            s.counted + own <= s.usable - z,  # can_accept_request, after the pins
            *candidate_facts(P, k, M, B),  # reused lemma: candidate_term_covers_prefill_and_decode
        ]
        post = [
            t.usable == s.usable - z - (T - k),
            t.need == s.need + n,
            t.counted == s.counted + counted,
            t.flight == s.flight,
            t.waiting == s.waiting,
        ]
        return self.step(
            "admit (async, to pending)" if asynchronous else "admit (to prefill batch)",
            pre,
            post,
            [n <= counted],
            k=k,
            own=own,
            need=n,
        )

    def batch_done(self, *, finished: bool) -> Obligation:
        """End of step: a prefill-batch request (len(table) = ⌈P/B⌉) runs with g = 1, or finished."""
        B, P, M, s, t = self.B, self.P, self.M, self.s, self.t
        T = remote_table(P, B)
        n, extra = need(P, M, T, B), exact(P, M, T, B)
        pre = [
            *self.request(),
            *self.rest(),
            s.need == self.n_rest + n,
            s.counted == self.a_rest + extra,
        ]
        pre += [s.flight == self.f_rest]
        if finished:
            post = [t.usable >= s.usable, t.need == self.n_rest, t.counted == self.a_rest]
            goals: list[Any] = []
        else:
            running = self.res.running(P, 1, M, B)
            post = [
                t.usable == s.usable,
                t.need == self.n_rest + n,
                t.counted == self.a_rest + running,
            ]
            pre.append(M >= 2)  # g = 1 < M, else the engine finished it
            goals = [n <= running, running_table(P, 1, B) == T]
        post += [t.flight == s.flight, t.waiting == s.waiting]
        return self.step(
            "prefill batch -> " + ("finished" if finished else "running"), pre, post, goals
        )

    def _running_pre(self) -> tuple[list[z3.BoolRef], Any, Any, Any]:
        B, P, M, g, s = self.B, self.P, self.M, self.g, self.s
        T = running_table(P, g, B)
        n = need(P, M, T, B)
        counted = self.res.running(P, g, M, B)
        pre = [*self.request(), g >= 1, g < M, *self.rest()]
        pre += [
            s.need == self.n_rest + n,
            s.counted == self.a_rest + counted,
            s.flight == self.f_rest,
        ]
        pre += decode_facts(P, g, M, B)  # reused lemma: decode_page_is_reserved
        return pre, T, n, counted

    def decode_append(self) -> Obligation:
        """The decode loop dequeues a running request and ``append_slot`` runs."""
        B, P, M, g, s, t = self.B, self.P, self.M, self.g, self.s, self.t
        pre, T, n, _ = self._running_pre()
        page = z3.If((P + g - 1) % B == 0, 1, 0)
        n2 = need(P, M, T + page, B)
        post = [
            t.usable == s.usable - page,
            t.need == self.n_rest + n2,
            t.counted == self.a_rest + n2,
        ]
        post += [t.flight == s.flight + n2, t.waiting == s.waiting]
        goals = [T + page == running_table(P, g + 1, B), n2 >= 0]
        return self.step("decode: running -> in flight", pre, post, goals, g=g, page=page, need=n)

    def decode_safety(self) -> Obligation:
        """When ``append_slot`` needs a page, a usable page exists (the pool is not empty)."""
        B, P, g, s = self.B, self.P, self.g, self.s
        pre, _, n, _ = self._running_pre()
        page = (P + g - 1) % B == 0
        return Obligation(
            "decode finds a page",
            [*invariant(s), *pre],
            z3.Implies(page, s.usable >= 1),
            {"B": B, "P": P, "M": self.M, "g": g, "need": n, "usable": s.usable},
        )

    def inflight_done(self, *, finished: bool) -> Obligation:
        """After the step an in-flight request (now g1 ≥ 1 tokens) runs again, or finished."""
        B, P, M, g, s, t = self.B, self.P, self.M, self.g, self.s, self.t
        T = running_table(P, g, B)  # here g is the count after the step (g1)
        n = need(P, M, T, B)
        pre = [*self.request(), g >= 1, g <= M, *self.rest()]
        pre += [
            s.need == self.n_rest + n,
            s.counted == self.a_rest + n,
            s.flight == self.f_rest + n,
        ]
        if finished:
            post = [t.usable >= s.usable, t.need == self.n_rest, t.counted == self.a_rest]
            goals: list[Any] = []
        else:
            running = self.res.running(P, g, M, B)
            pre.append(g < M)
            post = [
                t.usable == s.usable,
                t.need == self.n_rest + n,
                t.counted == self.a_rest + running,
            ]
            goals = [n <= running]
        post += [t.flight == self.f_rest, t.waiting == s.waiting]
        return self.step(
            "in flight -> " + ("finished" if finished else "running"), pre, post, goals, g=g
        )

    def leave(self) -> Obligation:
        """A visible request leaves (finish, abort, full remote failure, parked pages)."""
        s, t = self.s, self.t
        n, a = z3.Ints("need_r counted_r")
        pre = [
            *self.rest(),
            n >= 0,
            n <= a,
            s.need == self.n_rest + n,
            s.counted == self.a_rest + a,
        ]
        pre += [s.flight == self.f_rest]
        post = [
            t.usable >= s.usable,
            t.need == self.n_rest,
            t.counted == self.a_rest,
            t.flight == s.flight,
            t.waiting == s.waiting,
        ]
        return self.step("a request leaves", pre, post, [])

    def _pending_pre(self) -> tuple[list[z3.BoolRef], Any, Any, Any]:
        B, P, M, s = self.B, self.P, self.M, self.s
        T = remote_table(P, B)
        n = need(P, M, T, B)
        counted = self.res.remote(P, M, B)
        pre = [
            *self.request(),
            *self.rest(),
            s.need == self.n_rest + n,
            s.counted == self.a_rest + counted,
        ]
        pre += [s.flight == self.f_rest]
        return pre, T, n, counted

    def promote(self) -> Obligation:
        """A finished receive: pending → decode batch (computes its last prompt token; no page)."""
        B, P, s, t = self.B, self.P, self.s, self.t
        pre, T, n, _ = self._pending_pre()
        post = [
            t.usable == s.usable,
            t.need == s.need,
            t.counted == self.a_rest + n,
            t.flight == s.flight + n,
            t.waiting == s.waiting,
        ]
        return self.step(
            "promote: pending -> in flight", pre, post, [running_table(P, 1, B) == T], need=n
        )

    def fail_partial(self) -> Obligation:
        """A failed receive with some valid pages: pending → waiting-with-pages (§5.6)."""
        s, t = self.s, self.t
        pre, _, n, _ = self._pending_pre()
        # some computed tokens survive only past a valid first page or a prefix hit: P > B
        pre.append(self.P >= self.B + 1)
        post = [
            t.usable == s.usable,
            t.need == self.n_rest,
            t.counted == self.a_rest,
            t.flight == s.flight,
            t.waiting == s.waiting + n,
        ]
        return self.step("partial failure: pending -> waiting-with-pages", pre, post, [], need=n)

    def requeue(self) -> Obligation:
        """§9.11: the waiting-with-pages request joins the prefill batch without admission."""
        B, P, M, s, t = self.B, self.P, self.M, self.s, self.t
        T = remote_table(P, B)
        n, extra = need(P, M, T, B), exact(P, M, T, B)
        pre = [*self.request(), P >= B + 1, self.w_rest >= 0, s.waiting == self.w_rest + n]
        post = [
            t.usable == s.usable,
            t.need == s.need + n,
            t.counted == s.counted + extra,
            t.flight == s.flight,
            t.waiting == self.w_rest,
        ]
        return self.step(
            "requeue after partial failure (no admission check)", pre, post, [], need=n
        )

    def release_parked(self) -> Obligation:
        """A transfer finishes for pages parked in ``pending_free_blocks``: they are released."""
        s, t = self.s, self.t
        post = [
            t.usable >= s.usable,
            t.need == s.need,
            t.counted == s.counted,
            t.flight == s.flight,
            t.waiting == s.waiting,
        ]
        return self.step(
            "parked pages released (finished_recving / finished_sending)", [], post, []
        )

    def waiting_leaves(self) -> Obligation:
        """A waiting-with-pages request is aborted: its pages are released or parked."""
        s, t = self.s, self.t
        n = z3.Int("need_r")
        pre = [n >= 0, self.w_rest >= 0, s.waiting == self.w_rest + n]
        post = [
            t.usable >= s.usable,
            t.need == s.need,
            t.counted == s.counted,
            t.flight == s.flight,
            t.waiting == self.w_rest,
        ]
        return self.step("waiting-with-pages request leaves", pre, post, [])


def soundness_obligations(res: Reservations, *, connector: str = "none") -> list[Obligation]:
    """Init, consecution for every transition, and decode safety.

    ``connector``: ``"none"``; ``"full-failures"`` (a connector whose failed receives are all
    treated as full failures, so the §9.11 requeue never happens); ``"partial-failures"`` (the
    spec's connector handling, §9.11 requeue included).
    """
    b = _Builder(res)
    N = z3.Int("N")
    s = b.s
    init = Obligation(
        "init",
        [N >= 0, s.usable == N, s.need == 0, s.counted == 0, s.flight == 0, s.waiting == 0],
        z3.And(*invariant(s)),
        {"N": N},
    )
    obligations = [
        init,
        b.admit(asynchronous=False),
        b.batch_done(finished=False),
        b.batch_done(finished=True),
        b.decode_safety(),
        b.decode_append(),
        b.inflight_done(finished=False),
        b.inflight_done(finished=True),
        b.leave(),
    ]
    if connector != "none":
        obligations += [b.admit(asynchronous=True), b.promote(), b.release_parked()]
    if connector == "partial-failures":
        obligations += [b.fail_partial(), b.requeue(), b.waiting_leaves()]
    return obligations


def requeue_oom_execution(extra: Sequence[z3.BoolRef] = ()) -> Obligation:
    """A concrete execution from an empty pool of N pages (no prefix caching), the lockstep
    checker's shape (stateful_tests/counterexamples/admission_soundness_*.json):

    1. r0 (P0 > B, so its table has ≥ 2 pages) is admitted asynchronously on the empty pool:
       ``⌈(P0+M0)/B⌉ ≤ N``; it holds ``⌈P0/B⌉`` pages;
    2. r0's receive fails with a page i ≥ 1 invalid: i·B tokens stay computed (partial failure);
       its remote reservation is released and it waits with its pages;
    3. r1 is admitted (asynchronously: it never decodes): ``⌈(P1+M1)/B⌉ + 0 ≤ N − ⌈P0/B⌉`` —
       nothing counts r0's need;
    4. r0 is re-queued into a prefill batch without a check (§9.11) and runs (M0 ≥ 2);
    5. r0's decodes need ``need(r0)`` more pages but only ``N − ⌈P0/B⌉ − ⌈P1/B⌉`` are usable.

    The claim refuted: "r0's decodes always find a page". The variant never enters: r0's
    reservation was released at step 2 and r1's admission sees no running request."""
    N, B, P0, M0, P1, M1 = z3.Ints("N B P0 M0 P1 M1")
    T0, T1 = remote_table(P0, B), remote_table(P1, B)
    U1 = N - T0
    U2 = U1 - T1
    need0 = need(P0, M0, T0, B)
    premises = [
        B >= 1,
        P0 >= B + 1,
        M0 >= 2,
        P1 >= 1,
        M1 >= 1,
        candidate_term(P0, 0, M0, B) <= N,
        candidate_term(P1, 0, M1, B) <= U1,
        *extra,
    ]
    shown = {"N": N, "B": B, "P0": P0, "M0": M0, "P1": P1, "M1": M1}
    shown |= {"need(r0)": need0, "usable at r0's decodes": U2}
    return Obligation("reachable decode OOM after the requeue", premises, need0 <= U2, shown)


def _register(variant: str) -> None:
    res = variant_reservations(variant)

    def without_connector() -> list[Obligation]:
        return soundness_obligations(res)

    def full_failures() -> list[Obligation]:
        return soundness_obligations(res, connector="full-failures")

    def partial_failures() -> list[Obligation]:
        return [
            *soundness_obligations(res, connector="partial-failures"),
            requeue_oom_execution(),
        ]

    without_connector.__doc__ = (
        f"Admission soundness, {variant} reservation, no PD connector: if every admission keeps "
        f"Σ need ≤ usable pages over the live requests (it does: the {variant} reservation of "
        f"every running request is ≥ its need), then admissions, decode steps, completions and "
        f"aborts preserve it, so a decode step never finds the pool empty. Inductive for any "
        f"pool size, page size and request mix; assumes no draft tokens (module docstring)."
    )
    full_failures.__doc__ = (
        f"Admission soundness, {variant} reservation, with a PD connector whose failed receives "
        f"are all full failures (pages released, request re-admitted from scratch): still sound "
        f"— asynchronous admission and promotion preserve the invariant, so the connector alone "
        f"is not the hole; the §9.11 requeue is."
    )
    partial_failures.__doc__ = (
        f"Admission soundness, {variant} reservation, with a PD connector and the spec's "
        f"partial-failure requeue (§9.11: a request re-queued after a partially failed receive "
        f"joins the prefill batch without an admission check): REFUTED. While it waits its "
        f"decode need is counted nowhere, other admissions may take the pages, and the requeue "
        f"breaks Σ need ≤ usable — the lockstep checker's counterexamples "
        f"(stateful_tests/counterexamples/admission_soundness_{variant}.json). Expected: a "
        f"counterexample at the requeue transition, and a concrete execution from the empty "
        f"pool (``requeue_oom_execution``) whose decode finds the pool empty."
    )
    theorem(PROVED, timeout_ms=10_000, name=f"admission_sound_{variant}")(without_connector)
    theorem(PROVED, timeout_ms=10_000, name=f"admission_sound_pd_full_failures_{variant}")(
        full_failures
    )
    theorem(COUNTEREXAMPLE, timeout_ms=10_000, name=f"admission_sound_pd_requeue_{variant}")(
        partial_failures
    )


for _variant in ("legacy", "exact", "tight"):
    _register(_variant)
