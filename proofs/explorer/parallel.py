"""``--workers N``: the breadth-first search on N processes, layer by layer.

Every state has an owner, its pair's fingerprint modulo N (so all states of one spec/target pair
meet in one worker's transition memo); each worker keeps the visited fingerprints and
the frontier of the states it owns and expands them with its own :class:`~.engine.Expander`. A
successor owned by another worker is sent to it as its objects — exact copies, every set with
its hash table (:meth:`Model.pack`, :func:`~.set_clone.exact_dumps`; workers are forks of one
process, so element hashes and the addresses of small ints and interned strings agree: a set's
table holds its elements' addresses, which the pair key compares; a set whose elements hash by
identity cannot be rebuilt elsewhere, :class:`~.set_clone.NotPortable`) — together with its *path*
(edge indices from the initial state). A layer's successors are first *offered* (by fingerprint
alone); each owner asks for the ones it has not seen, and only those are sent (packing a
state its owner already has would be wasted, and may cost a call to rebuild the successor's
objects). The owner fingerprints what it unpacked; a state that
cannot be packed (an object ``pickle`` cannot write) or does not fingerprint as sent is rebuilt
by replaying its path on fresh objects instead, which is exact by construction but costs one
call per step of the path (``replayed_paths`` in the result). Layers are synchronous:
every state of depth d is expanded (by whichever worker) before any of depth d+1, so a
counterexample is still a shortest one; several found in one layer resolve to the least path.

The processes sit behind :class:`Backend` (start, send, receive, close): :class:`ProcessBackend`
forks local workers; a cluster backend implements the same four calls (``kvspec explore --address``:
Ray actors, in kvspec/distributed.py).

Fingerprints are ``hash()`` values, and those only mean the same in forked copies of one process:
on CPython 3.11 ``hash(None)`` is an address, and the set tables in a pair key hold element
addresses. A backend whose workers are other interpreters says ``portable = True``; its workers
then route a state by a digest of its pair's route (:meth:`Model.route`: the snapshot as the
pair key holds it) that every interpreter computes alike (:func:`stable_digest`), and an owner
fingerprints every state it is sent itself instead of trusting the sender's number. States
still cross as exact copies where the model packs them: every set is rebuilt with the sender's
table only where each element hashes here as it did there (``NotPortable`` otherwise: Ray
workers share one ``PYTHONHASHSEED``, so strings and bytes do), and the owner checks the route's
digest against the sender's (the whole fingerprint cannot be compared across interpreters); a
state that fails either is replayed from its path. Ownership stays by pair, so a pair's states
still share one memo; the cost over forked workers is that every offered state is sent (an
owner cannot tell from a foreign fingerprint that it has one) and a digest per new pair.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from proofs.explorer import engine
from proofs.explorer.engine import Expander, peak_mb, rss_mb
from proofs.explorer.set_clone import NotPortable, exact_ready
from stateful_tests.lockstep import Check, invoke

Path = tuple[int, ...]


class Backend(Protocol):
    """Where the workers run: one message channel per worker. A backend whose workers are not
    forked from this process also sets ``portable = True`` (read with a default of ``False``)."""

    def start(self, n: int, worker: Callable[[Any, int, int], None]) -> None: ...
    def send(self, i: int, message: Any) -> None: ...
    def receive(self, i: int) -> Any: ...
    def close(self) -> None: ...


class ProcessBackend:
    """Forked local processes and pipes (the model is inherited by the fork, never pickled)."""

    def __init__(self) -> None:
        self.pipes: list[Any] = []
        self.procs: list[Any] = []

    def start(self, n: int, worker: Callable[[Any, int, int], None]) -> None:
        ctx = multiprocessing.get_context("fork")
        for i in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(theirs, i, n), daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)

    def send(self, i: int, message: Any) -> None:
        self.pipes[i].send(message)

    def receive(self, i: int) -> Any:
        return self.pipes[i].recv()

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a worker that died has no pipe to stop
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


def replay(exp: Expander, path: Path) -> tuple[Any, Any, Any, Any]:
    """(spec, target, snapshot, gen) after the calls of ``path`` from the initial state, on fresh
    objects (the calls passed every check when they were first made)."""
    model = exp.model
    spec, target, gen = model.initial()
    for index in path:
        snap = model.reader(spec)
        edge = exp._edges(snap, gen, spec)[index]
        s_out = invoke(spec, edge.method, edge.args)
        invoke(target, edge.method, edge.args)
        if s_out.raised is None and edge.then is not None:
            gen = edge.then(gen, s_out.returned)
    return spec, target, model.reader(spec), gen


def stable_digest(value: Any) -> int:
    """A 64-bit digest of ``value`` that is the same in every interpreter (no ``hash()``, no
    addresses): snapshots are tuples, named tuples and dataclasses of ints, strings, bytes,
    enums and ``None``; sets are digested in the order of their elements' digests."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h.update, value)
    return int.from_bytes(h.digest(), "little")


