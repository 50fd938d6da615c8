"""The SGLang radix-cache model of the explorer (``RadixCache`` + its KV-slot allocator).

Scheduler events over a spec harness and a target harness of
:mod:`stateful_tests.sglang_harness` (the calls the radix-cache checker's traces use, so a
counterexample replays there): requests are admitted with every prompt of a small alphabet, decode
every token, are checkpointed, finish or are aborted; raw matches of every prompt and evictions of
one slot and of the whole pool; with ``groups``, free groups opened and closed (closed with none
open, too); bad inputs are a free slot freed again (or one pending in the open group), slots
outside the pool, a nested group and, right after a finish, the finished request's node unlocked
again. The generator model
(:class:`Gen`) is the scheduler's side: the live requests' tokens, the requests admitted so far
and the request just finished whose node is now unlocked.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from impl.sglang.radix_cache import RadixCache as ImplCache
from impl.sglang.radix_cache import TreeNode
from proofs.explorer.search import Edge, Model, check_ranges, rejected
from spec import invariants as inv
from spec.sglang.radix_cache import RadixCache
from spec.sglang.radix_cache import RadixCache as SpecCache
from stateful_tests import sglang_radix_cache as checker
from stateful_tests.lockstep import Check, Outcome
from stateful_tests.sglang_harness import Config, RadixHarness, Req, read


@dataclass(frozen=True)
class RadixCacheBounds:
    """The small scope: a pool of ``pages`` pages of ``page_size`` slots, at most ``requests``
    requests over the run (``live`` at once) with prompts of 1..``prompt_tokens`` tokens from
    ``0..vocab-1``, growing to ``max_len`` tokens by decoding."""

    variant: str = "lru"
    pages: int = 3
    page_size: int = 1
    requests: int = 2
    live: int = 2
    prompt_tokens: int = 2
    vocab: int = 2
    max_len: int = 3
    bad_inputs: bool = True
    need_sort: bool = False
    groups: bool = False

    # pages of two slots (page alignment, partial last pages) on a smaller pool, for the default
    # variant, then the base for every variant
    SCOPES: ClassVar[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
        "default": (
            (
                "page-size-2",
                {"page_size": 2, "pages": 2, "requests": 2, "live": 1, "variant": "lru"},
            ),
            # staging and merges, free groups (the end with none open too), on pages of two
            (
                "need-sort-groups",
                {"page_size": 2, "pages": 2, "requests": 2, "live": 1, "variant": "lru",
                 "need_sort": True, "groups": True},
            ),
            ("base", {}),
        ),
    }  # fmt: skip
    DIMENSIONS: ClassVar[tuple[str, ...]] = ("variant", "page_size", "need_sort", "groups")

    HELP: ClassVar[dict[str, str]] = {
        "pages": "KV pages in the pool (page 0 not counted)",
        "page_size": "slots per page",
        "requests": "requests over the whole run",
        "live": "requests live at once",
        "prompt_tokens": "longest prompt",
        "vocab": "token alphabet size",
        "max_len": "tokens per request at most",
        "bad_inputs": "the rejected-input alphabet",
        "need_sort": "the allocator stages freed pages until an allocation runs short",
        "groups": "free groups opened and closed (frees between them deferred)",
    }

    def validate(self) -> None:
        check_ranges(
            self,
            (
                ("pages", 1, 8),
                ("page_size", 1, 4),
                ("requests", 1, 5),
                ("live", 1, 4),
                ("prompt_tokens", 1, 6),
                ("vocab", 1, 3),
                ("max_len", 1, 8),
            ),
        )
        if self.prompt_tokens > self.max_len:
            raise ValueError("prompt-tokens must be at most max-len")


class Gen(NamedTuple):
    """The scheduler's side of a state."""

    reqs: tuple[tuple[str, tuple[int, ...]], ...]
    added: int
    just_released: str | None  # a request finished by the last call, its node now unlocked


