"""The vLLM CPU offload model of the explorer (either cache policy).

A ``CPUOffloadingManager`` with the component's cache policy (its ``policy`` option) in one
variant, driven through the offload checker's :class:`~stateful_tests.vllm_offload.ManagerHarness`
(its traces use the offload checker's harness calls and config). Keys are opaque to every policy,
so with ``symmetry`` states equal up to a renaming of keys are explored once (:func:`_relabel`).
Block ids are opaque too: the manager only hands them out, pushes freed ones on a stack and pops
them; the policies never read one; the lockstep compares spec and target ids for equality and the
invariants read them only as a set against ``0..num_allocated_blocks-1``. So with
``block_symmetry`` states equal up to a renaming of keys and of the ids handed out so far are
explored once (:func:`_relabel_blocks`); ids not handed out yet stay fixed (allocation takes them
in numeric order). The target's hidden ``_num_evictable_cache_blocks`` counter is checked on every
edge (``evictable_counter_matches_scan``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar

from proofs.explorer.search import Edge, Model, check_ranges, rejected, with_take_events
from proofs.explorer.set_clone import clone
from spec import invariants as inv
from spec.vllm import BlockStatus
from spec.vllm.arc import ARCSnapshot
from spec.vllm.offload_manager import (
    CPUOffloadingManager,
    OffloadManagerSnapshot,
    read_offload_manager,
    read_policy,
)
from spec.vllm.releases import has_call
from stateful_tests import vllm_offload
from stateful_tests.lockstep import Check, Outcome
from stateful_tests.vllm_offload import Config as OffloadConfig
from stateful_tests.vllm_offload import ManagerHarness


@dataclass(frozen=True)
class OffloadBounds:
    """The small scope of the offload explorer: a ``CPUOffloadingManager`` of ``capacity`` blocks
    with the component's policy in ``variant``, keys ``0..keys-1``; ``prepare_store`` of up to
    ``store_width`` distinct keys, ``touch`` of up to ``touch_width``; at most ``max_loads``
    concurrent loads per block. ``symmetry``: keys are opaque to every policy, so states equal up to
    a renaming of keys are explored once (and fresh keys are taken in order). ``block_symmetry``:
    so are the block ids handed out so far (:func:`_relabel_blocks`). ``store_threshold``: a key is
    stored once offered (or looked up, by release) that many times, counted by an access tracker
    of ``tracker`` keys (1: no tracker). ``count_saturation``: tracker counts above
    ``store_threshold + 1`` are explored as ``store_threshold + 1`` (the spec reads a count only as
    ``>= store_threshold``; the one extra value still tells a target's ``==`` from ``>=``).
    ``events``: ``enable_events``, the events taken by ``take_events``; at most ``search.MAX_EVENTS``
    pending (beyond that only read-only calls and ``take_events`` are offered, so the scope
    stays finite)."""

    variant: str = ""
    capacity: int = 3
    keys: int = 5
    store_width: int = 2
    touch_width: int = 2
    max_loads: int = 1
    bad_inputs: bool = True
    symmetry: bool = True
    block_symmetry: bool = True
    store_threshold: int = 1
    tracker: int = 8
    count_saturation: bool = True
    events: bool = False

    # "tracker": the access tracker (threshold 2, a tracker smaller than the key alphabet, so it
    # also drops counts) at a smaller capacity, then the base. Finite only with count_saturation
    # (tracker counts grow without bound otherwise).
    # "default": a smaller tracker configuration (capacity 2, three keys, a tracker of two that
    # drops counts) on the newest release only; every release, one key more: "tracker"
    SCOPES: ClassVar[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
        "default": (
            (
                "store-threshold",
                {
                    "store_threshold": 2,
                    "tracker": 2,
                    "capacity": 2,
                    "keys": 3,
                    "variant": "r0.34",
                },
            ),
            # the manager's events and take_events, on the newest release
            ("events", {"events": True, "capacity": 2, "keys": 3, "variant": "r0.34"}),
            ("base", {}),
        ),
        "tracker": (
            ("store-threshold", {"store_threshold": 2, "tracker": 3, "capacity": 2, "keys": 4}),
            ("events", {"events": True, "capacity": 2, "keys": 3}),
            ("base", {}),
        ),
    }
    DIMENSIONS: ClassVar[tuple[str, ...]] = (
        "variant",
        "store_threshold",
        "tracker",
        "events",
        "capacity",
    )

    HELP: ClassVar[dict[str, str]] = {
        "store_threshold": "offers (or lookups) before a key is stored (1: no access tracker)",
        "tracker": "max_tracker_size: keys the access tracker counts at once",
        "capacity": "CPU blocks",
        "keys": "key alphabet size",
        "store_width": "keys per prepare_store",
        "touch_width": "keys per touch",
        "max_loads": "concurrent loads per block",
        "bad_inputs": "the rejected-input alphabet",
        "symmetry": "symmetry reduction (states equal up to a renaming of keys explored once)",
        "block_symmetry": "block-id symmetry (states equal up to a renaming of issued block ids "
        "explored once)",
        "count_saturation": "tracker counts above store-threshold + 1 explored as one value "
        "(without it a tracker scope needs --depth)",
        "events": "enable_events and take_events (at most two events pending)",
    }

    def validate(self) -> None:
        check_ranges(
            self,
            (
                ("capacity", 1, 8),
                ("keys", 1, 12),
                ("store_width", 1, 6),
                ("touch_width", 1, 6),
                ("max_loads", 1, 4),
                ("store_threshold", 1, 4),
                ("tracker", 1, 16),
            ),
        )


def _relabel(snap: Any, cap: int | None = None) -> tuple[Any, ...]:
    """``snap`` with keys renamed by first appearance (lists front to back, then blocks by id):
    equal for two states iff they are equal up to a renaming of keys (block ids kept)."""
    p = snap.policy
    names: dict[Any, int] = {}
    lists = (p.t1, p.t2, p.b1, p.b2) if hasattr(p, "t1") else (p.order,)
    for seq in (*lists, [k for _, k, _ in p.blocks], *_tracked(snap)):
        for k in seq:
            if k not in names:
                names[k] = len(names)
    policy = (
        tuple((b, names[k], r) for b, k, r in p.blocks),
        tuple(tuple(names[k] for k in seq) for seq in lists),
        getattr(p, "target_t1_size", None),
    )
    return (
        snap.num_allocated_blocks,
        snap.free_list,
        policy,
        *_renamed_extras(snap, names, cap),
    )


def _tracked(snap: Any) -> list[list[Any]]:
    """The keys of the pending events and of the store-threshold tracker, in order (both are
    off in the explorer's config: ``[]`` then)."""
    events, counts = snap.events, snap.counts
    seqs = [list(keys) for keys, _ in events] if events else []
    return [*seqs, [k for k, _ in counts]] if counts else seqs


def _capped(counts: Any, cap: int | None) -> Any:
    """The tracker ``counts`` with each count capped at ``cap`` (``count_saturation``), as is
    without one."""
    if not counts or cap is None:
        return counts
    return tuple((k, min(n, cap)) for k, n in counts)


def _renamed_extras(snap: Any, names: Mapping[Any, int], cap: int | None = None) -> tuple[Any, Any]:
    """The pending events and the tracker with ``names`` applied to their keys (and the counts
    capped at ``cap``, if given: ``count_saturation``)."""
    events, counts = snap.events, _capped(snap.counts, cap)
    return (
        events and tuple((tuple(names[k] for k in keys), r) for keys, r in events),
        counts and tuple((names[k], n) for k, n in counts),
    )


_BLOCK_ID = itemgetter(0)


def _relabel_blocks(snap: Any, rename_keys: bool = True, cap: int | None = None) -> tuple[Any, ...]:
    """``snap`` with its *issued* block ids (``< num_allocated_blocks``) renamed, and its keys too
    if ``rename_keys``, each by first appearance in a traversal that reads no id and no renamed
    key: the policy's lists front to back (a cached key names its block's id with it), the free
    list bottom to top, the keys of pending events and the tracker, then the blocks not named yet
    by ref count. The blocks are rebuilt in order of the new ids.

    Sound for any state: the result is the state under one bijective renaming (fresh ids
    ``num_allocated_blocks..`` are never renamed: allocation hands them out in numeric order), so
    equal results mean equal states up to a renaming. Name-independent traversal makes every such
    pair of states give equal results where ties are fully symmetric: the blocks left for the last
    step (LRU v2's pending and loading ones; none for ARC) have no id named yet and are taken by
    ref count, then by the name the tracker gave their key; blocks equal in both are
    interchangeable."""
    p = snap.policy
    issued = snap.num_allocated_blocks
    lists = (p.t1, p.t2, p.b1, p.b2) if hasattr(p, "t1") else (p.order,)
    blocks = p.blocks
    held = {k: b for b, k, _ in blocks}
    keys: dict[Any, Any] = {}
    ids: dict[int, int] = {}
    named = 0  # blocks whose key and id the lists named
    for seq in lists:
        for k in seq:
            if k not in keys:
                keys[k] = len(keys) if rename_keys else k
                b = held.get(k)
                if b is not None and b not in ids and b < issued:
                    ids[b] = len(ids)
                    named += 1
    for b in snap.free_list:
        if b not in ids and b < issued:
            ids[b] = len(ids)
    if snap.events or snap.counts:
        for seq in _tracked(snap):
            for k in seq:
                if k not in keys:
                    keys[k] = len(keys) if rename_keys else k
    if named < len(blocks):  # LRU v2's busy blocks (or a malformed state)
        rest = [e for e in blocks if e[1] not in keys or (e[0] not in ids and e[0] < issued)]
        # by ref count, then by the name the tracker gave the key (ties left are symmetric, see
        # above); keys kept: by key too, as text
        if rename_keys:
            late = len(keys) + len(blocks)  # after every key named so far
            rest.sort(key=lambda e: (e[2], keys.get(e[1], late)))
        else:
            rest.sort(key=lambda e: (e[2], repr(e[1])))
        for b, k, _ in rest:
            if k not in keys:
                keys[k] = len(keys) if rename_keys else k
            if b not in ids and b < issued:
                ids[b] = len(ids)
    policy = (
        tuple(sorted([(ids.get(b, b), keys[k], r) for b, k, r in blocks], key=_BLOCK_ID)),
        tuple(tuple(keys[k] for k in seq) for seq in lists),
        getattr(p, "target_t1_size", None),
    )
    free = tuple(ids.get(b, b) for b in snap.free_list)
    return (issued, free, policy, *_renamed_extras(snap, keys, cap))


_RELEASE_SETTINGS = (
    "threshold_counting",
    "threshold_scope",
    "arc_store_miss",
    "failed_store_event",
)
_MANAGER_ATTRIBUTES = frozenset(
    {
        "_free_list",
        "_num_allocated_blocks",
        "_num_blocks",
        "_num_evictable_cache_blocks",
        "_policy",
        "counts",
        "events",
        "max_tracker_size",
        "medium",
        "store_threshold",
        "stores_skipped_in_current_batch",
        # release features (spec/vllm/releases.py): settings, atoms (checked in _clone_offload)
        *_RELEASE_SETTINGS,
    }
)
_POLICY_BLOCKS = ("t1", "t2", "blocks")  # key -> BlockStatus (each block in exactly one)
_POLICY_KEYS = ("b1", "b2", "evictable_blocks", "counts")  # key -> None / int
_POLICY_ATTRIBUTES = frozenset(
    {*_POLICY_BLOCKS, *_POLICY_KEYS, "cache_capacity", "t1_fallback", "target_t1_size"}
    | {"variant", "_v2"}
)


_new_tuple = tuple.__new__


def _arc_snapshots() -> tuple[Any, ...]:
    from impl.vllm.arc import ARCCachePolicy as ImplARC
    from spec.vllm.arc import ARCCachePolicy as SpecARC

    return (SpecARC.snapshot, ImplARC.snapshot)


_ARC_SNAPSHOTS = _arc_snapshots()  # kvspec's ARC policies' snapshot(): read_arc_policy(self)


def fast_read(h: ManagerHarness) -> Any:
    """``read_offload_manager(h.m)`` with an ARC policy of kvspec's own read in place (the same
    attribute reads as ``read_arc_policy``, without the NamedTuple constructors): checked equal to
    it on the initial objects before a search uses it. Any other policy: its own ``snapshot()``."""
    m = h.m
    policy = m._policy
    snap_policy: Any
    if getattr(type(policy), "snapshot", None) in _ARC_SNAPSHOTS:
        t1, t2 = policy.t1, policy.t2
        entries = [(b.block_id, k, b.ref_cnt) for k, b in t1.items()]
        entries += [(b.block_id, k, b.ref_cnt) for k, b in t2.items()]
        entries.sort(key=_BLOCK_ID)
        snap_policy = _new_tuple(
            ARCSnapshot,
            (
                tuple(entries),
                tuple(t1),
                tuple(t2),
                tuple(policy.b1),
                tuple(policy.b2),
                float(policy.target_t1_size),
            ),
        )
    else:
        snap_policy = read_policy(policy)
    events, counts = m.events, m.counts
    return _new_tuple(
        OffloadManagerSnapshot,
        (
            m._num_blocks,
            m._num_allocated_blocks,
            tuple(m._free_list),
            snap_policy,
            None if events is None else tuple((tuple(e.keys), e.removed) for e in events),
            None if counts is None else tuple(counts.items()),
        ),
    )


def _settings_are_atoms(state: dict[str, Any]) -> bool:
    return all(type(state.get(name)) in _SETTING_TYPES for name in _RELEASE_SETTINGS)


_SETTING_TYPES = (str, bool, type(None))


def _clone_offload(h: ManagerHarness) -> ManagerHarness:
    """An exact clone of a harness around kvspec's own offload managers and policies: the generic
    :func:`clone`, unrolled (any other shape goes through :func:`clone`)."""
    m = h.m
    policy = getattr(m, "_policy", None)
    if (
        type(h) is not ManagerHarness
        or not hasattr(m, "__dict__")
        or not m.__dict__.keys() <= _MANAGER_ATTRIBUTES
        or not hasattr(policy, "__dict__")
        or not policy.__dict__.keys() <= _POLICY_ATTRIBUTES
        or m.events
        or not _settings_are_atoms(m.__dict__)
    ):
        return clone(h)  # type: ignore[no-any-return]
    new = object.__new__
    pstate = policy.__dict__.copy()
    for name in _POLICY_BLOCKS:
        entries = pstate.get(name)
        if entries is not None:
            copied: OrderedDict[Any, Any] = OrderedDict()
            for k, b in entries.items():
                if type(b) is not BlockStatus:
                    return clone(h)  # type: ignore[no-any-return]
                c = new(BlockStatus)
                c.block_id, c.ref_cnt = b.block_id, b.ref_cnt
                copied[k] = c
            pstate[name] = copied
    for name in _POLICY_KEYS:
        if pstate.get(name) is not None:
            pstate[name] = pstate[name].copy()
    state = m.__dict__.copy()
    state["_free_list"] = m._free_list.copy()
    if state.get("counts") is not None:
        state["counts"] = state["counts"].copy()
    if state.get("events") is not None:
        state["events"] = []
    state["_policy"] = new(type(policy))
    state["_policy"].__dict__.update(pstate)
    manager = new(type(m))
    manager.__dict__.update(state)
    harness = new(ManagerHarness)
    harness.m = manager
    return harness


def _hidden(h: Any) -> Hashable | None:
    """What :func:`fast_read` leaves out of a harness around kvspec's own offload manager and
    policy (the shape :func:`_clone_offload` copies field by field): the manager's evictable
    counter and skipped-store count, and the policy's key tables in order. Every other attribute
    is in the snapshot or a setting no call changes. ``None`` for any other shape."""
    if type(h) is not ManagerHarness:
        return None
    m = h.m
    policy = getattr(m, "_policy", None)
    if (
        not hasattr(m, "__dict__")
        or not m.__dict__.keys() <= _MANAGER_ATTRIBUTES
        or not hasattr(policy, "__dict__")
        or not policy.__dict__.keys() <= _POLICY_ATTRIBUTES
        or m.events
        or not _settings_are_atoms(m.__dict__)
    ):
        return None
    state = policy.__dict__
    return (
        m.__dict__.get("_num_evictable_cache_blocks"),
        m.__dict__.get("stores_skipped_in_current_batch"),
        *(
            None if state.get(name) is None else tuple(state[name].items())
            for name in ("evictable_blocks", "counts")
        ),
    )


class OffloadModel(Model):
    """The offload manager alphabet for one policy variant (ARC or LRU)."""

    # every method of the alphabet (docs/targets.md), for the report of those never reached
    operations = (
        "complete_load",
        "complete_store",
        "lookup",
        "prepare_load",
        "prepare_store",
        "reset_cache",
        "take_events",
        "touch",
    )

    key_from_snapshot = True  # key() reads the snapshot only

    def clone(self, obj: Any) -> Any:
        return _clone_offload(obj)

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: OffloadBounds,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(component, target_cls, target, bounds, options)
        self.checker = vllm_offload.CHECKER
        self.spec_cls = CPUOffloadingManager
        self.reader = lambda h: read_offload_manager(h.m)
        self.snapshot_checks = vllm_offload.SNAPSHOT_CHECKS
        self.state_invariants = vllm_offload.state_invariants(bounds.variant)
        self.touch_api = has_call(bounds.variant, "touch")
        self.config = OffloadConfig(
            policy=self.options["policy"],
            variant=bounds.variant,
            num_blocks=bounds.capacity,
            num_keys=bounds.keys,
            enable_events=bounds.events,
            store_threshold=bounds.store_threshold,
            max_tracker_size=bounds.tracker,
        )
        # tracker counts in the state key capped one above the threshold (count_saturation)
        on = bounds.count_saturation and bounds.store_threshold >= 2
        self._cap: int | None = bounds.store_threshold + 1 if on else None

    def initial(self) -> tuple[Any, Any, Any]:
        spec = ManagerHarness(self.spec_cls, self.config)
        target = ManagerHarness(self.target_cls, self.config)
        # fast_read does not read the access tracker's counts: only without a tracker
        if (
            self.b.store_threshold == 1
            and not self.b.events
            and all(fast_read(h) == read_offload_manager(h.m) for h in (spec, target))
        ):
            self.reader = fast_read  # the one reader's values, built faster
        return spec, target, ()

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return True  # every raising manager call validates first

    def hidden(self, obj: Any) -> Hashable | None:
        return _hidden(obj)

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def reductions(self) -> dict[str, bool]:
        return {
            "symmetry": self.b.symmetry,
            "block_symmetry": self.b.block_symmetry,
            "count_saturation": self._cap is not None,
        }

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        b, cap = self.b, self._cap
        if b.block_symmetry:
            return _relabel_blocks(snap, b.symmetry, cap)
        if b.symmetry:
            return _relabel(snap, cap)
        whole: Hashable = snap if cap is None else snap._replace(counts=_capped(snap.counts, cap))
        return whole

    def observable(self, snap: Any, gen: Any) -> Hashable:
        return self.key(snap, gen, None, None)

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        p = snap.policy
        refs = {k: r for _, k, r in p.blocks}
        ghosts = [*getattr(p, "b1", ()), *getattr(p, "b2", ())]
        # a key the tracker counts (or an event names) has state: not one of the interchangeable
        # fresh keys, or states equal up to renaming would offer different calls
        tracked = {k for seq in _tracked(snap) for k in seq} if snap.events or snap.counts else ()
        known = sorted({*refs, *ghosts, *tracked})
        unknown = [
            k for k in range(b.keys) if k not in refs and k not in ghosts and k not in tracked
        ]
        fresh = unknown[: b.store_width] if b.symmetry else unknown
        out: list[Edge] = []
        add = out.append
        for k in known + unknown[:1]:
            # with an access tracker a lookup may count the key (the 0.28 rule): not read-only
            add(Edge("lookup", (k,), readonly=b.store_threshold == 1))
        # unknown keys are no-ops: one representative (0.34 has no touch at all)
        for width in range(1, b.touch_width + 1 if self.touch_api else 1):
            for keys in itertools.permutations(known, width):
                add(Edge("touch", (list(keys),)))
        if unknown and self.touch_api:
            add(Edge("touch", ([unknown[0]],), readonly=True))
        for width in range(1, b.store_width + 1):
            for keys in itertools.permutations(known + fresh, width):
                used = [k for k in keys if k in fresh]
                if b.symmetry and used != fresh[: len(used)]:
                    continue  # fresh keys are interchangeable: take them in order
                add(Edge("prepare_store", (list(keys),)))
        pending = [k for k in known if refs.get(k, 0) < 0]
        for k in pending:
            add(Edge("complete_store", ([k], True)))
            add(Edge("complete_store", ([k], False)))
        if len(pending) > 1:
            # the batch's order is the order the keys become ready in. Pending keys are
            # interchangeable only with key symmetry and no tracker (its counts tell them apart):
            # then one order stands for all; otherwise every order (up to three keys)
            whole = (b.symmetry and not snap.counts) or len(pending) > 3
            for batch in [pending] if whole else itertools.permutations(pending):
                add(Edge("complete_store", (list(batch), True)))
        for k in known:
            if 0 <= refs.get(k, -1) < b.max_loads:
                add(Edge("prepare_load", ([k],)))
        for k in known:
            if refs.get(k, 0) > 0:
                add(Edge("complete_load", ([k],)))
        add(Edge("reset_cache", ()))
        if b.bad_inputs:
            absent = unknown[:1] or [k for k in ghosts[:1]]
            for k in absent:
                add(rejected("prepare_load", ([k],)))  # not cached
                add(rejected("complete_load", ([k],)))
                add(Edge("complete_store", ([k], True), readonly=True))  # skipped, not an error
            for k in pending[:1]:
                add(rejected("prepare_load", ([k],)))  # not ready
                add(rejected("complete_load", ([k],)))
            for k in [k for k in known if refs.get(k) == 0][:1]:
                add(rejected("complete_load", ([k],)))  # ref_cnt already 0
            first = (known + unknown)[0]
            add(rejected("prepare_store", ([first, first],)))  # repeated key
        return with_take_events(out, snap.events)

    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        found = vllm_offload.call_invariants(
            edge.method,
            edge.args,
            before,
            snap,
            spec_out.returned,
            spec_out.raised,
            self.config,
        )
        if found is not None:
            return found
        counter = getattr(target.m, "_num_evictable_cache_blocks", None)
        if isinstance(counter, int):
            problem = inv.evictable_counter_matches_scan(snap, counter)
            if problem:
                return "evictable_counter_matches_scan", problem
        return None
