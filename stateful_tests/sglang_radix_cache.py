"""Lockstep checking of SGLang's radix prefix cache with its KV-slot allocator: the driver that
plays SGLang's scheduler, its draws and its checker record.

Two :class:`~stateful_tests.sglang_harness.RadixHarness` (spec, target) get the same calls; after
each, the return values (prefix lengths, slots, node paths, evicted counts), the exception kinds
and the snapshots (every node's path, slots, lock count and time ranks; the free list in order;
the size counters; every request's tokens, row, tree-owned prefix and locked node) must be equal,
and on the target's own state: ``free_and_used_partition_pool`` (slot conservation),
``no_slot_free_and_cached``, ``evictable_plus_protected_is_tree_size``,
``referenced_count_matches_live_pages`` (lock counts are live lock holders),
``prefix_index_consistent`` (a request's prefix row is its locked path), ``tree_page_aligned``;
per call: ``no_live_eviction`` (no locked node evicted) and ``atomic_failure`` (a rejected call
changed nothing); ``identical_eviction_order`` names a free-list difference.

The driver is SGLang's scheduler in small (docs/sglang.md §5): prompts over a 2–3 token vocabulary,
often an earlier prompt's prefix extended, lengths around page boundaries; admissions that evict,
decodes, checkpoints, finishes and aborts; free groups opened and closed around them (and closed
with none open); allocators with ``need_sort`` some of the time; raw matches and evictions (with
everything locked, too). Bad inputs: a finished request's node unlocked again, a free slot freed
again (or a slot whose free is pending in the open group), slots outside the pool (page 0
included), a free group opened inside another.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, NamedTuple

from spec import invariants as inv
from spec.sglang.radix_cache import EVICTION_POLICIES, RadixCache, RadixSnapshot
from stateful_tests.checker import SPEC, CheckerDef, Example, Operation, Options, Reference
from stateful_tests.lockstep import Chooser, Divergence, Lockstep, Step, Verdicts
from stateful_tests.sglang_harness import Config, RadixHarness, read

SNAPSHOT_CHECKS = {"free_pages": "identical_eviction_order"}
STATE_INVARIANTS: dict[str, Callable[[RadixSnapshot], str | None]] = {
    "free_and_used_partition_pool": inv.radix_slot_conservation,
    "no_slot_free_and_cached": inv.no_slot_free_and_cached,
    "evictable_plus_protected_is_tree_size": inv.evictable_plus_protected_is_tree_size,
    "referenced_count_matches_live_pages": inv.radix_lock_refs_match_holders,
    "prefix_index_consistent": inv.radix_rows_match_tree,
    "tree_page_aligned": inv.tree_page_aligned,
}
_EVICTING = ("admit", "decode", "evict")


@cache
def _verdicts() -> Verdicts:
    return Verdicts()


def draw_config(
    c: Chooser, variant: str | None, page_size: int | None = None, need_sort: bool | None = None
) -> Config:
    """Small pools that fill up (4–8 pages), pages of 1, 2 or 4 slots (or ``page_size``), a 2–3
    token vocabulary; a third of the allocators with ``need_sort``."""
    drawn = c.pick((1, 1, 2, 4))
    page_size = drawn if page_size is None else page_size
    return Config(
        variant=variant if variant is not None else c.pick(EVICTION_POLICIES),
        size=page_size * c.pick((4, 5, 6, 8)),
        page_size=page_size,
        vocab=c.pick((2, 2, 3)),
        max_requests=c.int(2, 4),
        max_len=page_size * c.int(2, 3) + c.int(0, 2),
        need_sort=c.chance(1 / 3) if need_sort is None else need_sort,
    )


def machine_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """The checker options ``page_size`` and ``need_sort`` pin those (a planted bug that needs
    pages, or staging)."""
    return draw_config(c, variant, options.get("page_size"), options.get("need_sort"))


class Driver:
    """The scheduler over a spec harness and a target harness."""

    def __init__(
        self, target_cls: Callable[..., Any], config: Config, reference: Reference = SPEC
    ) -> None:
        """``reference``: what the target is compared with (the spec unless it says otherwise)."""
        self.config = config
        self.spec_h = RadixHarness(reference.cls_for(RadixCache, target_cls), config)
        self.target_h = RadixHarness(target_cls, config)
        self.ls = Lockstep(
            self.spec_h,
            self.target_h,
            reader(target_cls, type(self.spec_h.c)),
            state_invariants=STATE_INVARIANTS,
            validate_first=lambda method, exc: True,  # every rejected call changes nothing
            snapshot_checks=SNAPSHOT_CHECKS,
            verdicts=_verdicts(),
            role=reference.role,
        )
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.coverage: Counter[str] = Counter()

    @property
    def steps(self) -> list[Step]:
        return self.ls.steps

    def call(self, method: str, *args: Any) -> Any:
        """Lockstep call, then the per-call invariant; the spec's outcome."""
        before = self.ls.after
        try:
            out = self.ls.call(method, *args)
        except Divergence as exc:
            raise self._explain(exc, method, before) from None
        after = self.ls.after
        if method in _EVICTING and out.raised is None:
            problem = inv.radix_no_locked_eviction(before, after)
            if problem:
                raise self.ls.fail("no_live_eviction", problem)
        self._track(method, args, out)
        self._paths(method, before, after, out)
        return out

    def check_invariant(self, name: str) -> None:
        problem = STATE_INVARIANTS[name](read(self.target_h))
        if problem:
            raise self.ls.fail(name, problem)

    def replay_step(self, step: dict[str, Any]) -> None:
        self.call(step["method"], *step["args"])

    def _explain(self, exc: Divergence, method: str, before: RadixSnapshot) -> Divergence:
        """Name a divergence after the first invariant the target's own state breaks."""
        if exc.check not in ("snapshot", "return_value", "identical_eviction_order"):
            return exc
        try:
            snap = read(self.target_h)
        except Exception:  # a target that no longer reads
            return exc
        checks = [(name, p(snap)) for name, p in STATE_INVARIANTS.items()]
        if method in _EVICTING:
            checks.insert(0, ("no_live_eviction", inv.radix_no_locked_eviction(before, snap)))
        for name, problem in checks:
            if problem:
                return Divergence(name, f"{problem} [{exc.check}: {exc.detail}]", exc.steps)
        return exc

    def _track(self, method: str, args: Sequence[Any], out: Any) -> None:
        if method == "admit":
            self.next_id += 1
            self.prompts.append(list(args[1]))

    def _paths(self, method: str, before: Any, after: Any, out: Any) -> None:
        cov = self.coverage
        cov[f"call:{method}"] += 1
        if out.raised is not None:
            cov[f"raise:{method}:{type(out.raised).__name__}"] += 1
            return
        r = out.returned
        if method in ("admit", "decode") and r is None:
            cov["path:allocation_refused"] += 1
        if method == "admit" and r is not None and r["prefix"]:
            cov["path:prefix_hit"] += 1
        if len(after.nodes) > len(before.nodes) and method in ("admit", "match"):
            cov["path:split_on_match"] += 1
        if len(after.nodes) < len(before.nodes):
            cov["path:evicted_node"] += 1
            if any(n.lock_ref > 0 for n in before.nodes):
                cov["path:evicted_around_locks"] += 1
        if method == "checkpoint" and r["cached"] > 0:
            cov["path:insert_found_prefix"] += 1
        if method == "evict" and r == 0 and before.nodes:
            cov["path:evict_all_locked"] += 1
        if not after.free_pages:
            cov["path:pool_full"] += 1
        if not after.requests and not before.requests and after.nodes:
            cov["path:quiescent_cache"] += 1
        if before.staged_pages and not after.staged_pages and method in _EVICTING:
            cov["path:staged_merged"] += 1
        if len(after.free_group) > len(before.free_group):
            cov["path:free_deferred"] += 1
        if method == "group_end" and before.free_group:
            cov["path:group_released"] += 1
        if method == "group_end" and not before.group_open:
            cov["path:group_end_unopened"] += 1

    # ------------------------------------------------------------ views and draws
    def live(self) -> list[str]:
        return list(self.spec_h.requests)

    def growable(self) -> list[str]:
        return [
            rid for rid, r in self.spec_h.requests.items() if len(r.tokens) < self.config.max_len
        ]

    def draw_prompt(self, c: Chooser) -> list[int]:
        """Lengths around page boundaries; often an earlier prompt's prefix extended."""
        ps, top = self.config.page_size, self.config.max_len
        length = min(top, max(1, c.pick((ps, ps + 1, 2 * ps, 2 * ps + 1, 1, 3 * ps))))
        prompt: list[int] = []
        if self.prompts and c.chance(0.7):
            base = c.pick(self.prompts)
            prompt = base[: c.pick((len(base), ps, 2 * ps, len(base) - 1, ps + 1))]
        while len(prompt) < length:
            prompt.append(c.int(0, self.config.vocab - 1))
        return prompt[:top]

    # ------------------------------------------------------------ operations (simple first)
    def match(self, c: Chooser) -> None:
        self.call("match", self.draw_prompt(c))

    def evict(self, c: Chooser) -> None:
        ps = self.config.page_size
        self.call("evict", c.pick((1, ps, ps + 1, 2 * ps, self.config.size)))

    def admit(self, c: Chooser) -> None:
        self.call("admit", f"r{self.next_id}", self.draw_prompt(c))

    def decode(self, c: Chooser) -> None:
        self.call("decode", c.pick(self.growable()), c.int(0, self.config.vocab - 1))

    def checkpoint(self, c: Chooser) -> None:
        self.call("checkpoint", c.pick(self.live()))

    def finish(self, c: Chooser) -> None:
        self.call("finish", c.pick(self.live()))

    def abort(self, c: Chooser) -> None:
        self.call("abort", c.pick(self.live()))

    def group_begin(self, c: Chooser) -> None:
        self.call("group_begin")

    def group_end(self, c: Chooser) -> None:
        self.call("group_end")

    # ------------------------------------------------------------ bad inputs
    def bad_unlock_twice(self, c: Chooser) -> None:
        """A request finishes (or is aborted), then its node is unlocked once more — when no
        other request still holds it, so the spec must refuse (a lock-ref underflow)."""
        rid = c.pick(self.live())
        self.call(c.pick(("finish", "abort")), rid)
        if rid in self.spec_h.released and unlocked(self.ls.after, self.spec_h.released[rid]):
            self.call("unlock_again", rid)

    def bad_double_free(self, c: Chooser) -> None:
        """A slot on the free list (or staged, or pending in the open group) freed again."""
        s, ps = self.ls.after, self.config.page_size
        slot = c.pick([*s.free_pages, *s.staged_pages, *s.free_group]) * ps
        self.call("free", [slot])

    def bad_nested_group(self, c: Chooser) -> None:
        """A free group opened while one is open."""
        self.call("group_begin")

    def bad_out_of_range(self, c: Chooser) -> None:
        """A slot outside the pool: the reserved page 0, or past the last page."""
        ps = self.config.page_size
        top = (self.config.size // ps + 1) * ps
        self.call("free", [c.pick((0, top, top + ps, ps - 1))])


def reader(*classes: Any) -> Callable[[RadixHarness], RadixSnapshot]:
    """``read``, with the node columns that any of ``classes`` (the target's, a baseline's) says
    it cannot expose (``kvspec_unobserved``, e.g. the Rust tree core's time ranks) left out of
    both snapshots."""
    hidden = tuple(sorted({c for cls in classes for c in getattr(cls, "kvspec_unobserved", ())}))
    if not hidden:
        return read
    blank: dict[str, Any] = dict.fromkeys(hidden, 0)

    def masked(h: RadixHarness) -> RadixSnapshot:
        s = read(h)
        return s._replace(nodes=tuple(sorted(n._replace(**blank) for n in s.nodes)))

    return masked


def unlocked(s: RadixSnapshot, path: tuple[int, ...]) -> bool:
    """Whether the node at ``path`` (the root for ``()``) is in the tree with no lock left."""
    return bool(path) and any(n.path == path and n.lock_ref == 0 for n in s.nodes)


class Facts(NamedTuple):
    room: bool
    live: bool
    growable: bool
    free: bool
    group_open: bool

    @classmethod
    def of(cls, d: Driver) -> Facts:
        live = d.live()
        return cls(
            len(live) < d.config.max_requests,
            bool(live),
            bool(d.growable()),
            bool(d.ls.after.free_pages or d.ls.after.staged_pages or d.ls.after.free_group),
            d.ls.after.group_open,
        )


OPERATIONS: tuple[Operation, ...] = (
    Operation("match", 2),
    Operation("evict", 2),
    Operation("admit", 8, lambda f: f.room),
    Operation("decode", 8, lambda f: f.growable),
    Operation("checkpoint", 3, lambda f: f.live),
    Operation("finish", 5, lambda f: f.live),
    Operation("abort", 2, lambda f: f.live),
    Operation("group_begin", 2, lambda f: not f.group_open),
    Operation("group_end", 1),
    Operation("bad_unlock_twice", 1, lambda f: f.live, bad=True),
    Operation("bad_double_free", 1, lambda f: f.free, bad=True),
    Operation("bad_out_of_range", 1, bad=True),
    Operation("bad_nested_group", 1, lambda f: f.group_open, bad=True),
)


_POOL = {"max_requests": 3, "max_len": 6}

CHECKER = CheckerDef(
    machine_name="RadixCacheLockstep",
    driver=lambda target_cls, config, options, reference: Driver(target_cls, config, reference),
    config_type=Config,
    machine_config=machine_config,
    fuzz_config=machine_config,
    operations=OPERATIONS,
    facts=Facts.of,
    spec_cls=RadixCache,
    invariants=tuple(STATE_INVARIANTS),
    # ``groups``: always drawn here; the option puts the explorer's ``groups`` bound on for a
    # planted bug that needs free groups (a checker option that is a bound becomes an override)
    options=("page_size", "need_sort", "groups"),
    episode_ops=150,
    examples=(
        Example(1, steps=200, config={"size": 6, "page_size": 1, "max_requests": 3, "max_len": 6}),
        Example(2, steps=200, config={"size": 8, "page_size": 2, "max_requests": 3, "max_len": 6}),
        # need_sort allocators (staging, merges on short allocations), both page-size kinds
        Example(3, steps=200, config={**_POOL, "size": 6, "page_size": 1, "need_sort": True}),
        Example(4, steps=200, config={**_POOL, "size": 8, "page_size": 2, "need_sort": True}),
    ),
)