class RadixCacheModel(Model):
    """Scheduler events over a spec harness and a target harness."""

    # every method of the alphabet (docs/targets.md), for the report of those never reached
    operations = (
        "abort",
        "admit",
        "checkpoint",
        "decode",
        "evict",
        "finish",
        "free",
        "group_begin",
        "group_end",
        "match",
        "unlock_again",
    )

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: RadixCacheBounds,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(component, target_cls, target, bounds, options)
        self.checker = checker.CHECKER
        self.spec_cls = RadixCache
        self.reader = checker.reader(target_cls)  # a target may hide columns (Rust core times)
        self.snapshot_checks = checker.SNAPSHOT_CHECKS
        self.state_invariants = checker.STATE_INVARIANTS
        b = bounds
        self.config = Config(
            variant=b.variant,
            size=b.pages * b.page_size,
            page_size=b.page_size,
            vocab=b.vocab,
            max_requests=b.live,
            max_len=b.max_len,
            need_sort=b.need_sort,
        )
        self.prompts = [
            list(p)
            for n in range(1, b.prompt_tokens + 1)
            for p in itertools.product(range(b.vocab), repeat=n)
        ]

    def use_reference(self, reference: Any) -> None:
        super().use_reference(reference)
        self.reader = checker.reader(self.target_cls, self.spec_cls)  # columns either side hides

    def clone(self, obj: Any) -> Any:
        return clone_harness(obj)

    def initial(self) -> tuple[Any, Any, Any]:
        return (
            RadixHarness(self.spec_cls, self.config),
            RadixHarness(self.target_cls, self.config),
            Gen((), 0, None),
        )

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return True

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def pair_key(self, snap: Any, spec: Any, target: Any) -> Hashable:
        """The snapshot (requests included) and which finished requests' nodes the harness
        still knows (the unlock-again edge reads them)."""
        released = tuple(sorted(spec.released.items())) if spec is not None else ()
        if spec is not None and self.reader is not read:  # columns hidden from the comparison
            snap = read(spec)  # still tell states apart by the spec's full snapshot
        return (snap, released)

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b, g = self.b, gen
        out: list[Edge] = []
        add = out.append
        cleared: Gen = g._replace(just_released=None)

        def keep(_gen: Gen, returned: Any) -> Gen:
            return cleared

        for p in self.prompts:
            add(Edge("match", (p,), keep))
        for n in sorted({1, b.pages * b.page_size}):
            add(Edge("evict", (n,), keep))
        if g.added < b.requests and len(g.reqs) < b.live:
            rid = f"r{g.added}"
            for p in self.prompts:
                add(Edge("admit", (rid, p), _admitted(cleared, rid, tuple(p))))
        for i, (rid, tokens) in enumerate(g.reqs):
            if len(tokens) < b.max_len:
                for t in range(b.vocab):
                    add(Edge("decode", (rid, t), _decoded(cleared, i, t)))
            add(Edge("checkpoint", (rid,), keep))
            gone = cleared._replace(reqs=g.reqs[:i] + g.reqs[i + 1 :])
            for method in ("finish", "abort"):
                add(Edge(method, (rid,), _released(gone, rid)))
        if b.groups:
            if not snap.group_open:
                add(Edge("group_begin", (), keep))
            add(Edge("group_end", (), keep))  # with none open too (a no-op)
        if b.bad_inputs:
            if b.groups and snap.group_open:
                add(rejected("group_begin", ()))
                if snap.free_group:
                    add(rejected("free", ([snap.free_group[0] * b.page_size],)))
            if snap.free_pages:
                add(rejected("free", ([snap.free_pages[0] * b.page_size],)))
            add(rejected("free", ([(b.pages + 1) * b.page_size],)))
            rid = g.just_released
            if rid is not None and checker.unlocked(snap, read_released(spec(), rid)):
                add(rejected("unlock_again", (rid,)))
        return out

    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        if edge.method in ("admit", "decode", "evict") and spec_out.raised is None:
            problem = inv.radix_no_locked_eviction(before, snap)
            if problem:
                return "no_live_eviction", problem
        return None


