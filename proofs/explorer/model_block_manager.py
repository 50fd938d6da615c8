"""The InfiniLM block-manager model of the explorer.

The alphabet mirrors ``stateful_tests.infinilm_block_manager.Driver``: capacity queries, frees,
admissions with and without a pinned prefix, prefix lookups, publishes of every choice of page
contents, decodes, drafts, truncations and the rejected-input alphabet. The generator-side model
is the tuple of live holders (request tables and standalone prefix pins); the state key adds the
hash tables of the spec's and the target's sets (:func:`_bm_tables`), since eviction order is the
used set's iteration order. The target's hidden ``get_total_usable_blocks`` counter is checked on
every edge (``referenced_count_matches_live_pages``).
"""

from __future__ import annotations

import itertools
import pickle
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

from proofs.explorer.search import Edge, Model, check_ranges, rejected
from proofs.explorer.set_classes import MAX_IDS, layout_classes
from proofs.explorer.set_clone import clone, clone_set, rebuild_set, set_layout, set_state
from spec import invariants as inv
from spec.infinilm.block_manager import BlockManager as SpecBlockManager
from spec.infinilm.snapshot import BlockManagerSnapshot, read_block_manager
from stateful_tests import infinilm_block_manager as bm
from stateful_tests.lockstep import Check, Outcome


@dataclass(frozen=True)
class BlockManagerBounds:
    """The small scope of the block-manager explorer.

    ``pages`` pages of ``block_size`` tokens (a small scope: at most 8); tokens
    from ``0..vocab-1``; at most ``tables`` live holders (request tables and standalone prefix
    pins); a request holds at most ``tokens`` tokens (prompt, decode and draft slots together).
    ``bad_inputs``: the rejected-input alphabet; ``queries``: capacity queries and slot rebuilds.
    """

    pages: int = 3
    block_size: int = 2
    vocab: int = 1
    tables: int = 2
    tokens: int = 3
    bad_inputs: bool = True
    queries: bool = True
    layout_classes: bool = True

    # pages of one token (every token completes a page), then the base (pages of two tokens);
    # the small option configurations run first, so a deadline-bound run reaches each of them
    SCOPES: ClassVar[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
        "default": (("block-size-1", {"block_size": 1, "pages": 2, "tokens": 3}), ("base", {})),
    }
    DIMENSIONS: ClassVar[tuple[str, ...]] = ("block_size",)

    HELP: ClassVar[dict[str, str]] = {
        "pages": "pages in the pool (at most 8)",
        "block_size": "tokens per page",
        "vocab": "prompt token alphabet size",
        "tables": "live request tables and prefix pins at once",
        "tokens": "tokens a request holds at most (prompt, decode, drafts)",
        "bad_inputs": "the rejected-input alphabet",
        "queries": "capacity queries and slot rebuilds",
        "layout_classes": (
            "the set-table quotient: states whose set tables no use can tell apart explored "
            f"once (kvspec's own block managers, at most {MAX_IDS} pages)"
        ),
    }

    def validate(self) -> None:
        check_ranges(
            self,
            (
                ("pages", 1, 8),
                ("block_size", 1, 8),
                ("vocab", 1, 8),
                ("tables", 1, 8),
                ("tokens", 1, 64),
            ),
        )


_REF, _HASH = attrgetter("ref_count"), attrgetter("hash")
_new_snapshot = tuple.__new__


def fast_read(bm: Any) -> BlockManagerSnapshot:
    """:func:`read_block_manager`, the same attribute reads without a Python-level constructor
    (checked against it on the initial objects before a search uses it)."""
    blocks, index = bm.blocks, bm.hash_to_block_ids
    return _new_snapshot(
        BlockManagerSnapshot,
        (
            bm.num_blocks,
            bm.block_size,
            tuple(bm.free_block_ids),
            tuple(bm.used_block_ids),
            tuple(map(_REF, blocks)),
            tuple(map(_HASH, blocks)),
            _index_rows(index) if index else (),
        ),
    )


