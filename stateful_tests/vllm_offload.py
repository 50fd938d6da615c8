"""Lockstep checking of vLLM CPU offload managers (ARC and LRU policies): the driver and its draws.

A :class:`ManagerHarness` wraps one ``CPUOffloadingManager`` and exposes the manager alphabet
(docs/vllm.md §1.2, §6) with JSON-able arguments and results: ``prepare_store`` as
``None`` or ``{"keys_to_store", "block_ids", "evicted_keys"}``, ``prepare_load`` as its block ids,
``lookup`` as the result's name, ``take_events`` as ``[[keys...], removed]`` rows (the generator
consumed). Two harnesses (spec, target) are driven through
:class:`~stateful_tests.lockstep.Lockstep`, so after every call the return values (key and id
lists in order, ``None``), the exception kinds, and ``snapshot()`` (T1, T2, B1, B2 in order and the
target, or the LRU order; ids, ref counts, the free-id stack, pending events, the threshold
tracker) must be equal.

Invariants after every call (spec/invariants.py; names as in docs/design.md):
``arc_lists_bounded``, ``lru_order_consistent``, ``offload_ids_partition_pool`` (``id pool
partition``), ``evictable_counter_matches_scan`` (the target's #45757 counter against its idle
blocks), ``no_live_eviction`` (loading, pending and protected blocks are never evicted; nothing but
``prepare_store`` evicts), ``atomic_failure`` (a call that raised, and a ``prepare_store`` that
returned ``None``, changed nothing — not even ghost order or the target) and
``identical_eviction_order`` (same victims in the same order; same free-id stack). When the target
diverges from the spec, the first of these it breaks on its own state names the failure.

Draws are biased where bugs live: 2–6 blocks, key alphabets of about twice the capacity, full
caches, store batches mixing new, already-stored, pending and evicted (ghost) keys and batches larger
than T1, touches of ghost keys (moving the ARC target) and of pending blocks (#34576), loads pinning
blocks twice, stores that fail, and bad inputs (duplicate keys, completing unknown, idle or pending
keys, loading missing or pending keys).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, NamedTuple

from spec import invariants as inv
from spec.vllm.arc import ARCSnapshot
from spec.vllm.offload_manager import (
    VARIANTS,
    OffloadManagerSnapshot,
    read_offload_manager,
    variant_keywords,
)
from spec.vllm.offload_manager import CPUOffloadingManager as SpecManager
from spec.vllm.releases import has_call
from stateful_tests.checker import SPEC, CheckerDef, Example, Operation, Options, Reference
from stateful_tests.lockstep import Chooser, Divergence, Lockstep, Step, Verdicts

SNAPSHOT_CHECKS = {"free_list": "identical_eviction_order"}
STATE_INVARIANTS = ("arc_lists_bounded", "offload_ids_partition_pool", "lru_order_consistent")


@dataclass(frozen=True)
class Config:
    """One manager's construction and the key alphabet ``0..num_keys-1``."""

    policy: str = "arc"
    variant: str = "no_fallback"
    num_blocks: int = 4
    num_keys: int = 10
    enable_events: bool = True
    store_threshold: int = 1
    max_tracker_size: int = 8

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def draw_config(c: Chooser, policy: str, variant: str | None) -> Config:
    """Small capacities (2–6 mostly), key alphabets about twice the capacity, tracker sometimes."""
    num_blocks = c.pick((2, 3, 4, 2, 3, 4, 5, 6, 1, 8))
    threshold = 2 if c.chance(0.15) else 1
    return Config(
        policy=policy,
        variant=variant if variant is not None else c.pick(VARIANTS[policy]),
        num_blocks=num_blocks,
        num_keys=2 * num_blocks + c.int(1, 3),
        enable_events=c.chance(0.85),
        store_threshold=threshold,
        max_tracker_size=c.int(2, 2 * num_blocks + 1),
    )


