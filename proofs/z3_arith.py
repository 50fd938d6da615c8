"""Ceiling division and the InfiniLM reservation formulas, over unbounded integers.

Notation (docs/infinilm.md §7.1; spec/infinilm/scheduler.py): B page size, P prompt length,
g generated tokens, M ``max_tokens``, T = len(block_table), ``⌈x/B⌉ = (x + B - 1) // B``
(``spec.infinilm.block_manager.ceil_div``; z3's integer division is floor division for B ≥ 1, so
the z3 term is the same expression).

The formulas below are written once, over an arithmetic :class:`Backend`: :data:`Z3` builds z3
terms for the proofs, :data:`PY` evaluates the *same* code on Python ints, and the tests compare
``PY`` with the spec's own functions (``legacy_running_blocks``, ``exact_blocks``,
``tight_blocks``, ``remote_reservation``) on a grid, so a drift between proof model and spec fails
a test. As derived from the spec code:

* table of a running request (g ≥ 1, no draft slack): ``T = ⌈(P+g-1)/B⌉`` (reference §8.2 inv. 13);
  of a remote-pending request: ``T = ⌈P/B⌉`` (its prompt pages are allocated at admission);
* ``legacy`` running ``⌈(M-g)/B⌉``, remote ``⌈M/B⌉`` (``legacy_running_blocks``,
  ``remote_reservation("legacy")``);
* ``exact`` ``max(⌈(P+M)/B⌉ - T, 0)`` (``exact_blocks``), running and remote alike;
* ``tight`` ``max(⌈(P+M-1)/B⌉ - T, 0)`` (``tight_blocks``), running and remote alike;
* the true remaining need: the KV of tokens ``0 .. P+M-2`` is written (the last generated token's
  KV never is), so the least ``n ≥ 0`` with ``B·(T+n) ≥ P+M-1``;
* the candidate's own admission term ``⌈(P - local + M)/B⌉`` with ``local = k·B`` for ``k`` cached
  pages, ``k·B ≤ P-1`` (the P−1 hit cap, §9.7); the prefill allocates ``⌈P/B⌉ - k`` pages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import z3

from proofs.z3_core import COUNTEREXAMPLE, Obligation, theorem

VARIANTS = ("legacy", "exact", "tight")


@dataclass(frozen=True)
class Backend:
    """The two operations the formulas need beyond ``+ - *``."""

    ceil_div: Callable[[Any, Any], Any]
    maximum: Callable[[Any, Any], Any]


Z3 = Backend(lambda x, b: (x + b - 1) / b, lambda a, b: z3.If(a >= b, a, b))
PY = Backend(lambda x, b: (x + b - 1) // b, max)


# ------------------------------------------------------------------------------- the formulas
def running_table(P: Any, g: Any, B: Any, ar: Backend = Z3) -> Any:
    """Pages held by a running request after g ≥ 1 generated tokens: ``⌈(P+g-1)/B⌉``."""
    return ar.ceil_div(P + g - 1, B)


def remote_table(P: Any, B: Any, ar: Backend = Z3) -> Any:
    """Pages held by a remote-pending (or just-prefilled) request: ``⌈P/B⌉``."""
    return ar.ceil_div(P, B)


def need(P: Any, M: Any, T: Any, B: Any, ar: Backend = Z3) -> Any:
    """Pages still to be allocated: ``max(⌈(P+M-1)/B⌉ - T, 0)`` (the least sufficient number,
    theorem ``reservation_tight_is_minimal``)."""
    return ar.maximum(ar.ceil_div(P + M - 1, B) - T, 0)


def legacy_running(P: Any, g: Any, M: Any, B: Any, ar: Backend = Z3) -> Any:
    return ar.ceil_div(M - g, B)


def legacy_remote(M: Any, B: Any, ar: Backend = Z3) -> Any:
    return ar.ceil_div(M, B)


def exact(P: Any, M: Any, T: Any, B: Any, ar: Backend = Z3) -> Any:
    return ar.maximum(ar.ceil_div(P + M, B) - T, 0)


def tight(P: Any, M: Any, T: Any, B: Any, ar: Backend = Z3) -> Any:
    return ar.maximum(ar.ceil_div(P + M - 1, B) - T, 0)


def running_reservation(variant: str, P: Any, g: Any, M: Any, B: Any, ar: Backend = Z3) -> Any:
    """The running queue's reservation of one request, per variant."""
    T = running_table(P, g, B, ar)
    if variant == "legacy":
        return legacy_running(P, g, M, B, ar)
    return exact(P, M, T, B, ar) if variant == "exact" else tight(P, M, T, B, ar)