# ----------------------------------------------------------------------------- exact clones
def clone_harness(h: RadixHarness) -> RadixHarness:
    """An exact copy of a harness around kvspec's own caches (spec or impl, planted bugs
    included), built field by field; any other cache (upstream's) by ``copy.deepcopy``, whose
    rebuilt sets may iterate in another order — harmless, since upstream's eviction heap never
    meets a tie under kvspec's logical clock (docs/sglang.md §2.4)."""
    c = h.c
    if isinstance(c, SpecCache):
        nodes: Any = None
        new_c = _shallow(c)
        new_c.nodes = {p: replace(n, value=n.value.copy()) for p, n in c.nodes.items()}
    elif isinstance(c, ImplCache):
        new_c = _shallow(c)
        nodes = {id(c.root_node): _node_copy(c.root_node)}
        stack = [c.root_node]
        while stack:
            old = stack.pop()
            new = nodes[id(old)]
            for key, child in old.children.items():
                twin = nodes[id(child)] = _node_copy(child)
                twin.parent = new
                new.children[key] = twin
                stack.append(child)
        new_c.root_node = nodes[id(c.root_node)]
        new_c.evictable_leaves = {nodes[id(n)] for n in c.evictable_leaves}
    else:
        return copy.deepcopy(h)
    alloc = _shallow(c.token_to_kv_pool_allocator)
    alloc.free_pages = alloc.free_pages.copy()
    alloc.staged_pages = alloc.staged_pages.copy()
    alloc.free_page_ids_group = alloc.free_page_ids_group.copy()
    if alloc.free_group is not None:
        alloc.free_group = alloc.free_group.copy()
    if hasattr(alloc, "_free"):
        alloc._free, alloc._pending = alloc._free.copy(), alloc._pending.copy()
    new_c.token_to_kv_pool_allocator = alloc

    def handle(node: Any) -> Any:
        return node if nodes is None else nodes.get(id(node), node)

    out: RadixHarness = _shallow(h)
    out.c, out.alloc = new_c, alloc
    out.requests = {
        rid: Req(r.tokens.copy(), r.row.copy(), r.protected, handle(r.node), r.prompt_len)
        for rid, r in h.requests.items()
    }
    out.released = {rid: handle(n) for rid, n in h.released.items()}
    return out


def _shallow(obj: Any) -> Any:
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _node_copy(n: TreeNode) -> TreeNode:
    new = object.__new__(type(n))
    new.children, new.parent, new.key, new.value = {}, None, n.key, n.value.copy()
    new.lock_ref, new.last_access_time, new.creation_time = (
        n.lock_ref,
        n.last_access_time,
        n.creation_time,
    )
    return new


def read_released(h: RadixHarness, rid: str) -> tuple[int, ...]:
    return tuple(h.c.node_path(h.released[rid]))


def _admitted(gen: Gen, rid: str, tokens: tuple[int, ...]) -> Callable[[Gen, Any], Gen]:
    def then(_gen: Gen, returned: Any) -> Gen:
        added = gen._replace(added=gen.added + 1)
        return added if returned is None else added._replace(reqs=(*gen.reqs, (rid, tokens)))

    return then


def _decoded(gen: Gen, i: int, token: int) -> Callable[[Gen, Any], Gen]:
    def then(_gen: Gen, returned: Any) -> Gen:
        if returned is None:
            return gen
        rid, tokens = gen.reqs[i]
        return gen._replace(reqs=(*gen.reqs[:i], (rid, (*tokens, token)), *gen.reqs[i + 1 :]))

    return then


def _released(gen: Gen, rid: str) -> Callable[[Gen, Any], Gen]:
    return lambda _gen, returned: gen._replace(just_released=rid)