# ----------------------------------------------------------------------------- harness
class ManagerHarness:
    """One offload manager driven by JSON-able calls with JSON-able, comparable results."""

    def __init__(self, manager_cls: Callable[..., Any], config: Config) -> None:
        self.m = manager_cls(  # keywords: upstream has cache_policy_module_path third
            config.num_blocks,
            cache_policy=config.policy,
            enable_events=config.enable_events,
            store_threshold=config.store_threshold,
            max_tracker_size=config.max_tracker_size,
            **variant_keywords(config.policy, config.variant),
        )

    def snapshot(self) -> OffloadManagerSnapshot:
        return read_offload_manager(self.m)

    def lookup(self, key: Any) -> str:
        result = self.m.lookup(key)
        return str(getattr(result, "name", result))

    def prepare_store(self, keys: list[Any]) -> dict[str, list[Any]] | None:
        out = self.m.prepare_store(keys)
        if out is None:
            return None
        return {
            "keys_to_store": list(out.keys_to_store),
            "block_ids": [int(b) for b in out.store_spec.block_ids],
            "evicted_keys": list(out.evicted_keys),
        }

    def complete_store(self, keys: list[Any], success: bool) -> None:
        self.m.complete_store(keys, success=success)

    def prepare_load(self, keys: list[Any]) -> list[int]:
        return [int(b) for b in self.m.prepare_load(keys).block_ids]

    def complete_load(self, keys: list[Any]) -> None:
        self.m.complete_load(keys)

    def touch(self, keys: list[Any]) -> None:
        self.m.touch(keys)

    def reset_cache(self) -> None:
        self.m.reset_cache()

    def take_events(self) -> list[list[Any]]:
        return [[list(e.keys), bool(e.removed)] for e in self.m.take_events()]


def _read(h: ManagerHarness) -> OffloadManagerSnapshot:
    return read_offload_manager(h.m)


def state_invariants(variant: str) -> dict[str, Callable[[OffloadManagerSnapshot], str | None]]:
    """The state invariants of one variant (an LRU release variant orders as its LRU flavour)."""
    flavour = (
        variant_keywords("lru", variant).get("lru", "v2") if variant in VARIANTS["lru"] else ""
    )
    return {
        "arc_lists_bounded": inv.arc_lists_bounded,
        "offload_ids_partition_pool": inv.offload_ids_partition_pool,
        "lru_order_consistent": lambda s: inv.lru_order_consistent(s, flavour),
    }


@cache
def _checked_state(variant: str) -> tuple[Mapping[str, Callable[[Any], str | None]], Verdicts]:
    """One variant's state invariants and the memo of their passes, shared by its drivers."""
    return state_invariants(variant), Verdicts()


# ----------------------------------------------------------------------------- analysis helpers
def _refs(s: OffloadManagerSnapshot) -> dict[Any, int]:
    return {k: r for _, k, r in s.policy.blocks}


def _store_keys(s: OffloadManagerSnapshot, keys: Sequence[Any], threshold: int) -> list[Any]:
    """The input keys that survive the store-threshold filter in state ``s`` (and are protected)."""
    if threshold < 2 or s.counts is None:
        return list(keys)
    counts = dict(s.counts)
    return [k for k in keys if counts.get(k, 0) >= threshold]


def _need(s: OffloadManagerSnapshot, kept: Sequence[Any]) -> int:
    """Blocks ``prepare_store`` must evict for the (filtered) keys ``kept`` in state ``s``."""
    refs = _refs(s)
    free = s.num_blocks - s.num_allocated_blocks + len(s.free_list)
    return sum(1 for k in kept if k not in refs) - free


def arc_selection_paths(
    p: ARCSnapshot, victims: Sequence[Any], protected: Collection[Any]
) -> set[str]:
    """Which ARC selection rules produced ``victims`` from state ``p`` (coverage, §2.3, §8).

    ``t2_pick_above_target``: a T2 victim while the virtual T1 size was still >= int(target) (T1's
    iterator exhausted, the #50992 scenario), and ``victim_after_t2_pick_above_target`` when the
    same call had already taken a T1 victim and needed more after it (where a restarted T1
    iterator would pick that T1 victim twice); ``t1_fallback_pick``: a T1 victim taken after T2
    had no eligible entry left (#55461 only).
    """
    refs = {k: r for _, k, r in p.blocks}
    t1_left = [k for k in p.t1 if refs[k] == 0 and k not in protected]
    t2_left = [k for k in p.t2 if refs[k] == 0 and k not in protected]
    virtual, paths, t1_picked = len(p.t1), set(), False
    for i, key in enumerate(victims):
        above = virtual >= int(p.target_t1_size)
        if t1_left and key == t1_left[0]:
            t1_left.pop(0)
            virtual -= 1
            t1_picked = True
            paths.add("t1_victim" if above else "t1_fallback_pick")
        elif t2_left and key == t2_left[0]:
            t2_left.pop(0)
            paths.add("t2_pick_above_target" if above else "t2_victim")
            if above and t1_picked and i < len(victims) - 1:
                paths.add("victim_after_t2_pick_above_target")
    return paths