def remote_reservation(variant: str, P: Any, M: Any, B: Any, ar: Backend = Z3) -> Any:
    """``pending_kv_decode_blocks``' share of one remote-pending request, per variant."""
    T = remote_table(P, B, ar)
    if variant == "legacy":
        return legacy_remote(M, B, ar)
    return exact(P, M, T, B, ar) if variant == "exact" else tight(P, M, T, B, ar)


def candidate_term(P: Any, k: Any, M: Any, B: Any, ar: Backend = Z3) -> Any:
    """The candidate's own admission term ``⌈(P - k·B + M)/B⌉`` (every variant)."""
    return ar.ceil_div(P - k * B + M, B)


def covers(T: Any, n: Any, P: Any, M: Any, B: Any) -> Any:
    """``T + n`` pages hold the KV of every token that will ever be written (``P+M-1`` tokens)."""
    return B * (T + n) >= P + M - 1


def least_cover(T: Any, n: Any, P: Any, M: Any, B: Any) -> Any:
    """``n`` is the least non-negative number of extra pages that covers."""
    return z3.And(n >= 0, covers(T, n, P, M, B), z3.Or(n == 0, z3.Not(covers(T, n - 1, P, M, B))))


# ------------------------------------------------------------------------------- domains
def running_domain(B: Any, P: Any, g: Any, M: Any) -> list[z3.BoolRef]:
    """A request in the running queue: ``B ≥ 1, P ≥ 1, 1 ≤ g ≤ M``."""
    return [B >= 1, P >= 1, g >= 1, g <= M]


def remote_domain(B: Any, P: Any, M: Any) -> list[z3.BoolRef]:
    """A remote-pending request: ``B ≥ 1, P ≥ 1, M ≥ 1`` (g = 0)."""
    return [B >= 1, P >= 1, M >= 1]


# ------------------------------------------------------------------------------- ceil lemmas
X, Y, K, B_ = z3.Ints("x y k B")
CEIL = Z3.ceil_div


def lemma_bounds(x: Any, b: Any) -> z3.BoolRef:
    return z3.And(b * CEIL(x, b) >= x, b * (CEIL(x, b) - 1) < x)


def lemma_monotone(x: Any, y: Any, b: Any) -> z3.BoolRef:
    return z3.Implies(x <= y, CEIL(x, b) <= CEIL(y, b))


def lemma_subadditive(x: Any, y: Any, b: Any) -> z3.BoolRef:
    return CEIL(x + y, b) <= CEIL(x, b) + CEIL(y, b)


def lemma_superadditive(x: Any, y: Any, b: Any) -> z3.BoolRef:
    return CEIL(x, b) + CEIL(y, b) <= CEIL(x + y, b) + 1


def lemma_shift(x: Any, k: Any, b: Any) -> z3.BoolRef:
    return CEIL(x + k * b, b) == CEIL(x, b) + k


def lemma_step(x: Any, b: Any) -> z3.BoolRef:
    return CEIL(x + 1, b) == CEIL(x, b) + z3.If(x % b == 0, 1, 0)


def _lemma(name: str, claim: z3.BoolRef) -> list[Obligation]:
    return [Obligation(name, [B_ >= 1], claim, {"x": X, "y": Y, "k": K, "B": B_})]


@theorem(timeout_ms=5000)
def ceil_div_bounds() -> list[Obligation]:
    """For every integer x and B ≥ 1: B·⌈x/B⌉ ≥ x > B·(⌈x/B⌉ − 1) — ⌈x/B⌉ is the least number of
    pages of B tokens that hold x tokens (x ≤ 0 included: then it is ≤ 0)."""
    return _lemma("bounds", lemma_bounds(X, B_))


@theorem(timeout_ms=5000)
def ceil_div_monotone() -> list[Obligation]:
    """x ≤ y implies ⌈x/B⌉ ≤ ⌈y/B⌉ (more tokens never need fewer pages)."""
    return _lemma("monotone", lemma_monotone(X, Y, B_))