def _feed(put: Callable[[bytes], Any], v: Any) -> None:
    t = type(v)
    if v is None or t is bool or t is int or t is float:
        put(f"{t.__name__}:{v!r};".encode())
    elif t is str or t is bytes:
        raw = v.encode("utf-8", "surrogatepass") if t is str else v
        put(b"s" if t is str else b"b")
        put(len(raw).to_bytes(8, "little") + raw)
    elif isinstance(v, enum.Enum):
        put(f"{t.__qualname__}.{v.name};".encode())
    elif isinstance(v, tuple | list):
        put(f"({t.__qualname__} {len(v)}".encode())
        for x in v:
            _feed(put, x)
        put(b")")
    elif isinstance(v, set | frozenset):
        put(f"{{{len(v)}".encode())
        for d in sorted(stable_digest(x) for x in v):
            put(d.to_bytes(8, "little"))
        put(b"}")
    elif isinstance(v, dict):
        put(f"[{len(v)}".encode())
        for k, x in v.items():
            _feed(put, k)
            _feed(put, x)
        put(b"]")
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        put(f"<{t.__qualname__}".encode())
        for f in dataclasses.fields(v):
            _feed(put, getattr(v, f.name))
        put(b">")
    else:  # anything else by its text (a repr with an address would over-distinguish: sound)
        put(f"?{t.__qualname__}:{v!r};".encode())


class _PortableExpander(Expander):
    """An expander that also keeps, per pair, the stable digest of its route (the pair's owner in
    a portable search). :meth:`Model.route` is a function of the pair key, so equal pairs get
    equal owners everywhere (the raw snapshot is not: the scheduler's key cuts a forgotten
    request's final row, and one of its pairs reached with two final rows went to two owners)."""

    def __init__(self, model: Any, *, well_formed: bool, memo: bool) -> None:
        super().__init__(model, well_formed=well_formed, memo=memo)
        self.routes: list[int] = []

    def pair(self, spec: Any, target: Any, snap: Any, snap_hash: int | None = None) -> int:
        pid = super().pair(spec, target, snap, snap_hash)
        if pid == len(self.routes):
            self.routes.append(stable_digest(self.model.route(snap, spec, target)))
        return pid


