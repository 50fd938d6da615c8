"""ARC bounds (invariant ``arc_lists_bounded``), inductive over the offload manager's transitions.

State (docs/vllm.md §1–§2; spec/vllm/arc.py, spec/vllm/offload_manager.py): the
lengths of T1, T2, B1, B2, the target ``p``, the capacity ``c`` (= the manager's ``num_blocks``),
the ids handed out ``a`` (``_num_allocated_blocks``) and the free-list length ``f``.

Invariant: ``0 ≤ p ≤ c``; ``|B1|, |B2| ≤ c``; every handed-out id is held by exactly one cached
block or sits on the free list, ``|T1| + |T2| + f = a ≤ c`` — hence ``|T1| + |T2| ≤ c``. The ARC
policy alone does not bound T1 + T2 (``insert`` never checks); the manager does, by inserting only
blocks it could allocate an id for. ``p`` is modelled as a real number; the spec's float only
rounds ``p ± delta`` before the clamps ``min(·, c)`` / ``max(·, 0)``, which are exact, so the bounds
hold for the float too.

Transitions, as the spec implements them: ``prepare_store`` of k ≥ 1 new keys (with or without
evicting ``need = k − free`` blocks: x from T1, y from T2; victims to the MRU end of their ghost
list; both ghost lists trimmed to c; then fresh ids first, then the free list; keys inserted at T1's
MRU end and dropped from the ghost lists); ``touch`` of one key (``touch(keys)`` is a sequence:
T1 ready → T2, T1 not ready → T1, T2 → T2, B1 hit ``p = min(p + max(1, |B2|/|B1|), c)``, B2 hit
``p = max(p − max(1, |B1|/|B2|), 0)``, unknown key); ``complete_store`` failure (``remove``, id
back to the free list); ``reset_cache`` (``clear``: all empty, ``p = 0``). A failed ``evict``
(``None``) or the #45757 guard changes nothing; loads and successful stores change ref counts only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from proofs.z3_core import Obligation, theorem


@dataclass(frozen=True)
class ArcState:
    p: z3.ArithRef  # target_t1_size (real)
    t1: z3.ArithRef
    t2: z3.ArithRef
    b1: z3.ArithRef
    b2: z3.ArithRef
    a: z3.ArithRef  # ids handed out
    f: z3.ArithRef  # free-list length


def _arc_state(tag: str) -> ArcState:
    t1, t2, b1, b2, a, f = z3.Ints(
        " ".join(f"{n}{tag}" for n in ("t1", "t2", "b1", "b2", "a", "f"))
    )
    return ArcState(z3.Real(f"p{tag}"), t1, t2, b1, b2, a, f)


def arc_invariant(s: ArcState, c: Any) -> list[z3.BoolRef]:
    return [
        c >= 0,
        s.p >= 0,
        s.p <= z3.ToReal(c),
        s.b1 >= 0,
        s.b1 <= c,
        s.b2 >= 0,
        s.b2 <= c,
        s.t1 >= 0,
        s.t2 >= 0,
        s.f >= 0,
        s.t1 + s.t2 + s.f == s.a,
        s.a <= c,
    ]


def _min(x: Any, y: Any) -> Any:
    return z3.If(x <= y, x, y)


def _max(x: Any, y: Any) -> Any:
    return z3.If(x >= y, x, y)


def arc_obligations(*, trim_ghosts: bool = True, clamp_target: bool = True) -> list[Obligation]:
    """The obligations; ``trim_ghosts`` / ``clamp_target`` False plant the bugs of leaving out the
    ghost trim after an eviction or the target's clamps (the tests check the proof then fails)."""
    c = z3.Int("capacity")
    s, t = _arc_state(""), _arc_state("'")
    k, x, y, h1, h2 = z3.Ints("k x y h1 h2")

    def ob(name: str, pre: list[Any], post: list[Any]) -> Obligation:
        shown = {"capacity": c, "p": s.p, "|T1|": s.t1, "|T2|": s.t2, "|B1|": s.b1}
        shown |= {"|B2|": s.b2, "allocated": s.a, "free list": s.f, "p'": t.p, "|B1|'": t.b1}
        shown |= {"|T1|'": t.t1, "|T2|'": t.t2}
        return Obligation(
            name,
            [*arc_invariant(s, c), *pre, *post],
            z3.And(*arc_invariant(t, c), t.t1 + t.t2 <= c),
            shown,
        )

    def same(*fields: str) -> list[Any]:
        return [getattr(t, n) == getattr(s, n) for n in fields]

    free = c - s.a + s.f  # _get_num_free_blocks
    need = k - free

    def store(evict: bool) -> Obligation:
        """prepare_store of k new keys: (evict,) allocate, insert."""
        if evict:
            pre = [k >= 1, need > 0, x >= 0, y >= 0, x <= s.t1, y <= s.t2, x + y == need]
            t1e, t2e = s.t1 - x, s.t2 - y
            b1e, b2e = s.b1 + x, s.b2 + y  # commit: victims to their ghost list's MRU end
            if trim_ghosts:
                b1e, b2e = _min(b1e, c), _min(b2e, c)  # then both trimmed to capacity
            fe = s.f + need
        else:
            pre = [k >= 1, need <= 0]
            t1e, t2e, b1e, b2e, fe = s.t1, s.t2, s.b1, s.b2, s.f
        fresh = _min(k, c - s.a)
        pre += [h1 >= 0, h1 <= b1e, h2 >= 0, h2 <= b2e]  # new keys that were ghosts
        post = [
            t.a == s.a + fresh,
            t.f == fe - (k - fresh),
            t.t1 == t1e + k,
            t.t2 == t2e,
            t.b1 == b1e - h1,
            t.b2 == b2e - h2,
            t.p == s.p,
        ]
        return ob("prepare_store " + ("evicting" if evict else "without eviction"), pre, post)

    b1r, b2r = z3.ToReal(s.b1), z3.ToReal(s.b2)
    cr = z3.ToReal(c)
    raised, lowered = s.p + _max(1, b2r / b1r), s.p - _max(1, b1r / b2r)
    if clamp_target:
        raised, lowered = _min(raised, cr), _max(lowered, 0)
    return [
        Obligation(
            "init",
            [c >= 0, s.p == 0, s.t1 == 0, s.t2 == 0, s.b1 == 0, s.b2 == 0, s.a == 0, s.f == 0],
            z3.And(*arc_invariant(s, c)),
            {"capacity": c},
        ),
        store(evict=False),
        store(evict=True),
        ob(
            "touch: ready T1 block -> T2",
            [s.t1 >= 1],
            [t.t1 == s.t1 - 1, t.t2 == s.t2 + 1, *same("b1", "b2", "a", "f", "p")],
        ),
        ob(
            "touch: T1 (not ready) / T2 / unknown key",
            [],
            same("t1", "t2", "b1", "b2", "a", "f", "p"),
        ),
        ob(
            "touch: B1 ghost hit",
            [s.b1 >= 1],
            [t.p == raised, *same("t1", "t2", "b1", "b2", "a", "f")],
        ),
        ob(
            "touch: B2 ghost hit",
            [s.b2 >= 1],
            [t.p == lowered, *same("t1", "t2", "b1", "b2", "a", "f")],
        ),
        ob(
            "complete_store failure: remove, id to the free list",
            [s.t1 + s.t2 >= 1],
            [
                t.t1 + t.t2 == s.t1 + s.t2 - 1,
                t.t1 >= 0,
                t.t2 >= 0,
                t.f == s.f + 1,
                *same("b1", "b2", "a", "p"),
            ],
        ),
        ob(
            "reset_cache",
            [],
            [t.p == 0, t.t1 == 0, t.t2 == 0, t.b1 == 0, t.b2 == 0, t.a == 0, t.f == 0],
        ),
    ]


@theorem(timeout_ms=5000)
def arc_lists_bounded() -> list[Obligation]:
    """ARC inside the offload manager, for any capacity c ≥ 0: after every transition (store with or
    without eviction — victims to the ghost lists, then both trimmed —, touch of a cached, ghost or
    unknown key, failed store, reset) the target stays in [0, c], |B1| ≤ c and |B2| ≤ c, and
    |T1| + |T2| ≤ c (every cached block holds one of the c ids; the allocation never pops an empty
    free list)."""
    return arc_obligations()