@theorem(timeout_ms=5000)
def ceil_div_subadditive() -> list[Obligation]:
    """⌈(x+y)/B⌉ ≤ ⌈x/B⌉ + ⌈y/B⌉: pages for two spans laid end to end never exceed the pages
    of each span rounded up separately (why legacy's fresh-page count covers the need)."""
    return _lemma("subadditive", lemma_subadditive(X, Y, B_))


@theorem(timeout_ms=5000)
def ceil_div_superadditive() -> list[Obligation]:
    """⌈x/B⌉ + ⌈y/B⌉ ≤ ⌈(x+y)/B⌉ + 1: rounding two spans separately costs at most one page."""
    return _lemma("superadditive", lemma_superadditive(X, Y, B_))


@theorem(timeout_ms=5000)
def ceil_div_shift() -> list[Obligation]:
    """⌈(x + k·B)/B⌉ = ⌈x/B⌉ + k for every integer k: k whole pages more are k pages more."""
    return _lemma("shift", lemma_shift(X, K, B_))


@theorem(timeout_ms=5000)
def ceil_div_step() -> list[Obligation]:
    """⌈(x+1)/B⌉ = ⌈x/B⌉ + 1 if x mod B = 0, else ⌈x/B⌉: one more token needs a new page exactly
    when the tokens so far fill whole pages — ``append_slot``'s ``(L-1) % B == 0`` rule."""
    return _lemma("step", lemma_step(X, B_))


@theorem(timeout_ms=5000)
def ceil_div_least_cover() -> list[Obligation]:
    """For every T: n = max(⌈x/B⌉ − T, 0) is the least n ≥ 0 with B·(T+n) ≥ x — "pages still to
    allocate" written with ceil is the minimal top-up of a T-page table."""
    T = z3.Int("T")
    x_ = X
    n_def = z3.If(CEIL(x_, B_) - T >= 0, CEIL(x_, B_) - T, 0)
    claim = z3.And(n_def >= 0, B_ * (T + n_def) >= x_, z3.Or(n_def == 0, B_ * (T + n_def - 1) < x_))
    return [Obligation("least_cover", [B_ >= 1], claim, {"x": x_, "T": T, "B": B_})]


# ------------------------------------------------------------------------------- reservations
P, G, M, B = z3.Ints("P g M B")


def _running_terms() -> dict[str, z3.ExprRef]:
    T = running_table(P, G, B)
    return {
        "table": T,
        "need": need(P, M, T, B),
        "legacy": running_reservation("legacy", P, G, M, B),
        "exact": running_reservation("exact", P, G, M, B),
        "tight": running_reservation("tight", P, G, M, B),
    }


def _remote_terms() -> dict[str, z3.ExprRef]:
    T = remote_table(P, B)
    return {
        "table": T,
        "need": need(P, M, T, B),
        "legacy": remote_reservation("legacy", P, M, B),
        "exact": remote_reservation("exact", P, M, B),
        "tight": remote_reservation("tight", P, M, B),
    }


def _show(terms: Mapping[str, z3.ExprRef], *, running: bool) -> dict[str, z3.ExprRef]:
    shown: dict[str, z3.ExprRef] = {"B": B, "P": P}
    if running:
        shown["g"] = G
    shown["M"] = M
    shown.update({("len(table)" if k == "table" else k): v for k, v in terms.items()})
    return shown


def _both(name: str, goal: Callable[[Mapping[str, z3.ExprRef]], z3.BoolRef]) -> list[Obligation]:
    run, rem = _running_terms(), _remote_terms()
    return [
        Obligation(
            f"{name} (running)", running_domain(B, P, G, M), goal(run), _show(run, running=True)
        ),
        Obligation(
            f"{name} (remote)", remote_domain(B, P, M), goal(rem), _show(rem, running=False)
        ),
    ]


def _covers(variant: str) -> list[Obligation]:
    return _both(
        f"{variant} covers",
        lambda t: z3.And(covers(t["table"], t[variant], P, M, B), t[variant] >= t["need"]),
    )


@theorem(timeout_ms=5000)
def reservation_legacy_covers_need() -> list[Obligation]:
    """Legacy never under-reserves: for a running request (B ≥ 1, P ≥ 1, 1 ≤ g ≤ M,
    len(table) = ⌈(P+g−1)/B⌉) ⌈(M−g)/B⌉ more pages hold every token's KV
    (B·(len(table) + r) ≥ P+M−1), and so does ⌈M/B⌉ for a remote-pending request
    (len(table) = ⌈P/B⌉); both are ≥ the true need (ceil_div_subadditive)."""
    return _covers("legacy")