def _index_rows(index: dict[bytes, Any]) -> tuple[tuple[bytes, tuple[int, ...]], ...]:
    if len(index) == 1:  # (the common case: no sort)
        for h, ids in index.items():
            return ((h, tuple(ids)),)
    return tuple(sorted([(h, tuple(ids)) for h, ids in index.items()]))


def _table(x: Any) -> Any:
    return set_layout(x) if type(x) is set else tuple(x)


def _bm_tables(bm: Any) -> tuple[Any, ...]:
    """The hash tables of a block manager's sets (used pages, each prefix-index entry)."""
    index = bm.hash_to_block_ids
    return (_table(bm.used_block_ids), *(_table(index[h]) for h in sorted(index)))


_BM_ATTRIBUTES = frozenset(
    {
        "num_blocks",
        "block_size",
        "blocks",
        "free_block_ids",
        "used_block_ids",
        "hash_to_block_ids",
        "num_referenced",
    }
)


def _block_manager_cloner(cls: type) -> Any:
    """An exact clone for kvspec's own block managers and their method-only subclasses (the
    mutants): the generic :func:`clone`, unrolled. ``False`` for any other class."""
    from impl.infinilm import block_manager as impl_bm
    from spec.infinilm import block_manager as spec_bm

    if not issubclass(cls, spec_bm.BlockManager | impl_bm.BlockManager):
        return False
    new = object.__new__
    spec_block, impl_block = spec_bm.Block, impl_bm.Block

    def fast(bm: Any) -> Any:
        state = bm.__dict__.copy()
        blocks = []
        for b in bm.blocks:
            c: Any
            if type(b) is impl_block:
                c = new(impl_block)
                c.block_id, c.ref_count, c.hash = b.block_id, b.ref_count, b.hash
            elif type(b) is spec_block:
                c = new(spec_block)
                c.__dict__.update(b.__dict__)
            else:
                return clone(bm)
            blocks.append(c)
        state["blocks"] = blocks
        state["free_block_ids"] = bm.free_block_ids.copy()
        state["used_block_ids"] = clone_set(bm.used_block_ids)
        index = bm.hash_to_block_ids
        state["hash_to_block_ids"] = {h: clone_set(v) for h, v in index.items()} if index else {}
        copied = new(cls)
        copied.__dict__.update(state)
        return copied

    return fast


def _pack_manager(bm: Any, kind: int) -> tuple[Any, ...] | None:
    """One of kvspec's own block managers as plain values (``kind``: which of the model's two
    classes), every set as its table (:func:`set_state`); ``None`` for any other shape."""
    from impl.infinilm import block_manager as impl_bm
    from spec.infinilm import block_manager as spec_bm

    state = bm.__dict__
    if not state.keys() <= _BM_ATTRIBUTES:
        return None
    blocks: list[Any] = []
    for b in state["blocks"]:
        if type(b) is impl_bm.Block:
            blocks.append((b.block_id, b.ref_count, b.hash))
        elif type(b) is spec_bm.Block:
            blocks.append(tuple(b.__dict__.items()))
        else:
            return None
    free = state["free_block_ids"]
    if type(free) is not deque or free.maxlen is not None:
        return None
    fields: list[Any] = []
    for name, value in state.items():
        if name == "blocks":
            value = tuple(blocks)
        elif name == "free_block_ids":
            value = tuple(value)
        elif name == "used_block_ids":
            value = set_state(value)
        elif name == "hash_to_block_ids":
            value = tuple([(h, set_state(ids)) for h, ids in value.items()])
        fields.append((name, value))
    return (kind, tuple(fields))