def call_invariants(
    method: str,
    args: Sequence[Any],
    before: OffloadManagerSnapshot,
    after: OffloadManagerSnapshot,
    returned: Any,
    raised: BaseException | None,
    config: Config,
) -> tuple[str, str] | None:
    """``no_live_eviction`` and ``atomic_failure`` for one call on one side's snapshots, under
    the variant's release features (a failed ``prepare_store`` may still have counted its offers
    or adapted the ARC target; which input keys its eviction protects)."""
    if method == "reset_cache":
        return None
    features = _features(config.policy, config.variant)
    failed_store = raised is None and method == "prepare_store" and returned is None
    if failed_store and inv.atomic_failure(_allowed_changes(before, after, features), after):
        changed = before.differing_fields(after)
        return "atomic_failure", f"prepare_store returned None but changed {changed}"
    protected: list[Any] = []
    released: list[Any] = []
    if method == "prepare_store":
        if features.get("threshold_scope") == "new_only":
            protected = list(args[0])  # every input key
        elif features.get("threshold_counting", "lookup") == "lookup":
            protected = _store_keys(before, args[0], config.store_threshold)
        # (counting offers: the kept keys depend on this call's own counting; the lockstep
        # comparison covers them)
    elif method == "complete_store" and not args[1]:
        released = list(args[0])
    problem = inv.offload_no_live_eviction(
        before,
        after,
        may_evict=method == "prepare_store",
        protected=protected,
        released=released,
    )
    return None if problem is None else ("no_live_eviction", problem)


@cache
def _features(policy: str, variant: str) -> Mapping[str, Any]:
    """A variant's release features, computed once per variant (read, never changed)."""
    return MappingProxyType(variant_keywords(policy, variant))


def _allowed_changes(
    before: OffloadManagerSnapshot, after: OffloadManagerSnapshot, features: Mapping[str, Any]
) -> OffloadManagerSnapshot:
    """``before`` with the parts a failed ``prepare_store`` may change taken from ``after``: the
    tracker when stores count offers, the ARC target and ghost lists with ``arc_store_miss``."""
    if features.get("threshold_counting", "lookup") != "lookup":
        before = before._replace(counts=after.counts)
    if features.get("arc_store_miss") and isinstance(before.policy, ARCSnapshot):
        assert isinstance(after.policy, ARCSnapshot)
        policy = before.policy._replace(
            b1=after.policy.b1, b2=after.policy.b2, target_t1_size=after.policy.target_t1_size
        )
        before = before._replace(policy=policy)
    return before