@theorem(timeout_ms=5000)
def reservation_exact_covers_need() -> list[Obligation]:
    """The exact PR never under-reserves: max(⌈(P+M)/B⌉ − len(table), 0) pages more hold every
    token's KV, running (len(table) = ⌈(P+g−1)/B⌉) and remote-pending (len(table) = ⌈P/B⌉)."""
    return _covers("exact")


@theorem(timeout_ms=5000)
def reservation_tight_is_minimal() -> list[Obligation]:
    """Tight is exactly the true remaining need: max(⌈(P+M−1)/B⌉ − len(table), 0) is the *least*
    n ≥ 0 with B·(len(table) + n) ≥ P+M−1, for running and remote-pending requests — it covers,
    and one page fewer would not."""
    return _both(
        "tight is the least cover",
        lambda t: z3.And(least_cover(t["table"], t["tight"], P, M, B), t["tight"] == t["need"]),
    )


@theorem(timeout_ms=5000)
def reservation_tight_le_exact() -> list[Obligation]:
    """tight ≤ exact for every running and remote-pending request."""
    return _both("tight <= exact", lambda t: t["tight"] <= t["exact"])


@theorem(timeout_ms=5000)
def reservation_tight_le_legacy() -> list[Obligation]:
    """tight ≤ legacy for every running and remote-pending request."""
    return _both("tight <= legacy", lambda t: t["tight"] <= t["legacy"])


def _replay_running(values: Mapping[str, Any]) -> str:
    """Rebuild the counterexample's request and ask the spec's own reservation functions."""
    from spec.infinilm.scheduler import exact_blocks, legacy_running_blocks, tight_blocks

    req = spec_request(values["P"], values["g"], values["M"], values["B"])
    b = values["B"]
    return (
        f"spec functions on that request: legacy_running_blocks={legacy_running_blocks(req, b)}, "
        f"exact_blocks={exact_blocks(req, b)}, tight_blocks={tight_blocks(req, b)}"
    )


def spec_request(P: int, g: int, M: int, B: int, *, table: int | None = None) -> Any:
    """A spec ``InferenceRequest`` with P prompt tokens, g generated, ``max_tokens`` M and a table of
    ``table`` pages (default: the running table ``⌈(P+g-1)/B⌉``, or ``⌈P/B⌉`` when g = 0)."""
    from spec.infinilm.request import InferenceRequest, SamplingParams

    req = InferenceRequest("r", [0] * P, SamplingParams(M))
    for _ in range(g):
        req.append_generated_token_id(0)
    if table is None:
        table = running_table(P, g, B, PY) if g else remote_table(P, B, PY)
    req.block_table = list(range(table))
    req.num_blocks = table
    return req


@theorem(COUNTEREXAMPLE, timeout_ms=5000, confirm=_replay_running)
def reservation_exact_le_legacy() -> list[Obligation]:
    """The claim "the exact PR never reserves more than legacy" — exact ≤ legacy for every running
    request (B ≥ 1, P ≥ 1, 1 ≤ g < M, len(table) = ⌈(P+g−1)/B⌉) — is FALSE: exact counts the
    last generated token's KV, which is never written, and can reserve one page more than legacy
    when P+M ≡ 1 (mod B) (reference §7.1). The search is restricted to B ≥ 2 (with B = 1 exact is
    always legacy + 1, a less telling witness). Expected: a counterexample."""
    run = _running_terms()
    return [
        Obligation(
            "exact <= legacy",
            [*running_domain(B, P, G, M), G < M, B >= 2],
            run["exact"] <= run["legacy"],
            _show(run, running=True),
        )
    ]


