"""The one snapshot reader for block managers, and the one for request schedulers.

They read only the upstream attribute names (``num_blocks``, ``block_size``, ``blocks[i].ref_count``,
``blocks[i].hash``, ``free_block_ids``, ``used_block_ids``, ``hash_to_block_ids``; a scheduler's
``waiting_queue``, ``running_queue``, ``remote_kv_requests``, ``pending_free_blocks``, ...), so the
same readers fit kvspec's spec, kvspec's impl and an upstream InfiniLM ``BlockManager`` or
``Scheduler``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping
from operator import attrgetter
from typing import Any, NamedTuple

_REF = attrgetter("ref_count")
_HASH = attrgetter("hash")
_new = tuple.__new__


class BlockManagerSnapshot(NamedTuple):
    """Every observable of a block manager, as a comparable value.

    Orders are part of the value: ``free_block_ids`` is the free deque left to right (allocation
    order), ``used_block_ids`` the used set's *iteration* order (eviction order), and each prefix
    index entry lists its pages in set iteration order (which copy a lookup pins). A NamedTuple,
    not a dataclass: checkers build two per call, and tuple construction is the cheapest.
    """

    num_blocks: int
    block_size: int
    free_block_ids: tuple[int, ...]
    used_block_ids: tuple[int, ...]
    ref_counts: tuple[int, ...]
    hashes: tuple[bytes, ...]
    hash_to_block_ids: tuple[tuple[bytes, tuple[int, ...]], ...]  # sorted by hash

    def differing_fields(self, other: BlockManagerSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (hashes as hex)."""
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free_block_ids": list(self.free_block_ids),
            "used_block_ids": list(self.used_block_ids),
            "ref_counts": list(self.ref_counts),
            "hashes": [h.hex() for h in self.hashes],
            "hash_to_block_ids": {h.hex(): list(ids) for h, ids in self.hash_to_block_ids},
        }


def read_block_manager(bm: Any) -> BlockManagerSnapshot:
    """Snapshot any object with the upstream ``BlockManager`` attribute names."""
    blocks = bm.blocks
    index = bm.hash_to_block_ids
    return _new(  # the fields in order, without NamedTuple's Python-level constructor
        BlockManagerSnapshot,
        (
            bm.num_blocks,
            bm.block_size,
            tuple(bm.free_block_ids),
            tuple(bm.used_block_ids),
            tuple(map(_REF, blocks)),  # ref_counts
            tuple(map(_HASH, blocks)),  # hashes
            # hash_to_block_ids: (hash, its pages) pairs sorted by hash (distinct dict keys)
            tuple(sorted(zip(index, map(tuple, index.values()), strict=True))) if index else (),
        ),
    )


# ----------------------------------------------------------------------------- scheduler
class SchedulerSnapshot(NamedTuple):
    """Every observable of a request scheduler and of the requests it was given, comparable.

    Queue orders are part of the value (head first); ``remote`` is ``remote_kv_requests`` in
    insertion order (promotion order); the id sets are sorted. ``requests`` has one row per
    request the engine knows, sorted by id: ``(id, status name, block_table, slot_mapping,
    num_blocks, num_computed_tokens, num_local_cached_tokens, num_cache_indexed_blocks,
    mamba_cache_index, generated tokens)``. ``mamba`` is the mamba manager's ``(free, used)``
    ids, ``()`` without one. Hidden counters (the production scheduler's reservation counter)
    are not part of it: the invariants check them against it.
    """

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    remote: tuple[str, ...]
    finished_receiving: tuple[str, ...]
    failed_receiving: tuple[str, ...]
    pending_free_blocks: tuple[tuple[str, tuple[int, ...]], ...]
    pending_kv_decode_blocks: int
    cache_stats: tuple[tuple[str, int], ...]
    requests: tuple[tuple[Any, ...], ...]
    mamba: tuple[Any, ...]
    block_manager: BlockManagerSnapshot

    def differing_fields(self, other: SchedulerSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]

    def placed(self) -> tuple[str, ...]:
        """The ids the scheduler holds: waiting, running, then remote-pending (repeats kept)."""
        return self.waiting + self.running + self.remote

    def holders(self, lost: Iterable[str] = ()) -> list[tuple[int, ...]]:
        """Every block table the scheduler's bookkeeping holds pages for: the placed requests'
        tables (in ``placed()`` order), then the ``lost`` requests' (sorted by id: dequeued by a
        step that raised, reference §9.14), then the parked ``pending_free_blocks`` tables."""
        tables = {row[0]: row[2] for row in self.requests}
        return [
            *(tables[rid] for rid in self.placed()),
            *(tables[rid] for rid in sorted(lost)),
            *(table for _, table in self.pending_free_blocks),
        ]

    def quiescent(self, lost: Collection[str] = ()) -> bool:
        """Nothing placed, nothing parked and nothing lost: every page should be unreferenced."""
        return not self.placed() and not self.pending_free_blocks and not lost