class _Worker:
    """One worker's share: its visited fingerprints, its frontier, its expander."""

    def __init__(self, exp: Expander, wid: int, n: int, portable: bool = False) -> None:
        self.exp, self.wid, self.n = exp, wid, n
        self.portable = portable
        # the owner of a pair: by its fingerprint, or (portable) by its snapshot's digest
        self.routes = exp.routes if isinstance(exp, _PortableExpander) else exp.pair_fps
        self.seen: set[int] = set()
        self.observed: set[int] = set()
        self.frontier: list[tuple[Path, int, int]] = []
        self.nxt: list[tuple[Path, int, int]] = []
        self.sent: set[int] = set()  # fingerprints already sent to their owner
        self.kept: set[int] = set()  # pairs of the next frontier (they keep their objects)
        # this layer's successors offered to their owners: fingerprint -> its path and what
        # packs it (``None``: sent as its path only)
        self.offers: dict[int, tuple[Path, tuple[int, int, int, int, int, Any] | None]] = {}
        # states cross as exact copies of their objects (every set by its table, each element's
        # hash checked on arrival: NotPortable where it differs); between forked workers the
        # owner checks the whole fingerprint, in a portable search the route's stable digest
        # (hash values and addresses differ between interpreters), and replays the path where
        # either differs
        self.exact = exact_ready()
        self.transferred = self.replayed = 0
        self.expanded = 0  # frontier states expanded in the last layer (set by expand)
        # this worker's own clocks (the floor and the parallel efficiency)
        self.cpu0, self.calls0 = time.process_time(), engine.CALL_CLOCK[0]

    def accept(
        self, fp: int, path: Path, pid: int, gid: int, objects: tuple[Any, Any, Any]
    ) -> Check | None:
        """A new owned state (gen id ``gid``): its checks, then into the next frontier."""
        spec, target, snap = objects
        gen = self.exp.gens[gid]
        problem: Check | None = self.exp.model.state_checks(snap, gen, spec, target)
        if problem is None:
            self.exp.keep(pid, objects)
            self.seen.add(fp)
            seen = self.exp.model.observable(snap, gen)
            self.observed.add(stable_digest(seen) if self.portable else hash(seen))
            self.nxt.append((path, pid, gid))
            self.kept.add(pid)
        return problem

    def expand(self, deadline: float | None, memory: float | None = None) -> tuple[Any, ...]:
        """This worker's frontier, or the part of it before ``deadline`` or before it holds more
        than ``memory`` MB resident."""
        exp, n, wid = self.exp, self.n, self.wid
        self.expanded = len(self.frontier)  # (cut below where a stop ends the layer)
        outgoing: list[list[int]] = [[] for _ in range(n)]  # offers by fingerprint, per owner
        offers = self.offers = {}
        fps, routes = exp.pair_fps, self.routes
        ghash = exp.gen_hash
        # as in the serial loop: the last frontier state of a pair that no next-layer state
        # shares may use the pair's objects themselves for its last call (no copies)
        left = Counter(pid for _, pid, _ in self.frontier)
        kept = self.kept = set()
        for done, (path, pid, gid) in enumerate(self.frontier):
            if deadline is not None and time.perf_counter() > deadline:
                self.expanded = done
                return ("deadline", outgoing, len(self.frontier) - done)
            if memory is not None and not done & 255 and rss_mb() > memory:
                self.expanded = done
                return ("max_memory", outgoing, len(self.frontier) - done)
            left[pid] -= 1
            successors, found = exp.expand(pid, gid, not left[pid] and pid not in kept)
            if found is not None:
                return ("found", (*path, *found[0]), found[1])
            for index, succ, g, objects in successors:
                fp = hash((fps[succ], ghash[g]))
                owner = routes[succ] % n  # by pair: every state of a pair meets that pair's memo
                if owner != wid:
                    if fp not in self.sent:
                        self.sent.add(fp)
                        outgoing[owner].append(fp)  # sent only if its owner asks for it
                        pack = (pid, gid, index, succ, g, objects) if self.exact else None
                        offers[fp] = ((*path, index), pack)
                    continue
                if fp in self.seen:
                    continue
                objects = objects or exp.objects.get(succ) or exp.materialize(pid, gid, index)
                problem = self.accept(fp, (*path, index), succ, g, objects)
                if problem is not None:
                    return ("found", (*path, index), problem)
        return ("layer", outgoing, 0)

    def wanted(self, fps: list[int]) -> list[int]:
        """The offered states this owner has not seen (each once): the ones to send."""
        if self.portable:  # (a sender's fingerprint means nothing here: every one is wanted)
            return fps
        seen = self.seen
        return [fp for fp in fps if fp not in seen]

    def pack_offered(self, fps: list[int]) -> list[Any]:
        """(fingerprint, path, packed objects or ``None``, the route's stable digest in a
        portable search) of the offered states ``fps``."""
        offers, self.offers = self.offers, {}
        out = []
        routes = self.routes if self.portable else None
        for fp in fps:
            path, offer = offers[fp]
            packed = None if offer is None else self.pack(*offer)
            route = None if routes is None or offer is None else routes[offer[3]]
            out.append((fp, path, packed, route))
        return out

    def pack(self, pid: int, gid: int, index: int, succ: int, g: int, objects: Any) -> bytes | None:
        """A successor sent to its owner as its objects (exact copies, set tables included:
        :meth:`Model.pack`), or ``None`` where only its path can go (objects ``pickle``
        cannot write): the owner then replays the path."""
        if not self.exact:
            return None
        exp = self.exp
        objects = objects or exp.objects.get(succ) or exp.materialize(pid, gid, index)
        try:
            packed: bytes = exp.model.pack(objects[0], objects[1], exp.gens[g])
            return packed
        except Exception:  # an object pickle cannot write (a lock, a thread): paths from now on
            self.exact = False
            return None

    def ingest(self, items: list[tuple[int, Path, bytes | None, int | None]]) -> tuple[Any, ...]:
        exp = self.exp
        for fp, path, packed, route in items:
            if fp in self.seen and not self.portable:
                continue
            pid = -1
            unpacked = None
            if packed is not None:
                with contextlib.suppress(NotPortable):  # (a set of objects hashed by
                    unpacked = exp.model.unpack(packed)  # identity: replayed)
            if unpacked is not None:
                spec, target, gen = unpacked
                snap = exp.model.reader(spec)
                pid, gid = exp.pair(spec, target, snap), exp.gid(gen)
                if (
                    (self.routes[pid] == route)
                    if self.portable
                    else exp.fingerprint(pid, gid) == fp
                ):
                    self.transferred += 1
                else:  # not the state sent (a key that holds addresses of other objects than
                    pid = -1  # small ints and shared ones): rebuilt from its path
            if pid < 0:
                spec, target, snap, gen = replay(exp, path)
                self.replayed += 1
                pid = exp.pair(spec, target, snap)
            gid = exp.gid(gen)
            if self.portable:  # the sender's number means nothing here: this process's own
                fp = self.exp.fingerprint(pid, gid)
                if fp in self.seen:
                    continue
            problem = self.accept(fp, path, pid, gid, (spec, target, snap))
            if problem is not None:
                return ("found", path, problem)
        self.frontier, self.nxt = self.nxt, []
        self.exp.retain({pid for _, pid, _ in self.frontier})
        exp = self.exp
        rss = peak_mb()
        return (
            "ok",
            len(self.seen),
            len(self.frontier),
            exp.edges,
            exp.executed,
            exp.dropped,
            rss,
            self.transferred,
            self.replayed,
            sorted(exp.methods),
            self.expanded,
            time.process_time() - self.cpu0,
            engine.CALL_CLOCK[0] - self.calls0,
        )