@theorem(timeout_ms=5000)
def reservation_exact_exceeds_legacy_only_at_the_boundary() -> list[Obligation]:
    """How far the refutation of exact ≤ legacy goes: for every running request (1 ≤ g < M)
    exact ≤ legacy + 1, and exact > legacy only when P+M ≡ 1 (mod B) — the one token whose KV is
    never written spills onto a page of its own (reference §7.1). (From ceil_div_subadditive and
    ceil_div_step at x = P+g−1, y = M−g.)"""
    run = _running_terms()
    x, y = P + G - 1, M - G
    lemmas = [lemma_subadditive(x, y, B), lemma_subadditive(x + y, 1, B), lemma_step(x + y, B)]
    domain = [*running_domain(B, P, G, M), G < M, *lemmas]
    shown = _show(run, running=True)
    return [
        Obligation("exact <= legacy + 1", domain, run["exact"] <= run["legacy"] + 1, shown),
        Obligation(
            "exact > legacy only if B divides P+M-1",
            domain,
            z3.Implies(run["exact"] > run["legacy"], (P + M - 1) % B == 0),
            shown,
        ),
    ]


@theorem(COUNTEREXAMPLE, timeout_ms=5000, confirm=_replay_running)
def reservation_legacy_le_exact() -> list[Obligation]:
    """The converse claim, legacy ≤ exact for every running request, is FALSE too (legacy ignores
    the free slots of the last page): neither formula dominates the other. Expected: a
    counterexample."""
    run = _running_terms()
    return [
        Obligation(
            "legacy <= exact",
            [*running_domain(B, P, G, M), G < M],
            run["legacy"] <= run["exact"],
            _show(run, running=True),
        )
    ]


def candidate_facts(P: Any, k: Any, M: Any, B: Any) -> list[z3.BoolRef]:
    """What ``candidate_term_covers_prefill_and_decode`` proves, as facts to reuse."""
    T = remote_table(P, B)
    n = need(P, M, T, B)
    return [candidate_term(P, k, M, B) >= (T - k) + n, exact(P, M, T, B) >= n]


def decode_facts(P: Any, g: Any, M: Any, B: Any) -> list[z3.BoolRef]:
    """What ``decode_page_is_reserved`` proves, as facts to reuse (domain 1 ≤ g < M)."""
    T = running_table(P, g, B)
    page = z3.If((P + g - 1) % B == 0, 1, 0)
    before, after = need(P, M, T, B), need(P, M, T + page, B)
    return [
        z3.Implies(page == 1, before >= 1),
        after == before - page,
        T + page == running_table(P, g + 1, B),
    ]


@theorem(timeout_ms=5000)
def candidate_term_covers_prefill_and_decode() -> list[Obligation]:
    """The candidate's own admission term ⌈(P − k·B + M)/B⌉ (k cached pages, k·B ≤ P−1) is at least
    the ⌈P/B⌉ − k pages its prefill allocates plus its remaining need afterwards
    (max(⌈(P+M−1)/B⌉ − ⌈P/B⌉, 0)); and the prefill extra a batch admit adds for later candidates,
    max(⌈(P+M)/B⌉ − ⌈P/B⌉, 0), is at least that need."""
    k = z3.Int("k")
    domain = [B >= 1, P >= 1, M >= 1, k >= 0, k * B <= P - 1]
    T = remote_table(P, B)
    shown = {"B": B, "P": P, "M": M, "k": k, "own": candidate_term(P, k, M, B)}
    shown["need"] = need(P, M, T, B)
    names = ("own >= prefill pages + need", "prefill extra >= need")
    return [
        Obligation(name, domain, fact, shown)
        for name, fact in zip(names, candidate_facts(P, k, M, B), strict=True)
    ]


@theorem(timeout_ms=5000)
def decode_page_is_reserved() -> list[Obligation]:
    """A decode step of a running request (1 ≤ g < M, len(table) = ⌈(P+g−1)/B⌉) allocates a page
    exactly when (P+g−1) mod B = 0 (``append_slot``); then the remaining need was ≥ 1, it drops by
    exactly the pages allocated, and the table is again ⌈(P+g'−1)/B⌉ for g' = g+1. (Proved from
    the ceil_div_step and ceil_div_monotone lemmas, instantiated at x = P+g−1 and P+g ≤ P+M−1.)"""
    lemmas = [lemma_step(P + G - 1, B), lemma_monotone(P + G, P + M - 1, B)]
    domain = [*running_domain(B, P, G, M), G < M, *lemmas]
    shown = {"B": B, "P": P, "g": G, "M": M}
    names = ("page implies need >= 1", "need drops by the page", "table invariant kept")
    return [
        Obligation(name, domain, fact, shown)
        for name, fact in zip(names, decode_facts(P, G, M, B), strict=True)
    ]