def _unpack_manager(packed: tuple[Any, ...], classes: tuple[type, type]) -> Any:
    from impl.infinilm import block_manager as impl_bm
    from spec.infinilm import block_manager as spec_bm

    kind, fields = packed
    new = object.__new__
    state: dict[str, Any] = {}
    for name, value in fields:
        if name == "blocks":
            blocks = []
            for b in value:
                c: Any
                if type(b[0]) is tuple:  # a spec page: its attributes
                    c = new(spec_bm.Block)
                    c.__dict__.update(b)
                else:
                    c = new(impl_bm.Block)
                    c.block_id, c.ref_count, c.hash = b
                blocks.append(c)
            value = blocks
        elif name == "free_block_ids":
            value = deque(value)
        elif name == "used_block_ids":
            value = rebuild_set(value)
        elif name == "hash_to_block_ids":
            value = {h: rebuild_set(ids) for h, ids in value}
        state[name] = value
    made: Any = new(classes[kind])
    made.__dict__.update(state)
    return made


REQUEST, PIN = 0, 1
Holder = tuple[int, tuple[int, ...], int, tuple[int, ...]]  # (kind, table, tokens, published toks)
# A request's published pages are always its leading pages, so the tokens of the published prefix
# (``len == indexed * B``) are all a holder needs: page contents are chosen when pages are
# published (every choice is explored), not when a request is admitted.


_T = TypeVar("_T")
Then = Callable[[tuple[Holder, ...], Any], Any]  # (the state's holders, returned) -> holders


def _with(gen: tuple[Holder, ...], old: Holder | None, new: Holder | None) -> tuple[Holder, ...]:
    holders = list(gen)
    if old is not None:
        holders.remove(old)
    if new is not None:
        holders.append(new)
    return tuple(sorted(holders))