# ----------------------------------------------------------------------------- driver
class Driver:
    """The manager alphabet over a spec harness and a target harness, in lockstep."""

    def __init__(
        self, target_cls: Callable[..., Any], config: Config, reference: Reference = SPEC
    ) -> None:
        """``reference``: what the target is compared with (the spec unless it says otherwise)."""
        self.config = config
        self.touch_api = has_call(config.variant, "touch")
        self.spec_h = ManagerHarness(reference.cls_for(SpecManager, target_cls), config)
        self.target_h = ManagerHarness(target_cls, config)
        checked = _checked_state(config.variant)
        self.ls = Lockstep(
            self.spec_h,
            self.target_h,
            _read,
            state_invariants=checked[0],
            validate_first=lambda method, exc: True,  # every raising manager call validates first
            snapshot_checks=SNAPSHOT_CHECKS,
            verdicts=checked[1],
            role=reference.role,
        )
        self.keys = list(range(config.num_keys))
        self.batches: list[list[int]] = []  # store batches seen (a request's keys, prefix first)
        self.evicted: list[int] = []  # keys evicted so far, most recent last
        self.coverage: Counter[str] = Counter()
        # the upstream-shaped sides that keep an evictable counter (a baseline's too)
        sides = (self.target_h,) if reference.kind == "spec" else (self.target_h, self.spec_h)
        self._counted = tuple(h for h in sides if hasattr(h.m, "_num_evictable_cache_blocks"))
        self._check_counter()

    # ------------------------------------------------------------ plumbing
    @property
    def steps(self) -> list[Step]:
        return self.ls.steps

    def call(self, method: str, *args: Any) -> Any:
        """Lockstep call, then the invariants that need the call's arguments; the spec's outcome."""
        before = self.ls.after
        try:
            out = self.ls.call(method, *args)
        except Divergence as exc:
            raise self._explain(exc, method, args, before) from None
        after = self.ls.after
        problem = call_invariants(
            method, args, before, after, out.returned, out.raised, self.config
        )
        if problem is not None:
            raise self.ls.fail(*problem)
        self._check_counter()
        self._paths(method, args, before, after, out)
        return out

    def check_invariant(self, name: str) -> None:
        """One named invariant on the target's state now (the machine's ``@invariant``s)."""
        if name == "evictable_counter_matches_scan":
            self._check_counter()
            return
        problem = state_invariants(self.config.variant)[name](_read(self.target_h))
        if problem:
            raise self.ls.fail(name, problem)

    def replay_step(self, step: dict[str, Any]) -> None:
        self.call(step["method"], *step["args"])

    def _check_counter(self) -> None:
        for h in self._counted:
            counter = h.m._num_evictable_cache_blocks
            problem = inv.evictable_counter_matches_scan(self.ls.after, counter)
            if problem:
                side = "" if h is self.target_h else f" (on the {self.ls.role} side)"
                raise self.ls.fail("evictable_counter_matches_scan", problem + side)

    def _explain(
        self, exc: Divergence, method: str, args: Sequence[Any], before: OffloadManagerSnapshot
    ) -> Divergence:
        """Name a divergence after the first invariant the target breaks on its own state, if any
        (a more useful name than ``snapshot`` or ``return_value``)."""
        if exc.check in (*STATE_INVARIANTS, "atomic_failure"):
            return exc
        step = exc.steps[-1]
        try:
            target_snap = _read(self.target_h)
        except Exception:  # a target left in a state its own attributes cannot describe
            return exc
        checks: list[tuple[str, str | None]] = []
        if step.spec.raised is not None:
            checks.append(("atomic_failure", inv.atomic_failure(before, target_snap)))
        elif method == "prepare_store" and step.spec.returned is None:
            features = variant_keywords(self.config.policy, self.config.variant)
            allowed = _allowed_changes(before, target_snap, features)
            checks.append(("atomic_failure", inv.atomic_failure(allowed, target_snap)))
        found = call_invariants(
            method,
            args,
            before,
            target_snap,
            step.target.returned,
            step.target.raised,
            self.config,
        )
        if found is not None:
            checks.insert(0, found)
        s_ret, t_ret = step.spec.returned, step.target.returned
        if (
            method == "prepare_store"
            and isinstance(s_ret, dict)
            and isinstance(t_ret, dict)
            and s_ret["evicted_keys"] != t_ret["evicted_keys"]
        ):
            evicted = f"evicted {t_ret['evicted_keys']}, spec evicted {s_ret['evicted_keys']}"
            checks.append(("identical_eviction_order", evicted))
        for name, predicate in state_invariants(self.config.variant).items():
            checks.append((name, predicate(target_snap)))
        if self.target_h in self._counted:
            counter = getattr(self.target_h.m, "_num_evictable_cache_blocks", None)
            if isinstance(counter, int):
                checks.append(
                    (
                        "evictable_counter_matches_scan",
                        inv.evictable_counter_matches_scan(target_snap, counter),
                    )
                )
        for name, problem in checks:
            if problem:
                return Divergence(name, f"{problem} [{exc.check}: {exc.detail}]", exc.steps)
        return exc

    def _paths(
        self,
        method: str,
        args: Sequence[Any],
        before: OffloadManagerSnapshot,
        after: OffloadManagerSnapshot,
        out: Any,
    ) -> None:
        cov = self.coverage
        cov[f"call:{method}"] += 1
        if out.raised is not None:
            cov[f"raise:{method}:{type(out.raised).__name__}"] += 1
            return
        if after.num_allocated_blocks == after.num_blocks and not after.free_list:
            cov["path:pool_full"] += 1
        if method == "prepare_store":
            self._store_paths(args[0], before, out.returned)
            if isinstance(before.policy, ARCSnapshot) and isinstance(after.policy, ARCSnapshot):
                # a stored key in a ghost list is a store miss (0.31+ adapts the target on it):
                # with no touch() (0.34) the only ghost hit kvspec's calls can make
                keys = set(args[0])
                if keys & set(before.policy.b1):
                    cov["path:store_miss_b1"] += 1
                if after.policy.target_t1_size != before.policy.target_t1_size:
                    cov["path:store_target_moved"] += 1
        elif method == "touch" and isinstance(before.policy, ARCSnapshot):
            keys = set(args[0])
            if keys & set(before.policy.b1):
                cov["path:ghost_hit_b1"] += 1
            if keys & set(before.policy.b2):
                cov["path:ghost_hit_b2"] += 1
            refs = _refs(before)
            if any(refs.get(k, 0) < 0 for k in keys & set(before.policy.t1)):
                cov["path:touch_pending_t1"] += 1
            assert isinstance(after.policy, ARCSnapshot)
            if after.policy.target_t1_size != before.policy.target_t1_size:
                cov["path:target_moved"] += 1
        elif method == "complete_store":
            refs = _refs(before)
            if any(refs.get(k, 0) < 0 for k in args[0]):
                cov["path:store_completed" if args[1] else "path:store_failed"] += 1
        elif method == "prepare_load" and len(set(args[0])) < len(args[0]):
            cov["path:load_pins_twice"] += 1
        elif method == "lookup" and out.returned == "HIT_PENDING":
            cov["path:lookup_pending"] += 1

    def _store_paths(self, keys: list[Any], before: OffloadManagerSnapshot, returned: Any) -> None:
        cov = self.coverage
        kept = _store_keys(before, keys, self.config.store_threshold)
        need = _need(before, kept)
        refs = _refs(before)
        if len(kept) < len(keys):
            cov["path:threshold_skipped"] += 1
        if need <= 0:
            return
        if any(k in refs for k in kept):
            cov["path:protected_input_key"] += 1
        if any(r > 0 for r in refs.values()):
            cov["path:evict_while_loading"] += 1
        if any(r < 0 for r in refs.values()):
            cov["path:evict_while_pending"] += 1
        if returned is None:
            idle = sum(1 for r in refs.values() if r == 0)
            cov["path:guard_fast_fail" if need > idle else "path:failed_eviction"] += 1
            return
        cov["path:eviction"] += 1
        victims = returned["evicted_keys"]
        self.evicted.extend(victims)
        if isinstance(before.policy, ARCSnapshot):
            if len(keys) > len(before.policy.t1):
                cov["path:batch_larger_than_t1"] += 1
            for path in arc_selection_paths(before.policy, victims, set(kept)):
                cov[f"path:{path}"] += 1

    # ------------------------------------------------------------ views of the spec's state
    def blocks(self) -> dict[Any, int]:
        return _refs(self.ls.after)

    def pending(self) -> list[Any]:
        return [k for k, r in self.blocks().items() if r < 0]

    def ready(self) -> list[Any]:
        return [k for k, r in self.blocks().items() if r >= 0]

    def loading(self) -> list[Any]:
        """One entry per pin: a key loaded twice appears twice."""
        return [k for k, r in self.blocks().items() for _ in range(max(r, 0))]

    def ghosts(self) -> list[Any]:
        p = self.ls.after.policy
        return [*p.b1, *p.b2] if isinstance(p, ARCSnapshot) else []

    # ------------------------------------------------------------ draws
    def _sample(self, c: Chooser, pool: Sequence[Any], n: int) -> list[Any]:
        """Up to ``n`` distinct items of ``pool`` in drawn order."""
        rest, out = list(pool), list[Any]()
        while rest and len(out) < n:
            out.append(rest.pop(c.int(0, len(rest) - 1)))
        return out

    def key_pool(self) -> list[Any]:
        """Every key once, plus the cached keys and the ghost (or recently evicted) keys again: one
        draw from it favours keys whose handling differs."""
        known = self.ghosts() or self.evicted[-self.config.num_blocks :]
        return [*self.keys, *self.blocks(), *known]

    def _draw_key(self, c: Chooser) -> Any:
        return c.pick(self.key_pool())

    def draw_batch(self, c: Chooser) -> list[Any]:
        """Distinct keys for ``prepare_store``: often an earlier batch extended by new keys (the
        same request storing its next blocks: already-stored and pending keys first); sizes from 1
        to N + 2 (larger than T1, larger than the pool)."""
        n = self.config.num_blocks
        size = c.pick((1, 2, n, n + 1, n + 2, 3))
        batch: list[Any] = []
        if self.batches and c.chance(0.4):
            batch = list(c.pick(self.batches))[: c.int(1, size)]
        pool = self.key_pool()
        for _ in range(2 * size):
            if len(batch) >= size:
                break
            key = c.pick(pool)
            if key not in batch:
                batch.append(key)
        return batch

    def draw_touch(self, c: Chooser) -> list[Any]:
        """Keys for ``touch``: a request's keys (prefix first), ghosts (moving the ARC target),
        pending and ready blocks, unknown keys."""
        if self.batches and c.chance(0.3):
            return list(c.pick(self.batches))
        keys = [self._draw_key(c) for _ in range(c.int(0, 4))]
        if self.ghosts() and c.chance(0.4):
            keys.insert(0, c.pick(self.ghosts()))
        return keys

    # ------------------------------------------------------------ operations (simple first)
    def lookup(self, c: Chooser) -> None:
        """One lookup, or the connector's prefix lookup: key by key until the first miss."""
        if self.batches and c.chance(0.4):
            for key in c.pick(self.batches):
                if self.call("lookup", key).returned == "MISS":
                    break
        else:
            self.call("lookup", self._draw_key(c))

    def take_events(self, c: Chooser) -> None:
        self.call("take_events")

    def touch(self, c: Chooser) -> None:
        self.call("touch", self.draw_touch(c))

    def prepare_store(self, c: Chooser) -> None:
        """Store a batch; with the tracker on, look its keys up first (so some pass the filter);
        sometimes followed by the connector's touch of the whole batch (§1.3)."""
        batch = self.draw_batch(c)
        if self.config.store_threshold >= 2 and c.chance(0.6):
            for key in batch[: c.int(0, len(batch))]:
                self.call("lookup", key)
        out = self.call("prepare_store", batch)
        if out.raised is None and out.returned is not None:
            self.batches = [*self.batches[-7:], batch]
            if self.touch_api and out.returned["keys_to_store"] and c.chance(0.3):
                self.call("touch", batch)

    def store_and_complete(self, c: Chooser) -> None:
        """A whole store: ``prepare_store``, then ``complete_store`` of what it allocated (usually
        all of it, succeeding) — fills the cache with idle blocks quickly."""
        out = self.call("prepare_store", self.draw_batch(c))
        if out.raised is None and out.returned is not None and out.returned["keys_to_store"]:
            self.batches = [*self.batches[-7:], list(self.steps[-1].args[0])]
            keys = list(out.returned["keys_to_store"])
            if c.chance(0.2):
                keys = self._sample(c, keys, c.int(1, len(keys)))
            self.call("complete_store", keys, not c.chance(0.1))

    def touch_ghosts(self, c: Chooser) -> None:
        """Touch ghost keys (B1 raises the ARC target, B2 lowers it), sometimes with a cached key."""
        keys = self._sample(c, self.ghosts(), c.int(1, 2))
        if self.blocks() and c.chance(0.3):
            keys.append(c.pick(list(self.blocks())))
        self.call("touch", keys)

    def complete_store(self, c: Chooser) -> None:
        """A subset of the pending keys, in drawn order, succeeding or failing; sometimes with a
        ready or unknown key mixed in (skipped, as upstream)."""
        pending = self.pending()
        keys = self._sample(c, pending, c.int(1, len(pending)))
        if c.chance(0.2):
            keys.insert(c.int(0, len(keys)), c.pick(self.keys))
        self.call("complete_store", keys, c.chance(0.75))

    def prepare_load(self, c: Chooser) -> None:
        """Pin ready keys (a key may repeat: pinned twice)."""
        ready = self.ready()
        self.call("prepare_load", [c.pick(ready) for _ in range(c.int(1, 3))])

    def complete_load(self, c: Chooser) -> None:
        """Unpin a sub-multiset of the pins."""
        loading = self.loading()
        self.call("complete_load", self._sample(c, loading, c.int(1, len(loading))))

    def reset_cache(self, c: Chooser) -> None:
        self.call("reset_cache")
        self.evicted.clear()

    def complete_unknown(self, c: Chooser) -> None:
        """``complete_store`` of keys that are not pending (unknown or ready): skipped, no change."""
        pending = set(self.pending())
        keys = [k for k in self._sample(c, self.keys, c.int(1, 3)) if k not in pending]
        self.call("complete_store", keys, c.chance(0.5))

    def bad_duplicate_store(self, c: Chooser) -> None:
        """A ``prepare_store`` batch with a repeated key: ``InvalidArgument``, nothing changes."""
        batch = self.draw_batch(c)
        batch.insert(c.int(0, len(batch)), c.pick(batch))
        self.call("prepare_store", batch)

    def bad_load(self, c: Chooser) -> None:
        """``prepare_load`` of a missing or pending key, sometimes after good keys."""
        cached = set(self.blocks())
        bad_keys = self.pending() + [k for k in self.keys if k not in cached]
        if not bad_keys:  # every key is cached and ready (a key alphabet no larger than the pool)
            return
        keys = [c.pick(self.ready())] if self.ready() and c.chance(0.5) else []
        keys.insert(c.int(0, len(keys)), c.pick(bad_keys))
        self.call("prepare_load", keys)

    def bad_complete_load(self, c: Chooser) -> None:
        """``complete_load`` of an unknown, pending or idle key, or of a pin completed twice."""
        choice = c.int(0, 3)
        idle = [k for k, r in self.blocks().items() if r == 0]
        if choice == 1 and self.pending():
            keys = [c.pick(self.pending())]
        elif choice == 2 and idle:
            keys = [c.pick(idle)]
        elif choice == 3 and self.loading():
            key = c.pick(self.loading())
            keys = [key] * (self.blocks()[key] + 1)
        else:
            keys = [c.pick([k for k in self.keys if k not in self.blocks()] or self.keys)]
        if self.loading() and c.chance(0.3):
            keys.insert(0, c.pick(self.loading()))
        self.call("complete_load", keys)