def explore_layers(
    exp: Expander,
    result: Any,
    start: tuple[int, Any],
    workers: int,
    limits: Any,
    progress: Callable[[int, int, int], None] | None,
    backend: Backend | None = None,
) -> tuple[tuple[list[int], Check] | None, str | None, int]:
    """The layer-synchronous search on ``workers`` processes; the same contract as the serial
    loop (counterexample, stop reason, states left unexpanded). ``max_states`` is checked at
    layer boundaries and per worker share (the count may pass it by less than one layer); the
    memory bound is split evenly between the workers and the coordinator."""
    depth, max_states, deadline = limits.depth, limits.max_states, limits.deadline
    memory = limits.memory_share(workers + 1)
    share = None if max_states is None else -(-max_states // workers)
    model, well_formed, memo = exp.model, exp.well_formed, exp.use_memo  # what a worker needs
    pool = backend or ProcessBackend()
    portable = bool(getattr(pool, "portable", False))

    def work(conn: Any, wid: int, n: int) -> None:
        kind = _PortableExpander if portable else Expander
        me = _Worker(kind(model, well_formed=well_formed, memo=memo), wid, n, portable)
        spec, target, snap, gen = replay(me.exp, ())  # fingerprinted with this worker's hash
        pid = me.exp.pair(spec, target, snap)
        if me.routes[pid] % n == wid:
            gid = me.exp.gid(gen)
            me.accept(me.exp.fingerprint(pid, gid), (), pid, gid, (spec, target, snap))
            me.frontier, me.nxt = me.nxt, []
        while True:
            message = conn.recv()
            if message[0] == "expand":
                if share is not None and len(me.seen) >= share:
                    me.expanded = 0  # (this layer: nothing)
                    conn.send(("full", [[] for _ in range(n)], len(me.frontier)))
                else:
                    conn.send(me.expand(message[1], memory))
            elif message[0] == "wanted":
                conn.send(me.wanted(message[1]))
            elif message[0] == "pack":
                conn.send(me.pack_offered(message[1]))
            elif message[0] == "ingest":
                conn.send(me.ingest(message[1]))
            elif message[0] == "observed":
                conn.send(me.observed)
            else:
                return

    pool.start(workers, work)
    layer = 0
    totals = (1, 1)  # (states, frontier)
    result.states_per_depth = [1]
    result.expanded_per_depth = []
    stop: str | None = None
    left = 0
    found: tuple[list[int], Check] | None = None
    worker_calls = 0.0
    try:
        while True:
            if depth is not None and layer >= depth:
                stop, left = "depth", totals[1]
                break
            for i in range(workers):
                pool.send(i, ("expand", deadline))
            replies = [pool.receive(i) for i in range(workers)]
            founds = [(list(r[1]), r[2]) for r in replies if r[0] == "found"]
            if founds:
                found = min(founds, key=lambda f: (len(f[0]), f[0]))
                break
            # Offers first (fingerprints), each once: an owner asks for the states it has
            # not seen, and only those are packed by their senders (most offers are states their
            # owner reached before, and packing one may cost a call: Expander.materialize).
            offered: list[list[int]] = [[] for _ in range(workers)]
            sender: dict[int, int] = {}
            owners: dict[int, int] = {}
            for j, r in enumerate(replies):
                for i, fps in enumerate(r[1]):
                    for fp in fps:
                        if fp not in sender:
                            sender[fp], owners[fp] = j, i
                            offered[i].append(fp)
            for i in range(workers):
                pool.send(i, ("wanted", offered[i]))
            asked: list[list[int]] = [[] for _ in range(workers)]
            for i in range(workers):
                for fp in pool.receive(i):
                    asked[sender[fp]].append(fp)
            for j in range(workers):
                pool.send(j, ("pack", asked[j]))
            incoming: list[list[tuple[int, Path, bytes | None, int | None]]] = [
                [] for _ in range(workers)
            ]
            for j in range(workers):
                for item in pool.receive(j):
                    incoming[owners[item[0]]].append(item)
            for i in range(workers):
                pool.send(i, ("ingest", incoming[i]))
            oks = [pool.receive(i) for i in range(workers)]
            founds = [(list(r[1]), r[2]) for r in oks if r[0] == "found"]
            if founds:
                found = min(founds, key=lambda f: (len(f[0]), f[0]))
                break
            before, totals = totals[0], (sum(r[1] for r in oks), sum(r[2] for r in oks))
            if totals[0] > before:
                result.states_per_depth.append(totals[0] - before)
            result.edges = sum(r[3] for r in oks)
            result.executed_calls = sum(r[4] for r in oks)
            result.dropped_edges = sum(r[5] for r in oks)
            result.peak_memory_mb = sum(r[6] for r in oks) + peak_mb()
            result.transferred_states = sum(r[7] for r in oks)
            result.replayed_paths = sum(r[8] for r in oks)
            result.operations = sorted({m for r in oks for m in r[9]})
            result.distinct_states = totals[0]
            result.expanded_per_depth.append(sum(r[10] for r in oks))
            result.worker_cpu_seconds = [r[11] for r in oks]
            worker_calls = sum(r[12] for r in oks)
            if totals[1]:
                result.max_depth = layer + 1
            layer += 1
            if progress is not None:
                progress(totals[0], result.edges, layer)
            cut = [r[0] for r in replies if r[0] in ("deadline", "max_memory")]
            if cut:
                stop, left = cut[0], totals[1] + sum(r[2] for r in replies)
                break
            if any(r[0] == "full" for r in replies) or (
                max_states is not None and totals[0] >= max_states
            ):
                stop, left = "max_states", totals[1]
                break
            if not totals[1]:
                break
        observed: set[int] = set()
        for i in range(workers):
            pool.send(i, ("observed",))
            observed |= pool.receive(i)
        result.distinct_snapshots = len(observed)
    finally:
        pool.close()
    result.cpu_seconds += sum(result.worker_cpu_seconds)
    result.call_seconds += worker_calls
    return found, stop, left