class BlockManagerModel(Model):
    """The block-manager alphabet (mirrors ``stateful_tests.infinilm_block_manager.Driver``)."""

    # every method of the alphabet (docs/targets.md), for the report of those never reached
    operations = (
        "allocate_slots",
        "append_slot",
        "append_slots",
        "can_allocate",
        "free_blocks",
        "get_computed_blocks",
        "get_num_free_blocks",
        "get_total_usable_blocks",
        "publish_computed_blocks",
        "truncate_blocks",
        "try_free_blocks",
        "update_blocks_slot",
    )

    memo = True  # pair_key is the whole state of both sides (_whole)
    edges_from_snapshot = True
    # The spec's read-only calls (capacity queries, slot rebuilds, lookups that pin nothing, inputs
    # it rejects before any change) read page metadata, the free deque's length and set
    # membership, never a set's iteration order or table: two spec states with one snapshot
    # answer them alike (tests/test_explorer_reductions.py checks it on every reached pair).
    spec_readonly_by_snapshot = True

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: BlockManagerBounds,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(component, target_cls, target, bounds, options)
        self.checker = bm.CHECKER
        self.spec_cls = SpecBlockManager
        self.reader = read_block_manager
        self.snapshot_checks = bm.SNAPSHOT_CHECKS
        self.state_invariants = inv.STATE_INVARIANTS
        self._validate_first = bm.validate_first
        self.contents = list(itertools.product(range(bounds.vocab), repeat=bounds.block_size))
        self._hashes: dict[tuple[int, ...], tuple[bytes, ...]] = {(): ()}
        self._fast: dict[type, Any] = {}
        self._usable: tuple[Any, int] = (None, 0)
        self._edge_objects: dict[Hashable, Any] = {}  # (see _e)
        self._held: set[Hashable] = set()  # (snapshot, holders) whose state checks hold
        self._fixed_edges = self._fixed()
        # Set tables by their class (proofs/explorer/set_classes.py): sound for the classes whose
        # every set operation is known — kvspec's own spec and impl, not their subclasses (a
        # mutant may add any id) nor an engine's class — so only their tables are classed.
        self._classes: dict[Any, int] | None = None
        self._classed: tuple[type, ...] = ()
        if bounds.layout_classes and bounds.pages <= MAX_IDS:
            from impl.infinilm.block_manager import BlockManager as ImplBlockManager

            self._classes = layout_classes(bounds.pages)
            self._classed = (SpecBlockManager, ImplBlockManager)

    def __getstate__(self) -> dict[str, Any]:
        """The model for another interpreter (a Ray worker): the set-table classes are keyed by
        tables that hold this process's element addresses, so the other side computes its own."""
        state = self.__dict__.copy()
        state["_classes"] = state["_classes"] is not None  # (a flag: recompute there)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._classes = layout_classes(self.b.pages) if state["_classes"] else None

    def initial(self) -> tuple[Any, Any, Any]:
        b = self.b
        spec, target = self.spec_cls(b.pages, b.block_size), self.target_cls(b.pages, b.block_size)
        if self.reader is read_block_manager and all(
            fast_read(x) == read_block_manager(x) for x in (spec, target)
        ):
            self.reader = fast_read  # the one reader's values, built faster
        return spec, target, ()

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return bool(self._validate_first(method, exc))

    def trace_config(self) -> dict[str, Any]:
        b = self.b
        return {
            "num_blocks": b.pages,
            "block_size": b.block_size,
            "vocab": b.vocab,
            "max_prompt_pages": -(-b.tokens // b.block_size),
        }

    def holders(self, gen: tuple[Holder, ...]) -> list[list[int]]:
        return [list(h[1]) for h in gen]

    # ------------------------------------------------------------ hashes
    def hashes(self, tokens: tuple[int, ...]) -> tuple[bytes, ...]:
        """Chained hashes of the full pages of ``tokens`` (memoised)."""
        found = self._hashes.get(tokens)
        if found is None:
            from spec.infinilm.prefix_cache import hash_block_tokens

            size = self.b.block_size
            head = self.hashes(tokens[:-size])
            found = (*head, hash_block_tokens(tokens[-size:], head[-1] if head else b""))
            self._hashes[tokens] = found
        return found

    def indexed_chains(self, index: set[bytes]) -> list[tuple[int, ...]]:
        """Token prefixes whose every page hash is indexed (breadth-first, lexicographic)."""
        chains: list[tuple[int, ...]] = []
        layer: list[tuple[int, ...]] = [()]
        while layer and len(layer[0]) // self.b.block_size < self.b.pages:
            nxt = []
            for t in layer:
                for c in self.contents:
                    if self.hashes(t + c)[-1] in index:
                        nxt.append(t + c)
            chains += nxt
            layer = nxt
        return chains

    # ------------------------------------------------------------ the alphabet
    def _e(self, key: Hashable, make: Callable[..., _T], *args: Any) -> _T:
        """``make(*args)``, made once per ``key``: the one Edge object of a call and its model
        update (its ``then`` takes the state's generator model) is shared by every state that
        offers it, so its memo ident is computed once."""
        found = self._edge_objects.get(key)
        if found is None:
            found = self._edge_objects[key] = make(*args)
        return found

    def _fixed(self) -> tuple[list[Edge], list[Edge], list[Edge]]:
        """The edges every state offers: queries and reclamations; admissions without a lookup
        (when a holder may be added); the state-free rejected inputs."""
        b = self.b
        n, size = b.pages, b.block_size
        head: list[Edge] = []
        if b.queries:
            head.append(Edge("get_num_free_blocks", (), readonly=True))
            head.append(Edge("get_total_usable_blocks", (), readonly=True))
            head += [Edge("can_allocate", (k,), readonly=True) for k in range(n + 2)]
        head += [Edge("try_free_blocks", (k,)) for k in range(n + 2)]
        admissions = [  # admit a request without prefix lookup (some tokens remote-computed)
            Edge("allocate_slots", (length - computed, computed), self._admit(None, length, ()))
            for length in range(1, b.tokens + 1)
            for computed in range(length)
        ]
        bad = [
            rejected("free_blocks", ([n],)),
            rejected("free_blocks", ([-1],)),
            rejected("allocate_slots", (-1, 0)),
            rejected("allocate_slots", (1, -1)),
            rejected("try_free_blocks", (-1,)),
            rejected("can_allocate", (-1,)),
            rejected("publish_computed_blocks", ([n], [b"\x01" * 16], 0, size)),
        ]
        return head, admissions, bad

    def edges(self, snap: Any, gen: tuple[Holder, ...], spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        n, size = b.pages, b.block_size
        e = self._e
        head, admissions, bad = self._fixed_edges
        out: list[Edge] = list(head)
        add = out.append
        room = len(gen) < b.tables
        distinct = sorted(set(gen))
        if room:
            out += admissions
        index = {h for h, _ in snap.hash_to_block_ids}
        for chain in self.indexed_chains(index) if index else ():
            hashes = self.hashes(chain)
            for cap in (len(hashes) * size - 1, len(hashes) * size):  # the P-1 cap, and none
                pages = cap // size
                if pages == 0:
                    add(e(("lookup", cap, chain), self._lookup, hashes, cap, None))
                elif room:
                    add(e(("pin", cap, chain), self._lookup, hashes, cap, self._pin(chain)))
        miss = next((c for c in self.contents if self.hashes(c)[0] not in index), None)
        if miss is not None:
            add(e(("miss", miss), self._lookup, self.hashes(miss), size, None))
        for h in distinct:  # the scheduler's admission: allocate behind a pinned prefix
            if h[0] == PIN:
                out += e(("pinned", h), self._pinned_edges, h)
        for h in distinct:
            if h[0] == REQUEST:
                out += e(("request", h), self._request_edges, h)
        for h in distinct:
            add(e(("free", h), Edge, "free_blocks", (list(h[1]),), self._release(h)))
        if b.bad_inputs:
            for page in range(n):
                if snap.ref_counts[page] == 0:  # double release
                    add(e(("double", page), rejected, "free_blocks", ([page],)))
            out += bad
            if snap.free_block_ids:  # publishing a page nobody holds
                free_page = snap.free_block_ids[0]
                args = ([free_page], [b"\x01" * 16], 0, size)
                add(e(("unheld", free_page), rejected, "publish_computed_blocks", args))
        return out

    def _lookup(self, hashes: tuple[bytes, ...], cap: int, then: Then | None) -> Edge:
        """A prefix lookup: it pins pages (``then``) or none (read-only)."""
        return Edge("get_computed_blocks", (list(hashes), cap), then, readonly=then is None)

    def _pinned_edges(self, h: Holder) -> list[Edge]:
        b = self.b
        table, hit = list(h[1]), len(h[1]) * b.block_size
        out = [
            Edge(
                "allocate_slots", (length - computed, computed, table), self._admit(h, length, h[3])
            )
            for length in range(hit + 1, b.tokens + 1)
            for computed in range(hit, length)
        ]
        if b.bad_inputs:
            out.append(rejected("allocate_slots", (1, hit - 1, table)))
        return out

    def _request_edges(self, h: Holder) -> list[Edge]:
        b = self.b
        size, n = b.block_size, b.pages
        _, table_t, length, chain = h
        table = list(table_t)
        indexed = len(chain) // size
        end = min(length // size, len(table))
        out: list[Edge] = []
        add = out.append
        for stop in range(indexed + 1, end + 1):  # publish every choice of page contents
            for combo in itertools.product(self.contents, repeat=stop - indexed):
                tokens = chain + tuple(itertools.chain.from_iterable(combo))
                add(
                    Edge(
                        "publish_computed_blocks",
                        (table, list(self.hashes(tokens)), indexed, stop * size),
                        self._replace(h, (REQUEST, table_t, length, tokens)),
                    )
                )
        decodable = len(table) == -(-length // size)
        if decodable and length < b.tokens:
            add(Edge("append_slot", (table, length + 1), self._decode(h)))
        if decodable:
            for drafts in range(1, b.tokens - length + 1):
                add(Edge("append_slots", (table, length + 1, drafts), self._drafts(h)))
        for keep in range(1, len(table) * size + 1):
            add(Edge("truncate_blocks", (table, keep), self._truncate(h, keep)))
        if b.queries:
            add(Edge("update_blocks_slot", (table, 0, length), readonly=True))
            if length > 1:
                add(Edge("update_blocks_slot", (table, length - 1, length), readonly=True))
        if b.bad_inputs:
            capacity = len(table) * size
            if indexed > 0:  # re-publishing from block 0
                add(
                    rejected(
                        "publish_computed_blocks",
                        (table, list(self.hashes(chain)), 0, indexed * size),
                    )
                )
            add(rejected("truncate_blocks", (table, 0)))
            add(rejected("truncate_blocks", (table, capacity + 1)))
            add(rejected("truncate_blocks", ([*table, table[-1]], capacity)))
            add(rejected("truncate_blocks", ([*table, n], capacity)))
            add(rejected("append_slot", (table, 0)))
            add(rejected("append_slots", (table, 1, -1)))
            start = length + 1 + size
            if (start + size - 2) // size != len(table):
                add(rejected("append_slots", (table, start, 1)))
            add(rejected("update_blocks_slot", (table, 0, capacity + 1)))
            add(
                rejected(
                    "publish_computed_blocks",
                    ([table[-1], table[-1]], [b"\x01" * 16, b"\x02" * 16], 0, 2 * size),
                )
            )
        return out

    # ------------------------------------------------------------ model updates
    # Each takes the generator model of the state the call was made from, so one Edge object
    # serves every state that offers the call.
    def _admit(self, pin: Holder | None, length: int, chain: tuple[int, ...]) -> Then:
        def then(gen: tuple[Holder, ...], returned: Any) -> Any:
            if returned is None:  # no pages: a pin stays pinned (released later by free_blocks)
                return gen
            return _with(gen, pin, (REQUEST, tuple(returned[0]), length, chain))

        return then

    def _pin(self, chain: tuple[int, ...]) -> Then:
        size = self.b.block_size

        def then(gen: tuple[Holder, ...], returned: Any) -> Any:
            table = tuple(returned[0])
            if not table:
                return gen
            return _with(gen, None, (PIN, table, len(table) * size, chain[: len(table) * size]))

        return then

    def _replace(self, old: Holder, new: Holder) -> Then:
        return lambda gen, returned: _with(gen, old, new)

    def _release(self, old: Holder) -> Then:
        return lambda gen, returned: _with(gen, old, None)

    def _decode(self, h: Holder) -> Then:
        return lambda gen, returned: _with(gen, h, (REQUEST, tuple(returned[0]), h[2] + 1, h[3]))

    def _drafts(self, h: Holder) -> Then:
        return lambda gen, returned: _with(gen, h, (REQUEST, tuple(returned[0]), h[2], h[3]))

    def _truncate(self, h: Holder, keep: int) -> Then:
        size = self.b.block_size

        def then(gen: tuple[Holder, ...], returned: Any) -> Any:
            table = tuple(returned)
            chain = h[3][: min(len(h[3]) // size, len(table)) * size]
            return _with(gen, h, (REQUEST, table, keep, chain))

        return then

    def clone(self, obj: Any) -> Any:
        fast = self._fast.get(type(obj))
        if fast is None:
            fast = self._fast[type(obj)] = _block_manager_cloner(type(obj))
        if fast is not False and obj.__dict__.keys() <= _BM_ATTRIBUTES:
            return fast(obj)
        return clone(obj)

    def pack(self, spec: Any, target: Any, gen: Any) -> bytes:
        """kvspec's own block managers as plain values (three times faster than the generic
        pickle of their objects); anything else the generic way."""
        classes = (self.spec_cls, self.target_cls)
        packed = [
            _pack_manager(x, kind) if type(x) is classes[kind] else None
            for kind, x in enumerate((spec, target))
        ]
        if packed[0] is None or packed[1] is None:
            return b"G" + super().pack(spec, target, gen)
        return b"F" + pickle.dumps((*packed, gen), pickle.HIGHEST_PROTOCOL)

    def unpack(self, data: bytes) -> tuple[Any, Any, Any]:
        if data[:1] == b"G":
            return super().unpack(data[1:])
        classes: tuple[type, type] = (self.spec_cls, self.target_cls)  # type: ignore[assignment]
        spec, target, gen = pickle.loads(data[1:])
        return _unpack_manager(spec, classes), _unpack_manager(target, classes), gen

    def pair_key(self, snap: Any, spec: Any, target: Any) -> Hashable:
        # the snapshot (both sides equal it by now), then what it leaves out on either side
        return (hash(snap), self._whole(spec), self._whole(target))

    def pair_key_hashed(self, snap_hash: int, spec: Any, target: Any) -> Hashable:
        """:meth:`pair_key` from ``hash(snap)`` (the engine has it already)."""
        return (snap_hash, self._whole(spec), self._whole(target))

    def _whole(self, obj: Any) -> Hashable:
        """What a snapshot leaves out of a block manager: the sets' tables (future eviction order
        and pinned copies) and the hidden counter — for kvspec's own classes and their
        method-only subclasses, which never iterate the prefix index (its dict order is not
        state). Any other object (an engine's own class): its set tables only, as before the
        memo — and the memo and lazy cloning are switched off, since the key no longer covers
        its whole state."""
        t = type(obj)
        fast = self._fast.get(t)
        if fast is None:
            fast = self._fast[t] = _block_manager_cloner(t)
        state = obj.__dict__
        if fast is False or not state.keys() <= _BM_ATTRIBUTES:
            self.memo = False
            return ("tables", _bm_tables(obj))
        index = state["hash_to_block_ids"]
        used = state["used_block_ids"]
        classes = self._classes
        if classes is not None and t in self._classed:  # (their sets are sets)
            get = classes.get
            key = set_layout(used)
            used_key = get(key, key)
            if not index:
                return (t, used_key, (), state.get("num_referenced"))
            if len(index) == 1:
                for ids in index.values():
                    key = set_layout(ids)
                    return (t, used_key, (get(key, key),), state.get("num_referenced"))
            return (
                t,
                used_key,
                tuple([get(k, k) for k in map(set_layout, map(index.get, sorted(index)))]),
                state.get("num_referenced"),
            )
        # (the tables of _bm_tables, read without its generality: kvspec's classes hold sets)
        return (
            t,
            set_layout(used) if type(used) is set else tuple(used),
            tuple([_table(index[h]) for h in sorted(index)]) if index else (),
            state.get("num_referenced"),
        )

    def reductions(self) -> dict[str, bool]:
        return {"layout_classes": self._classes is not None}

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        # the sets' tables decide future eviction order and pinned copies; the target's too (a
        # target whose tables differ from the spec's is explored separately: sound, not wasteful
        # for a correct target, whose tables are the spec's)
        return (snap, gen, _bm_tables(spec), _bm_tables(target))

    # ------------------------------------------------------------ ledger checks
    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        # The target's hidden usable counter, on every edge (the spec state may have been seen
        # before, with another target). The ledger half of the invariant depends on the state
        # only: it is checked once per state, in state_checks, under the same name.
        usable = target.get_total_usable_blocks()
        if snap is not self._usable[0]:  # one snapshot is checked against many calls in a row
            self._usable = (snap, snap.num_blocks - sum(1 for r in snap.ref_counts if r > 0))
        if usable != self._usable[1]:
            problem = inv.referenced_count_matches_live_pages(snap, usable)
            return "referenced_count_matches_live_pages", str(problem)
        return None

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
        # a function of (snapshot, holders) alone: states that differ only in set tables (about
        # seven per observable state at the default scope) are checked once
        key = (snap, gen)
        if key in self._held:
            return None
        problem = self._state_problem(snap, gen)
        if problem is None:
            if len(self._held) > 1_000_000:
                self._held.clear()
            self._held.add(key)
        return problem

    def _state_problem(self, snap: Any, gen: Any) -> Check | None:
        tables = [h[1] for h in gen]
        usable = snap.num_blocks - sum(1 for r in snap.ref_counts if r > 0)
        problem = inv.referenced_count_matches_live_pages(snap, usable, tables)
        if problem:
            return "referenced_count_matches_live_pages", problem
        problem = inv.no_live_eviction(snap, tables)
        if problem:
            return "no_live_eviction", problem
        if not gen:
            problem = inv.no_leak_at_quiescence(snap)
            if problem:
                return "no_leak_at_quiescence", problem
        return None