class Facts(NamedTuple):
    """What the enabled-operation predicates read, computed once per step."""

    pending: bool
    ready: bool
    loading: bool
    ghosts: bool
    filled: bool  # every id has been handed out at least once
    touch: bool  # the release has touch() (not 0.34)

    @classmethod
    def of(cls, d: Driver) -> Facts:
        s = d.ls.after
        refs = [r for _, _, r in s.policy.blocks]
        p = s.policy
        return cls(
            any(r < 0 for r in refs),
            any(r >= 0 for r in refs),
            any(r > 0 for r in refs),
            isinstance(p, ARCSnapshot) and bool(p.b1 or p.b2),
            s.num_allocated_blocks == s.num_blocks,
            d.touch_api,
        )


OPERATIONS: tuple[Operation, ...] = (
    Operation("lookup", 4),
    Operation("take_events", 2),
    Operation("touch", 8, lambda f: f.touch),
    Operation("touch_ghosts", 3, lambda f: f.ghosts and f.touch),
    Operation("prepare_store", 12),
    Operation("store_and_complete", 6),
    Operation("complete_store", 10, lambda f: f.pending),
    Operation("prepare_load", 7, lambda f: f.ready),
    Operation("complete_load", 8, lambda f: f.loading),
    Operation("reset_cache", 1, lambda f: f.filled),
    Operation("complete_unknown", 1),
    Operation("bad_duplicate_store", 1, bad=True),
    Operation("bad_load", 1, bad=True),
    Operation("bad_complete_load", 1, bad=True),
)


def machine_config(c: Chooser, variant: str | None, options: Options) -> Config:
    return draw_config(c, options["policy"], variant)


CHECKER = CheckerDef(
    machine_name="OffloadManagerLockstep",
    driver=lambda target_cls, config, options, reference: Driver(target_cls, config, reference),
    config_type=Config,
    machine_config=machine_config,
    fuzz_config=machine_config,
    operations=OPERATIONS,
    facts=Facts.of,
    spec_cls=SpecManager,
    invariants=(*STATE_INVARIANTS, "evictable_counter_matches_scan"),
    episode_ops=300,
    options=("policy",),
    # full 3-block caches, with and without the store threshold: ghost hits in B1 and B2, T2
    # victims, the T1 fallback, failed stores and evictions, every bad input, and a T1 victim then
    # a T2 pick above the target then another victim in one call
    examples=(
        Example(2, steps=150, config={"num_blocks": 3, "num_keys": 7, "store_threshold": 1}),
        Example(33, steps=150, config={"num_blocks": 3, "num_keys": 9, "store_threshold": 1}),
        Example(
            10,
            steps=100,
            config={"num_blocks": 3, "num_keys": 7, "store_threshold": 2, "max_tracker_size": 6},
        ),
    ),
)