def queue_items(queue: Any) -> tuple[Any, ...]:
    """The items of a scheduler's request queue, head first, without taking any: kvspec's
    ``RequestQueue`` (its ``snapshot()``), upstream's ``janus.Queue`` (the deque it keeps in
    ``_queue``), a ``queue.Queue`` (``queue``), or any iterable. ``TypeError`` naming the type
    otherwise."""
    snapshot = getattr(queue, "snapshot", None)
    if callable(snapshot):
        return tuple(snapshot())
    for name in ("_queue", "queue"):
        inner = getattr(queue, name, None)
        if isinstance(inner, deque):
            return tuple(inner)
    try:
        return tuple(queue)
    except TypeError:
        raise TypeError(
            f"cannot read the items of a {type(queue).__name__} request queue (kvspec reads a "
            "snapshot() method, a janus.Queue, a queue.Queue or an iterable)"
        ) from None


def _ids(queue: Any) -> tuple[str, ...]:
    return tuple(map(_REQUEST_ID, queue_items(queue)))


_REQUEST_ID = attrgetter("request_id")


def request_row(request_id: str, r: Any) -> tuple[Any, ...]:
    """One request's row of :attr:`SchedulerSnapshot.requests`."""
    status = r.status
    try:
        name = status._name_  # an Enum member's name, without the ``name`` property's call
    except AttributeError:
        name = status.name
    return (
        request_id,
        name,
        tuple(r.block_table),
        tuple(r.slot_mapping),
        r.num_blocks,
        r.num_computed_tokens,
        r.num_local_cached_tokens,
        r.num_cache_indexed_blocks,
        r.mamba_cache_index,
        r.get_num_generated_tokens(),
    )


def read_scheduler(
    scheduler: Any, requests: Mapping[str, Any], rows: tuple[tuple[Any, ...], ...] | None = None
) -> SchedulerSnapshot:
    """Snapshot any object with the upstream ``Scheduler`` attribute names, plus ``requests``
    (request id -> request: every request the engine gave it, finished ones included).
    ``rows``: the requests' rows when the caller has them (see :func:`request_row`)."""
    s = scheduler
    mamba = s.mamba_cache_manager
    return _new(  # the fields in order, without NamedTuple's Python-level constructor
        SchedulerSnapshot,
        (
            _ids(s.waiting_queue),  # waiting
            _ids(s.running_queue),  # running
            tuple(s.remote_kv_requests),  # remote
            tuple(sorted(s.finished_receiving_kv_req_ids)),  # finished_receiving
            tuple(sorted(s.failed_receiving_kv_req_ids)),  # failed_receiving
            tuple(sorted((k, tuple(v)) for k, v in s.pending_free_blocks.items())),
            s.pending_kv_decode_blocks,
            tuple(sorted(s.get_cache_stats().items())),  # cache_stats
            rows  # requests
            if rows is not None
            else tuple([request_row(rid, r) for rid, r in sorted(requests.items())]),
            (tuple(mamba.free_block_ids), tuple(mamba.used_block_ids)) if mamba else (),
            read_block_manager(s.cache_manager),
        ),
    )
