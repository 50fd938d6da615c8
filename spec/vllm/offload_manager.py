"""vLLM's ``CPUOffloadingManager`` (``vllm/v1/kv_offload/cpu/manager.py``) — the executable spec.

Source of truth: docs/vllm.md §1 (operations), §4 (upstream tests), §7.1, §8, in "the
#50992 state" (§0.1): #37874 atomic policies, #41795 ``HIT_PENDING``, #41727 store threshold,
#41956 ``reset_cache``, #45757 guard, #46216 LRU, #47744 ``req_context``. Named variants are
constructor keywords: ``cache_policy="lru" | "arc"`` (upstream name), ``lru="v1" | "v2"`` and
``arc_t1_fallback=False | True`` (#55461).

Exact-order rules reproduced (§1.2, §8):

* block ids: fresh ids ``0, 1, ...`` first, then the free list as a *stack* (last freed, first
  reused); evicted ids are pushed in eviction order, failed-store ids in ``complete_store`` order;
* ``prepare_store`` protects *every* input key from eviction, already-stored ones included
  (#35846) — but after the threshold filter (quirk: a stored key dropped by the filter is not
  protected, §1.2);
* #45757 guard: if more blocks must be evicted than are idle, ``None`` at once. The spec counts idle
  blocks by a scan (:attr:`CPUOffloadingManager._num_evictable_cache_blocks`), so the guard can
  never change a result here; the impl keeps a counter, which must equal that scan;
* events: one ``removed=True`` event per successful eviction (eviction order) and one
  ``removed=False`` event per ``complete_store(success=True)`` call that readied a block (in the
  iteration order of the keys passed); a failed store emits nothing and leaves no ghost.

Where kvspec is stricter than upstream (documented choices, reference §1.2 "keys distinct"):

* ``prepare_store`` rejects duplicate keys (``InvalidArgument``; upstream would allocate two blocks
  and lose one) — validated first, nothing changes;
* ``prepare_load`` / ``complete_load`` check *every* key before changing anything. Upstream asserts
  key by key inside its loop, so an upstream target may have pinned/unpinned the keys before the
  bad one when it raises; the exception *kind* (``AssertionError``) is the same.

Not modelled: metrics/``get_stats`` (``stores_skipped_in_current_batch`` is kept as an attribute,
outside the snapshot), ``on_new_request``/``on_request_finished`` (no-ops for LRU/ARC before
#51787), the policy factory's module path. ``req_context`` is accepted and ignored.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, NamedTuple, Protocol

from spec.errors import DoubleFreeError, InvalidArgument, OffloadStateError
from spec.infinilm.block_manager import check_count
from spec.vllm import BlockStatus, Key
from spec.vllm.arc import ARCCachePolicy, ARCSnapshot, read_arc_policy
from spec.vllm.lru import LRU_VARIANTS, LRUCachePolicy, LRUSnapshot, LRUVariant, read_lru_policy
from spec.vllm.releases import (
    RELEASES,
    THRESHOLD_COUNTINGS,
    THRESHOLD_SCOPES,
    ThresholdCounting,
    ThresholdScope,
    record_offers,
    release_keywords,
    select_store_keys,
)

__all__ = [
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "LookupResult",
    "OffloadManagerSnapshot",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "read_offload_manager",
    "read_policy",
    "variant_keywords",
]

CachePolicyName = Literal["lru", "arc"]
CACHE_POLICIES: tuple[CachePolicyName, ...] = ("lru", "arc")

_RELEASE_VARIANTS = tuple(f"r{release}" for release in RELEASES)
VARIANTS: dict[str, tuple[str, ...]] = {
    # the #50992 state / #55461 (``arc_t1_fallback=True``), then vLLM releases (docs/vllm-releases.md)
    "arc": ("no_fallback", "t1_fallback", *_RELEASE_VARIANTS),
    # #46216 (the #50992 state) / #37874 (``lru="v1"``), then vLLM releases
    "lru": ("v2", "v1", *_RELEASE_VARIANTS),
}
"""Named variants per cache policy, the default (the #50992 state) first; ``rX.Y`` is the
behaviour of vLLM release X.Y (``r0.28`` is the default's)."""


def variant_keywords(policy: str, variant: str) -> dict[str, Any]:
    """The constructor keywords selecting ``variant``; nothing for the default, so a target with
    upstream's constructor (no kvspec variant keywords) runs the default variant."""
    if variant not in VARIANTS.get(policy, ()):
        raise InvalidArgument(
            f"unknown {policy} variant {variant!r}; choose one of {VARIANTS.get(policy, ())}"
        )
    if variant.startswith("r"):
        return release_keywords(policy, variant[1:])
    if policy == "arc":
        return {"arc_t1_fallback": True} if variant == "t1_fallback" else {}
    return {"lru": "v1"} if variant == "v1" else {}


class LookupResult(Enum):
    """Result of :meth:`CPUOffloadingManager.lookup` (#41795; compare across codebases by name)."""

    MISS = "MISS"
    HIT = "HIT"
    HIT_PENDING = "HIT_PENDING"


@dataclass(frozen=True)
class CPULoadStoreSpec:
    """Where a worker reads or writes: CPU block ids, co-indexed with the keys of the call.

    Upstream holds a numpy array; a tuple keeps the value comparable and hashable.
    """

    block_ids: tuple[int, ...]

    @staticmethod
    def medium() -> str:
        return "CPU"


@dataclass(frozen=True)
class PrepareStoreOutput:
    """What ``prepare_store`` decided: keys to write (input order), their ids, keys evicted."""

    keys_to_store: list[Key]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[Key]


@dataclass(frozen=True)
class OffloadingEvent:
    """Blocks stored (``removed=False``) or evicted (``removed=True``) on ``medium``;
    ``metadata_only``: a failed store's removal (``failed_store_event``), no data was written."""

    keys: list[Key]
    medium: str
    removed: bool
    metadata_only: bool = False


EventRecord = tuple[tuple[Key, ...], bool]
"""``(keys, removed)``: one not-yet-taken event inside a snapshot."""


class CachePolicy(Protocol):
    """The policy verbs the manager uses (upstream ``CachePolicy``), plus ``items``/``snapshot``."""

    def get(self, key: Key) -> BlockStatus | None: ...
    def insert(self, key: Key, block: BlockStatus) -> None: ...
    def remove(self, key: Key) -> None: ...
    def touch(self, keys: Iterable[Key], req_context: object = None) -> None: ...
    def on_store_miss(self, keys: Sequence[Key]) -> None: ...
    def evict(
        self, n: int, protected: AbstractSet[Key]
    ) -> list[tuple[Key, BlockStatus]] | None: ...
    def clear(self) -> None: ...
    def mark_evictable(self, key: Key) -> None: ...
    def mark_non_evictable(self, key: Key) -> None: ...
    def items(self) -> Iterator[tuple[Key, BlockStatus]]: ...
    def snapshot(self) -> ARCSnapshot | LRUSnapshot: ...


class OffloadManagerSnapshot(NamedTuple):
    """Every observable of an offload manager, as a hashable, comparable value.

    * ``free_list``: freed ids bottom to top (the *last* one is reused first); ids
      ``num_allocated_blocks..num_blocks-1`` have never been handed out;
    * ``policy``: :class:`ARCSnapshot` or :class:`LRUSnapshot` — cached blocks with ids and ref
      counts (``-1`` pending, ``0`` idle, ``> 0`` loading) plus the policy's orders and target;
    * ``events``: events not yet taken (``None`` when events are disabled);
    * ``counts``: the store-threshold tracker, oldest first (``None`` when disabled).

    Not included: the #45757 counter (impl-internal; an invariant compares it with the idle blocks
    of ``policy.blocks``) and metrics.
    """

    num_blocks: int
    num_allocated_blocks: int
    free_list: tuple[int, ...]
    policy: ARCSnapshot | LRUSnapshot
    events: tuple[EventRecord, ...] | None
    counts: tuple[tuple[Key, int], ...] | None

    def differing_fields(self, other: OffloadManagerSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]


def read_policy(policy: Any) -> ARCSnapshot | LRUSnapshot:
    """A kvspec policy's ``snapshot()``; an upstream policy read through its attribute names."""
    if callable(getattr(policy, "snapshot", None)):
        snap: ARCSnapshot | LRUSnapshot = policy.snapshot()
        return snap
    return read_arc_policy(policy) if hasattr(policy, "t1") else read_lru_policy(policy)


def read_offload_manager(manager: Any) -> OffloadManagerSnapshot:
    """Snapshot any object with the upstream ``CPUOffloadingManager`` attribute names
    (``_num_blocks``, ``_num_allocated_blocks``, ``_free_list``, ``_policy``, ``events``,
    ``counts``)."""
    events = manager.events
    counts = manager.counts
    return OffloadManagerSnapshot(
        num_blocks=manager._num_blocks,
        num_allocated_blocks=manager._num_allocated_blocks,
        free_list=tuple(manager._free_list),
        policy=read_policy(manager._policy),
        events=None if events is None else tuple((tuple(e.keys), e.removed) for e in events),
        counts=None if counts is None else tuple(counts.items()),
    )


def make_policy(
    cache_policy: str,
    num_blocks: int,
    *,
    arc_t1_fallback: bool,
    lru: str,
    arc_cls: Callable[..., CachePolicy] = ARCCachePolicy,
    lru_cls: Callable[..., CachePolicy] = LRUCachePolicy,
) -> CachePolicy:
    """The named policy with its named variant (``arc_cls``/``lru_cls`` let the impl reuse this);
    unknown names raise ``InvalidArgument``."""
    if lru not in LRU_VARIANTS:
        raise InvalidArgument(f"lru must be one of {LRU_VARIANTS}, got {lru!r}")
    if cache_policy == "arc":
        return arc_cls(num_blocks, t1_fallback=arc_t1_fallback)
    if cache_policy == "lru":
        return lru_cls(num_blocks, variant=lru)
    raise InvalidArgument(f"Unknown cache policy: {cache_policy!r}. Supported: {CACHE_POLICIES}")


def check_release_features(
    threshold_counting: str, threshold_scope: str, arc_store_miss: bool, failed_store_event: bool
) -> None:
    """Validate the release features (shared by spec and impl; ``InvalidArgument``)."""
    if threshold_counting not in THRESHOLD_COUNTINGS:
        raise InvalidArgument(
            f"threshold_counting must be one of {THRESHOLD_COUNTINGS}, got {threshold_counting!r}"
        )
    if threshold_scope not in THRESHOLD_SCOPES:
        raise InvalidArgument(
            f"threshold_scope must be one of {THRESHOLD_SCOPES}, got {threshold_scope!r}"
        )
    for name, flag in (
        ("arc_store_miss", arc_store_miss),
        ("failed_store_event", failed_store_event),
    ):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{name} must be a bool, got {flag!r}")


def filter_metadata_only(
    event: OffloadingEvent, is_cached: Callable[[Key], bool]
) -> Iterator[OffloadingEvent]:
    """``event`` as ``take_events`` yields it: a ``metadata_only`` removal without the keys that
    are cached again (nothing if none is left); any other event as it is."""
    if not event.metadata_only:
        yield event
        return
    keys = [k for k in event.keys if not is_cached(k)]
    if keys:
        yield OffloadingEvent(keys=keys, medium=event.medium, removed=True, metadata_only=True)


def check_constructor(
    num_blocks: int, store_threshold: int, max_tracker_size: int, arc_t1_fallback: bool
) -> None:
    """Validate the manager's numeric and flag arguments (shared by spec and impl)."""
    check_count("num_blocks", num_blocks)
    if not isinstance(store_threshold, int) or isinstance(store_threshold, bool):
        raise InvalidArgument(f"store_threshold must be an int, got {store_threshold!r}")
    check_count("max_tracker_size", max_tracker_size)
    if store_threshold >= 2 and max_tracker_size == 0:
        raise InvalidArgument("max_tracker_size must be > 0 when the store threshold is active")
    if not isinstance(arc_t1_fallback, bool):
        raise InvalidArgument(f"arc_t1_fallback must be a bool, got {arc_t1_fallback!r}")


class CPUOffloadingManager:
    """CPU offload bookkeeping: a block-id pool, ref counts, a cache policy and events (§1).

    Data model (upstream names): ``_num_blocks`` N, ``_num_allocated_blocks`` (fresh ids handed
    out), ``_free_list`` (stack of freed ids), ``_policy`` (owns the ``BlockStatus`` of every cached
    key), ``events`` (``None`` unless ``enable_events``), ``counts`` (store-threshold tracker,
    ``None`` unless ``store_threshold >= 2``).
    """

    def __init__(
        self,
        num_blocks: int,
        cache_policy: CachePolicyName = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        *,
        arc_t1_fallback: bool = False,
        lru: LRUVariant = "v2",
        threshold_counting: ThresholdCounting = "lookup",
        threshold_scope: ThresholdScope = "all_inputs",
        arc_store_miss: bool = False,
        failed_store_event: bool = False,
    ) -> None:
        """Pre: ``num_blocks >= 0``; ``cache_policy`` in ``("lru", "arc")``; ``lru`` in
        ``("v1", "v2")`` (ignored by ARC); ``arc_t1_fallback`` and ``arc_store_miss`` bools
        (ignored by LRU); ``max_tracker_size >= 1`` when ``store_threshold >= 2``; the release
        features as :mod:`spec.vllm.releases` names them. Post: no block cached, no id handed out,
        no event."""
        check_constructor(num_blocks, store_threshold, max_tracker_size, arc_t1_fallback)
        check_release_features(
            threshold_counting, threshold_scope, arc_store_miss, failed_store_event
        )
        self.threshold_counting = threshold_counting
        self.threshold_scope = threshold_scope
        self.arc_store_miss = arc_store_miss and cache_policy == "arc"
        self.failed_store_event = failed_store_event
        self.medium = CPULoadStoreSpec.medium()
        self._num_blocks = num_blocks
        self._num_allocated_blocks = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._policy = make_policy(
            cache_policy, num_blocks, arc_t1_fallback=arc_t1_fallback, lru=lru
        )
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.stores_skipped_in_current_batch = 0
        self.counts: OrderedDict[Key, int] | None = OrderedDict() if store_threshold >= 2 else None

    # ----------------------------------------------------------------- helpers
    def snapshot(self) -> OffloadManagerSnapshot:
        """All observable state (see :class:`OffloadManagerSnapshot`)."""
        return read_offload_manager(self)

    @property
    def _num_evictable_cache_blocks(self) -> int:
        """Cached blocks with ``ref_cnt == 0`` (#45757's counter; here a scan, by definition)."""
        return sum(1 for _, block in self._policy.items() if block.ref_cnt == 0)

    def _get_num_free_blocks(self) -> int:
        """Ids never handed out plus freed ids."""
        return self._num_blocks - self._num_allocated_blocks + len(self._free_list)

    def _allocate_blocks(self, n: int) -> list[BlockStatus]:
        """Pre: ``n`` ids are free. Post: ``n`` pending blocks: fresh ids ascending, then popped."""
        fresh = min(n, self._num_blocks - self._num_allocated_blocks)
        ids = list(range(self._num_allocated_blocks, self._num_allocated_blocks + fresh))
        self._num_allocated_blocks += fresh
        ids += [self._free_list.pop() for _ in range(n - fresh)]  # LIFO: last freed first
        return [BlockStatus(block_id) for block_id in ids]

    def _emit(self, keys: list[Key], removed: bool) -> None:
        if keys and self.events is not None:
            self.events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=removed))

    # ----------------------------------------------------------------- queries
    def lookup(self, key: Key, req_context: object = None) -> LookupResult:
        """Whether ``key`` is cached (§1.2, #41795).

        Post: with the threshold tracker on and ``threshold_counting="lookup"``, ``key``'s count
        is bumped and it becomes the newest tracker entry (the oldest entry is dropped first if the
        tracker is full). Returns ``MISS`` (not cached), ``HIT_PENDING`` (store in flight) or
        ``HIT`` (ready).
        """
        if self.counts is not None and self.threshold_counting == "lookup":
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
            else:
                if len(self.counts) >= self.max_tracker_size:
                    self.counts.popitem(last=False)
                self.counts[key] = 1
        block = self._policy.get(key)
        if block is None:
            return LookupResult.MISS
        return LookupResult.HIT if block.is_ready else LookupResult.HIT_PENDING

    def touch(self, keys: Collection[Key], req_context: object = None) -> None:
        """Record an access to ``keys`` in the policy (§1.2, §2.2, §3).

        Pre: none (no validation; unknown keys are ignored). Post: the policy's ``touch`` applied,
        last key first, so the first key ends most recent (ARC: ghost keys adapt the target).
        """
        self._policy.touch(keys, req_context)

    # ----------------------------------------------------------------- loads
    def prepare_load(self, keys: Collection[Key], req_context: object = None) -> CPULoadStoreSpec:
        """Pin ``keys`` for reading (§1.2).

        Pre (validated first, nothing changes on failure): every key is cached
        (``OffloadStateError``) and ready (``OffloadStateError``). Repeats are allowed and pin
        twice. Post: each key's ``ref_cnt`` += 1 (a 0 -> 1 transition makes it non-evictable);
        returns the block ids co-indexed with ``keys``.
        """
        keys = list(keys)
        for key in keys:
            block = self._policy.get(key)
            if block is None:
                raise OffloadStateError(f"Block {key!r} not found in cache")
            if not block.is_ready:
                raise OffloadStateError(f"Block {key!r} is not ready for reading")
        block_ids = []
        for key in keys:
            block = self._policy.get(key)
            assert block is not None
            if block.ref_cnt == 0:
                self._policy.mark_non_evictable(key)
            block.ref_cnt += 1
            block_ids.append(block.block_id)
        return CPULoadStoreSpec(tuple(block_ids))

    def complete_load(self, keys: Collection[Key], req_context: object = None) -> None:
        """Unpin ``keys`` after reading (§1.2).

        Pre (validated first, nothing changes on failure): every key is cached and not pending
        (``OffloadStateError``) and its ``ref_cnt`` is at least the number of times it appears
        (``DoubleFreeError``: upstream's ``ref_cnt is already 0``). Post: each ``ref_cnt`` -= 1 in
        the iteration order of ``keys``; a block reaching 0 becomes evictable (LRU v2: most recent).
        """
        keys = list(keys)
        times = Counter(keys)
        for key in keys:
            block = self._policy.get(key)
            if block is None:
                raise OffloadStateError(f"Block {key!r} not found")
            if not block.is_ready:
                raise OffloadStateError(f"Block {key!r} is being stored, not loaded")
            if block.ref_cnt < times[key]:
                raise DoubleFreeError(
                    f"Block {key!r} ref_cnt is already 0 (ref_cnt={block.ref_cnt}, "
                    f"completed {times[key]} time(s))"
                )
        for key in keys:
            block = self._policy.get(key)
            assert block is not None
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._policy.mark_evictable(key)

    # ----------------------------------------------------------------- stores
    def prepare_store(
        self, keys: Collection[Key], req_context: object = None
    ) -> PrepareStoreOutput | None:
        """Allocate blocks for the keys not cached yet, evicting if needed (§1.2).

        Pre (validated first, nothing changes on failure): keys are distinct (``InvalidArgument``).
        Steps: (0) with the tracker on and a store counting mode, count the offered keys
        (:func:`~spec.vllm.releases.record_offers`; kept even if the call returns ``None``);
        (1) with the tracker on, the threshold filter (``threshold_scope``: every input key, or
        only the uncached ones) drops the keys counted fewer than ``store_threshold`` times (their
        number goes to ``stores_skipped_in_current_batch``); (2) ``keys_to_store`` = the kept keys
        not cached, in input order; with ``arc_store_miss`` they adapt the ARC target as ghost hits
        (kept even if the call returns ``None``); if none, an empty output; (3) ``need`` =
        ``len(keys_to_store)`` minus free ids; if ``need > 0``: ``None`` if ``need`` exceeds the idle
        blocks (#45757 guard), else evict ``need`` blocks protecting the kept input keys (#35846;
        ``new_only``: every input key) — ``None`` if the policy cannot (the eviction changed
        nothing) — push the victims' ids in eviction order and emit one ``removed=True`` event;
        (4) allocate (fresh ids ascending, then LIFO) and insert each key as a pending block
        (``ref_cnt == -1``). Returns ``PrepareStoreOutput(keys_to_store, ids, evicted_keys)`` or
        ``None``.
        """
        keys = list(keys)
        if len(set(keys)) != len(keys):
            dupes = [k for k, n in Counter(keys).items() if n > 1]
            raise InvalidArgument(f"prepare_store keys must be distinct; repeated: {dupes!r}")
        if self.counts is not None and self.threshold_counting != "lookup":
            record_offers(self.counts, keys, self.max_tracker_size, self.threshold_counting)
        keys_to_store, protected, skipped = select_store_keys(
            keys,
            self.counts,
            self.store_threshold,
            lambda k: self._policy.get(k) is not None,
            self.threshold_scope,
        )
        self.stores_skipped_in_current_batch += skipped
        if self.arc_store_miss:
            self._policy.on_store_miss(keys_to_store)
        if not keys_to_store:
            return PrepareStoreOutput(
                keys_to_store=[], store_spec=CPULoadStoreSpec(()), evicted_keys=[]
            )
        need = len(keys_to_store) - self._get_num_free_blocks()
        evicted_keys: list[Key] = []
        if need > 0:
            if need > self._num_evictable_cache_blocks:
                return None  # #45757 fast fail (never changes a result here: a scan is exact)
            evicted = self._policy.evict(need, protected)  # #35846: protect the input keys
            if evicted is None:
                return None  # the policy's eviction is atomic: nothing changed
            for key, block in evicted:
                self._free_list.append(block.block_id)
                evicted_keys.append(key)
            self._emit(evicted_keys, removed=True)
        blocks = self._allocate_blocks(len(keys_to_store))
        for key, block in zip(keys_to_store, blocks, strict=True):
            self._policy.insert(key, block)
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=CPULoadStoreSpec(tuple(b.block_id for b in blocks)),
            evicted_keys=evicted_keys,
        )

    def complete_store(
        self, keys: Collection[Key], req_context: object = None, success: bool = True
    ) -> None:
        """Finish the stores of ``keys`` (§1.2), in the iteration order of ``keys``.

        Pre: none — keys that are not cached or already ready are skipped (not an error, as
        upstream). Post for each pending key: ``success`` -> ready and idle (``ref_cnt = 0``,
        evictable; LRU v2: most recent), and one ``removed=False`` event lists them; failure ->
        removed from the policy with no ghost entry, its id pushed on the free list, and no event
        (``failed_store_event``: one ``removed=True``, ``metadata_only`` event lists them).
        """
        stored: list[Key] = []
        dropped: list[Key] = []
        for key in keys:
            block = self._policy.get(key)
            if block is None or block.is_ready:
                continue
            if success:
                block.ref_cnt = 0
                self._policy.mark_evictable(key)
                stored.append(key)
            else:
                self._policy.remove(key)
                self._free_list.append(block.block_id)
                dropped.append(key)
        self._emit(stored, removed=False)
        if self.failed_store_event and dropped and self.events is not None:
            self.events.append(
                OffloadingEvent(keys=dropped, medium=self.medium, removed=True, metadata_only=True)
            )

    # ----------------------------------------------------------------- lifecycle
    def reset_cache(self) -> None:
        """Forget every block (#41956). Pre: none. Post: policy cleared (ARC: ghosts and target too), no id
        handed out, free list empty. Pending events and the threshold tracker are kept."""
        self._policy.clear()
        self._free_list.clear()
        self._num_allocated_blocks = 0

    def take_events(self) -> Iterator[OffloadingEvent]:
        """Yield the pending events, oldest first, then clear them (§1.2).

        Pre: none. Post (once the generator is exhausted — it is lazy, as upstream): no pending
        event. Yields nothing when events are disabled. A ``metadata_only`` removal yields only its
        keys that are not cached again by now, and nothing if none is left.
        """
        if self.events is not None:
            for event in self.events:
                yield from filter_metadata_only(event, lambda k: self._policy.get(k) is not None)
            self.events.clear()
