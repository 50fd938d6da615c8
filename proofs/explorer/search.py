"""The search engine: breadth-first search over every call sequence, spec and target in lockstep.

From the spec's initial state, every :class:`Edge` of a :class:`Model`'s alphabet is applied to a
copy of every reached state — and, in lockstep, to a copy of the paired *target* object. Every
edge is judged by :mod:`stateful_tests.lockstep`'s own comparisons (return value, exception kind,
in-place mutation of list arguments, snapshot, ``atomic_failure``) and every reached state is
checked against every invariant, under the names of ``spec/invariants.py``.

* **States** are deduplicated by a canonical key (:meth:`Model.key`): the spec's snapshot, the
  generator-side model the alphabet depends on and the hash tables of the spec's sets
  (:mod:`proofs.explorer.set_clone`). The visited set stores 64-bit fingerprints of the keys, as
  TLC does; objects are kept only for the frontier.
* **The target is paired with the spec state** through which it was first reached. Its hidden
  state (counters) is checked on *every* edge (:meth:`Model.edge_checks`), not only on new
  states. Read-only calls (queries, rejected bad inputs) share one copy of each side per state; a
  failure or a spec change on a shared copy is re-decided on a fresh one.
* **Counterexamples are shortest**: BFS checks every edge of depth d before any of depth d+1. The
  path is rebuilt from parent pointers (:func:`rebuild`), replayed by the component's own
  checker, printed as a numbered step table and saved as a ``kvspec-trace/1`` document that
  ``kvspec replay`` re-runs.
* **Bounds**: ``max_states`` the states, ``max_memory_mb`` the resident memory (checked as
  the search goes, every process), ``depth`` the path length and a deadline the time; any of
  them stopping the search makes the result ``complete: false`` and says which, and how far each
  depth got (``expanded_per_depth`` against ``states_per_depth``).
* **The floor**: the seconds spent inside the spec's and the target's own methods are measured
  (``call_seconds``) against the CPU seconds of the whole search: what the explorer adds on top
  of running both sides is ``floor["rest_over_calls"]``.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from proofs.explorer import engine
from proofs.explorer.engine import Expander, _freeze, _state_invariants, peak_mb, rss_mb
from proofs.explorer.set_clone import clone, cloner_ready, exact_dumps, exact_loads
from stateful_tests.checker import SPEC
from stateful_tests.lockstep import (
    Check,
    Divergence,
    Outcome,
    Step,
    compare_snapshots,
    invoke,
    save_trace,
    trace_document,
)


class Edge:
    """One call of the alphabet from one state.

    ``then(gen, returned)`` gives the generator model after a call the spec accepted from a state
    whose generator model is ``gen`` (``None``: the
    model is unchanged); a call the spec rejects never changes the model. ``readonly``: the spec
    cannot change (a query, or a bad input the spec rejects before any change); ``bad``: the spec
    must reject it — if it does not, the edge is compared but not followed.
    """

    __slots__ = ("_ident", "args", "bad", "lists", "method", "readonly", "then")

    def __init__(
        self,
        method: str,
        args: tuple[Any, ...],
        then: Callable[[Any, Any], Any] | None = None,
        *,
        readonly: bool = False,
        bad: bool = False,
    ) -> None:
        self.method = method
        self.args = args
        self.then = then
        self.readonly = readonly
        self.bad = bad
        self.lists = any(type(a) is list for a in args)  # each side gets private copies of them
        self._ident: int | None = None

    @property
    def ident(self) -> int:
        """The call as a small int (equal calls, equal ints): the transition memo's key."""
        found = self._ident
        if found is None:
            flat = (self.method, *[tuple(a) if type(a) is list else a for a in self.args])
            try:
                key: Hashable = (flat, hash(flat))
            except TypeError:  # nested lists (a scheduler step's plan)
                key = (self.method, _freeze(self.args))
            found = self._ident = _IDENTS.setdefault(key, len(_IDENTS))
        return found


_IDENTS: dict[Hashable, int] = {}  # every call seen, numbered (a process-wide, growing table)


def rejected(method: str, args: tuple[Any, ...]) -> Edge:
    """A bad input: the spec must reject it without any change."""
    return Edge(method, args, readonly=True, bad=True)


MAX_EVENTS = 2  # pending event rows beyond which only take_events may change a state


def with_take_events(edges: list[Edge], events: Sequence[Any] | None) -> list[Edge]:
    """``edges`` and ``take_events`` for a state whose component keeps ``events`` (``None``:
    events off, ``edges`` as they are). With ``MAX_EVENTS`` rows pending only the read-only edges
    stay, so the events are taken before anything else changes (a finite scope)."""
    if events is None:
        return edges
    kept = [e for e in edges if e.readonly] if len(events) >= MAX_EVENTS else edges
    return [*kept, Edge("take_events", ())]


def check_ranges(bounds: Any, ranges: tuple[tuple[str, int, int], ...]) -> None:
    """``ValueError`` naming the command-line option of the first bound of ``bounds`` outside its
    ``(name, lo, hi)`` range (inclusive)."""
    for name, lo, hi in ranges:
        value = getattr(bounds, name)
        if not lo <= value <= hi:
            raise ValueError(f"{name.replace('_', '-')} must be in [{lo}, {hi}], got {value}")


class Model:
    """A component's alphabet, checks and trace format (one subclass per component)."""

    checker: Any = None  # the component's CheckerDef: replays a counterexample
    # every method the alphabet can call (docs/targets.md): a report names those never reached
    operations: tuple[str, ...] = ()
    reader: Callable[[Any], Any]
    snapshot_checks: Mapping[str, str] = {}
    state_invariants: Mapping[str, Callable[[Any], str | None]] = {}
    # the transition memo (engine.py) is sound only when pair_key covers both objects' whole state
    memo: bool = False
    # edges() reads only (snap, gen), never the spec: the edge lists are cached per observable
    edges_from_snapshot: bool = False
    # the spec's outcome of every read-only edge is a function of its snapshot alone (its
    # read-only calls read no hidden state): the explorer asks the spec once per snapshot
    spec_readonly_by_snapshot: bool = False
    # pair_key() reads the snapshot only (no object): pairs are found by the snapshot's hash
    key_from_snapshot: bool = False
    # what the target is compared with (``--oracle`` / ``--baseline``; see use_reference)
    reference: Any = SPEC
    spec_cls: Callable[..., Any]

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: Any,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """``bounds``: the component's bounds dataclass (validated here); ``options``: the
        component's fixed checker options (e.g. the offload manager's cache policy)."""
        bounds.validate()
        self.component = component
        self.target_cls = target_cls
        self.target = target
        self.b = bounds
        self.options = dict(options or {})

    def bounds(self) -> dict[str, Any]:
        return asdict(self.b)

    def use_reference(self, reference: Any) -> None:
        """Drive ``reference`` (a :class:`stateful_tests.checker.Reference`) on the spec side: a
        baseline class, or (``invariants``) a second instance of the target. The search is the
        same: a state is still told apart by the model's key over both sides' snapshots, so a
        baseline whose future depends on state its snapshot leaves out is explored as the target
        is (the premise every target run already makes). What only the spec's contract promises
        is switched off: answering read-only calls from the snapshot."""
        self.reference = SPEC if reference is None else reference
        if self.reference.kind != "spec":
            self.spec_cls = self.reference.cls_for(self.spec_cls, self.target_cls)
            self.spec_readonly_by_snapshot = False

    @property
    def role(self) -> str:
        """The reference side's name in messages (spec, baseline, copy)."""
        return str(self.reference.role)

    # --- to override

    def initial(self) -> tuple[Any, Any, Any]:
        """(spec object, target object, generator model)."""
        raise NotImplementedError

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        """Every call from a state, simplest first (``spec()`` gives a scratch copy of the spec)."""
        raise NotImplementedError

    def reductions(self) -> dict[str, bool]:
        """The state-space reductions this model applies (each one a bound that turns it off)."""
        return {}

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        """The canonical state: everything the spec's future and the alphabet depend on."""
        return (snap, gen)

    def pair_key(self, snap: Any, spec: Any, target: Any) -> Hashable:
        """The spec object and its paired target as one value (the state is this and ``gen``);
        with ``memo`` it must determine every future call's outcome on both sides."""
        return self.key(snap, (), spec, target)

    def observable(self, snap: Any, gen: Any) -> Hashable:
        """The state without the spec's hidden layout (set tables): ``distinct_snapshots``."""
        return (snap, gen)

    def route(self, snap: Any, spec: Any, target: Any) -> Hashable:
        """What decides which worker of a portable ``--workers`` search (other interpreters: a
        pair's ``hash()`` fingerprint means nothing there) owns a pair: a plain value that is a
        function of the pair key, since two arrivals at one pair must meet one owner, its
        visited set and its memo. Default: the observable state without a generator model, a
        function of the pair key wherever the key holds the snapshot or a canonical form of it."""
        return self.observable(snap, ())

    def clone(self, obj: Any) -> Any:
        """An exact copy of one side (:func:`clone`; a model may know a faster exact way)."""
        return clone(obj)

    def pack(self, spec: Any, target: Any, gen: Any) -> bytes:
        """A state as bytes for another worker forked from this process (``--workers``): exact
        copies, set tables included (:func:`exact_dumps`). A model may know a faster exact way
        for its own classes; it must raise (as ``pickle`` does) where it cannot."""
        return exact_dumps((spec, target, gen))

    def unpack(self, data: bytes) -> tuple[Any, Any, Any]:
        """(spec, target, gen) from :meth:`pack`'s bytes."""
        spec, target, gen = exact_loads(data)
        return spec, target, gen

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return False

    def hidden(self, obj: Any) -> Hashable | None:
        """What the snapshot leaves out of one side's state, as a value (``None``: not known for
        this object). With it, a model without a whole-state pair key lets the copies a call left
        as they were (equal snapshots, equal hidden state) serve the next call."""
        return None

    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        """Checks of the target's hidden state, after every edge."""
        return None

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
        """Checks of a newly reached state that need the generator model (ledger invariants)."""
        return None

    def holders(self, gen: Any) -> list[list[int]] | None:
        """The live tables recorded in a trace step (block manager only)."""
        return None

    def trace_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def replay_options(self) -> dict[str, Any]:
        """The checker options a counterexample is replayed with."""
        return self.options

    def replay(self, document: dict[str, Any]) -> Any:
        """The component checker's replay of a trace (a RunResult), or ``None`` if there is none."""
        if self.checker is None:
            return None
        from stateful_tests import checker

        return checker.replay(
            self.component,
            self.checker,
            document,
            self.target_cls,
            self.target,
            options=self.replay_options(),
            reference=self.reference,
        )


@dataclass
class Violation:
    check: str
    detail: str
    depth: int  # calls in the counterexample
    steps: list[dict[str, Any]] = field(default_factory=list)
    trace_file: str | None = None
    replay: str = "not run"  # reproduced | diverged differently | passed | unavailable

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ExploreResult:
    component: str
    target: str
    bounds: dict[str, Any]
    distinct_states: int = 0
    distinct_snapshots: int = 0  # states up to the sets' hash tables (what a snapshot shows)
    edges: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    complete: bool = False
    # None (exhausted) | depth | max_states | max_memory | deadline | violation
    stopped_by: str | None = None
    message: str = ""
    violations: list[Violation] = field(default_factory=list)
    dropped_edges: int = 0  # bad inputs the spec accepted (compared, not followed)
    executed_calls: int = 0  # edges run on both sides (the others: remembered verdicts)
    peak_memory_mb: float = 0.0  # peak resident memory of the search's processes
    workers: int = 1
    # --workers: states sent to their owner as exact copies, and as paths the owner replayed
    # (a portable search, or objects pickle cannot write)
    transferred_states: int = 0
    replayed_paths: int = 0
    reductions: dict[str, bool] = field(default_factory=dict)
    # distinct states first reached at each depth (index 0: the initial state); sums to
    # distinct_states. What kvspec explore --plot draws.
    states_per_depth: list[int] = field(default_factory=list)
    # the operations (edge methods) offered by some expanded state, sorted
    operations: list[str] = field(default_factory=list)
    # states expanded at each depth (index 0: the initial state): equal to states_per_depth
    # up to the last depth reached, less at a depth a stop cut short
    expanded_per_depth: list[int] = field(default_factory=list)
    max_memory_mb: float | None = None  # the memory bound the search ran under
    # the floor: seconds inside the spec's and the target's own methods, and the CPU seconds of
    # every process of the search (workers and coordinator) in all
    call_seconds: float = 0.0
    cpu_seconds: float = 0.0
    worker_cpu_seconds: list[float] = field(default_factory=list)  # --workers: each worker's

    @property
    def floor(self) -> dict[str, float]:
        """The explorer's cost against the calls' own (see :func:`floor`)."""
        return floor(self.call_seconds, self.cpu_seconds)

    @property
    def parallel_efficiency(self) -> float | None:
        """``--workers``: the workers' CPU seconds over workers x wall seconds (1.0: every
        worker busy all the time; the layer barriers, transfers and the coordinator's share
        lower it). ``None`` for a search in one process."""
        if self.workers < 2 or not self.worker_cpu_seconds:
            return None
        return efficiency(sum(self.worker_cpu_seconds), self.workers * self.seconds)

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def states_per_second(self) -> float:
        return self.distinct_states / self.seconds if self.seconds > 0 else 0.0

    @property
    def edges_per_second(self) -> float:
        return self.edges / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "target": self.target,
            "bounds": self.bounds,
            "distinct_states": self.distinct_states,
            "distinct_snapshots": self.distinct_snapshots,
            "edges": self.edges,
            "max_depth": self.max_depth,
            "seconds": round(self.seconds, 3),
            "states_per_second": round(self.states_per_second),
            "edges_per_second": round(self.edges_per_second),
            "executed_calls": self.executed_calls,
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            "workers": self.workers,
            "transferred_states": self.transferred_states,
            "replayed_paths": self.replayed_paths,
            "reductions": self.reductions,
            "states_per_depth": self.states_per_depth,
            "expanded_per_depth": self.expanded_per_depth,
            "operations": self.operations,
            "floor": self.floor,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "worker_cpu_seconds": [round(c, 3) for c in self.worker_cpu_seconds],
            "parallel_efficiency": self.parallel_efficiency,
            "max_memory_mb": self.max_memory_mb,
            "complete": self.complete,
            "stopped_by": self.stopped_by,
            "message": self.message,
            "violations": [v.to_json() for v in self.violations],
        }


def floor(call_seconds: float, cpu_seconds: float) -> dict[str, float]:
    """``rest_over_calls``: the CPU seconds not spent inside a spec or target method per second
    that is (goal: at most 0.5)."""
    rest = max(cpu_seconds - call_seconds, 0.0)
    return {
        "call_seconds": round(call_seconds, 3),
        "rest_seconds": round(rest, 3),
        "rest_over_calls": round(rest / call_seconds, 2) if call_seconds else 0.0,
    }


def efficiency(worker_cpu_seconds: float, worker_wall_seconds: float) -> float | None:
    """Workers' CPU seconds over the wall seconds they were there for (workers x wall)."""
    return round(worker_cpu_seconds / worker_wall_seconds, 3) if worker_wall_seconds > 0 else None


Progress = Callable[[int, int, int], None]  # (distinct states, edges, depth)


def explore(
    model: Model,
    *,
    depth: int | None = None,
    max_states: int | None = 1_000_000,
    deadline: float | None = None,
    progress: Progress | None = None,
    save_dir: Path | None = None,
    inputs: str = "all",
    workers: int = 1,
    memo: bool = True,
    backend: Callable[[], Any] | None = None,
    max_memory_mb: float | None = None,
) -> ExploreResult:
    """Breadth-first search of ``model`` from its initial state (``inputs="well-formed"``: the
    bad-input edges are left out; ``workers``: processes sharing each layer, on a new
    ``backend()`` (a :class:`~proofs.explorer.parallel.Backend`; default: forked local
    processes); ``memo=False``: every edge is run, none is judged from a remembered transition).

    Stops at the first violation (the shortest counterexample; it is rebuilt, replayed with the
    component's checker and saved under ``save_dir`` if given), when the reachable states within
    the bounds are exhausted (``complete``), after ``depth`` layers, at ``max_states`` distinct
    states, when a process of the search holds more than its share of ``max_memory_mb`` resident
    (``max_memory``), or at ``deadline`` (a ``time.perf_counter()`` value).
    """
    cloner_ready()
    started = time.perf_counter()
    cpu0, calls0 = time.process_time(), engine.CALL_CLOCK[0]
    result = ExploreResult(model.component, model.target, model.bounds())
    result.workers = workers
    result.max_memory_mb = max_memory_mb
    exp = Expander(model, well_formed=inputs == "well-formed", memo=memo)
    reader = model.reader
    spec0, target0, gen0 = model.initial()
    snap0 = reader(spec0)
    problem = compare_snapshots(snap0, reader(target0), model.snapshot_checks, model.role)
    problem = problem or _state_invariants(model, reader(target0))
    problem = problem or model.state_checks(snap0, gen0, spec0, target0)
    if problem:
        return _finish(model, result, started, [], problem, save_dir)
    exp.checked.add(hash(snap0))
    pid0 = exp.pair(spec0, target0, snap0)
    exp.keep(pid0, (spec0, target0, snap0))
    result.reductions = {"memo": memo and model.memo, **model.reductions()}  # after a first key
    collecting = gc.isenabled()
    gc.disable()  # the expander collects the young generation itself (Expander.expand)
    try:
        found, stop, unexpanded = _search(
            exp,
            result,
            (pid0, gen0),
            workers,
            Limits(depth, max_states, deadline, max_memory_mb),
            progress,
            backend,
        )
    finally:
        if collecting:
            gc.enable()
    # this process's own share (the workers' shares were added by the parallel search)
    result.cpu_seconds += time.process_time() - cpu0
    result.call_seconds += engine.CALL_CLOCK[0] - calls0
    result.edges = result.edges or exp.edges  # the workers' sums, or this process's counts
    result.executed_calls = result.executed_calls or exp.executed
    result.dropped_edges = result.dropped_edges or exp.dropped
    result.operations = sorted(set(result.operations) | exp.methods)
    result.peak_memory_mb = max(result.peak_memory_mb, peak_mb())
    if progress is not None:
        progress(result.distinct_states, result.edges, result.max_depth)
    if found is not None:
        path, problem = found
        result.max_depth = max(result.max_depth, len(path))
        return _finish(model, result, started, path, problem, save_dir)
    result.stopped_by = stop
    result.complete = stop is None
    result.seconds = time.perf_counter() - started
    result.message = _message(result, depth, max_states, unexpanded)
    return result


@dataclass(frozen=True)
class Limits:
    """What stops a search early: ``depth`` layers, ``max_states`` distinct states, a
    ``deadline`` (``time.perf_counter()``), ``max_memory_mb`` resident over all its processes."""

    depth: int | None = None
    max_states: int | None = None
    deadline: float | None = None
    max_memory_mb: float | None = None

    def memory_share(self, processes: int) -> float | None:
        """One process's share of the memory bound."""
        return None if self.max_memory_mb is None else self.max_memory_mb / processes


def _search(
    exp: Expander,
    result: ExploreResult,
    start: tuple[int, Any],
    workers: int,
    limits: Limits,
    progress: Progress | None,
    backend: Callable[[], Any] | None = None,
) -> tuple[tuple[list[int], Check] | None, str | None, int]:
    if workers > 1:
        from proofs.explorer.parallel import explore_layers

        pool = None if backend is None else backend()
        return explore_layers(exp, result, start, workers, limits, progress, pool)
    return _serial(exp, result, start, limits, progress)


Layer = tuple[list[tuple[int, int, Any]], int]


def _serial(
    exp: Expander,
    result: ExploreResult,
    start: tuple[int, Any],
    limits: Limits,
    progress: Progress | None,
) -> tuple[tuple[list[int], Check] | None, str | None, int]:
    """Layer by layer in this process: (counterexample path and check, stop reason, states left
    unexpanded). Visited states are (pair id, gen id) packed into one int: pairs are numbered by
    the 64-bit fingerprints of their keys, as TLC does, and generator models interned."""
    model = exp.model
    depth, max_states, deadline = limits.depth, limits.max_states, limits.deadline
    memory = limits.memory_share(1)
    pid0, gen0 = start
    gid0 = exp.gid(gen0)
    # a state is (pair id, gen id): its key packs both, exactly (no fingerprint collisions here)
    seen: set[int] = {pid0 << 32 | gid0}
    observed: set[int] = {hash(model.observable(exp.objects[pid0][2], gen0))}
    parent = array("q", [-1])  # state id -> parent id
    via = array("l", [-1])  # state id -> index of the edge from the parent
    frontier: list[tuple[int, int, int]] = [(0, pid0, gid0)]
    result.states_per_depth = per_depth = [1]
    result.expanded_per_depth = expanded = []
    layer = unexpanded = 0
    stop: str | None = None
    last_report = last_check = 0.0
    gens = exp.gens
    while frontier:
        if depth is not None and layer >= depth:
            result.distinct_states, result.distinct_snapshots = len(seen), len(observed)
            return None, "depth", len(frontier)
        nxt: list[tuple[int, int, int]] = []
        left = Counter(pid for _, pid, _ in frontier)  # frontier states still to use each pair
        kept: set[int] = set()  # pairs of the next frontier (they keep their objects)
        expanded.append(len(frontier))  # (cut below where a stop or violation ends the layer)
        for position, (sid, pid, gid) in enumerate(frontier):
            left[pid] -= 1
            successors, found = exp.expand(pid, gid, not left[pid] and pid not in kept)
            if found is None:
                for index, succ, g, objects in successors:
                    key = succ << 32 | g
                    if key in seen:
                        continue
                    objects = objects or exp.objects.get(succ) or exp.materialize(pid, gid, index)
                    spec, target, snap = objects
                    gen = gens[g]
                    problem = model.state_checks(snap, gen, spec, target)
                    if problem is not None:
                        found = ([index], problem)
                        break
                    exp.keep(succ, objects)
                    seen.add(key)
                    observed.add(hash(model.observable(snap, gen)))
                    parent.append(sid)
                    via.append(index)
                    nxt.append((len(parent) - 1, succ, g))
                    kept.add(succ)
                    result.max_depth = layer + 1
                    if max_states is not None and len(seen) >= max_states:
                        stop = "max_states"
                        break
            if found is not None:
                expanded[-1] = position + 1
                result.distinct_states, result.distinct_snapshots = len(seen), len(observed)
                per_depth.extend([len(nxt)] if nxt else [])
                return ([*_path(parent, via, sid), *found[0]], found[1]), None, 0
            if stop is None and (deadline is not None or memory is not None):
                now = time.perf_counter()
                if deadline is not None and now > deadline:
                    stop = "deadline"
                elif memory is not None and now - last_check > 0.1:
                    last_check = now
                    if rss_mb() > memory:
                        stop = "max_memory"
            if stop is not None:
                # the state at ``position`` was expanded in full unless max_states cut it short
                expanded[-1] = position + (stop != "max_states")
                unexpanded = len(frontier) - expanded[-1] + len(nxt)
                break
            if progress is not None and time.perf_counter() - last_report > 0.25:
                last_report = time.perf_counter()
                progress(len(seen), exp.edges, layer + 1)
        per_depth.extend([len(nxt)] if nxt else [])
        if stop is not None:
            break
        exp.retain({pid for _, pid, _ in nxt})
        frontier = nxt
        layer += 1
    result.distinct_states, result.distinct_snapshots = len(seen), len(observed)
    return None, stop, unexpanded


def _path(parent: array, via: array, sid: int) -> list[int]:  # type: ignore[type-arg]
    path: list[int] = []
    while sid > 0:
        path.append(via[sid])
        sid = parent[sid]
    return path[::-1]


def _message(result: ExploreResult, depth: int | None, max_states: int | None, left: int) -> str:
    if result.stopped_by == "max_states":
        why = f"stopped at --max-states {max_states:,}"
        advice = "raise --max-states or tighten the bounds"
    elif result.stopped_by == "depth":
        return (
            f"stopped at --depth {depth}: every state within {depth} calls holds; "
            f"{left:,} states at depth {depth} were not expanded (incomplete)"
        )
    elif result.stopped_by == "deadline":
        why, advice = "stopped at the time budget", "raise --time-limit or tighten the bounds"
    elif result.stopped_by == "max_memory":
        why = f"stopped at the memory bound ({result.max_memory_mb:,.0f} MB resident)"
        advice = "raise --max-memory or tighten the bounds"
    else:
        return (
            f"complete: all {result.distinct_states:,} reachable states within the bounds were "
            f"explored (longest shortest path {result.max_depth} calls)"
        )
    return (
        f"{why}: every explored state holds, but the search is incomplete ({left:,} states "
        f"reached and not expanded; {how_far(result)}); {advice}"
    )


def how_far(result: ExploreResult) -> str:
    """How far a stopped search got: the last depth it expanded, in part or whole."""
    done, reached = result.expanded_per_depth, result.states_per_depth
    if not done:
        return "nothing expanded"
    d = len(done) - 1
    total = reached[d] if d < len(reached) else done[d]
    return (
        f"depth {d} expanded {done[d]:,} of {total:,} states, depths 0-{d - 1} in full"
        if d
        else f"depth 0 expanded {done[0]:,} of {total:,}"
    )


def _finish(
    model: Model,
    result: ExploreResult,
    started: float,
    path: list[int],
    problem: Check,
    save_dir: Path | None,
) -> ExploreResult:
    """Rebuild the counterexample along ``path``, replay it with the component's checker, save."""
    result.stopped_by = "violation"
    check, detail = problem
    steps = rebuild(model, path)
    divergence = Divergence(check, detail, steps)
    document = trace_document(
        model.component,
        model.target,
        model.trace_config(),
        steps,
        divergence,
        oracle=None if model.reference.kind == "spec" else model.reference.to_json(),
    )
    document["explorer"] = {"bounds": model.bounds(), "shortest": True}
    violation = Violation(check, detail, len(steps))
    replayed = None
    try:
        replayed = model.replay(document)
    except Exception as exc:  # a replay that cannot run is reported, never a crash
        violation.replay = f"unavailable ({type(exc).__name__}: {exc})"
    if replayed is not None:
        if replayed.passed:
            violation.replay = "passed (the component checker does not see this failure)"
        elif replayed.failure is not None and replayed.failure.check == check:
            violation.replay = "reproduced"
        else:
            other = replayed.failure.check if replayed.failure is not None else "?"
            violation.replay = f"diverged differently ({other})"
    elif violation.replay == "not run":
        violation.replay = "unavailable (no replay for this component yet)"
    violation.steps = document["steps"]
    if save_dir is not None:
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in model.target)[-60:]
        stem = f"explore-{model.component}-{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 0
        while (save_dir / f"{stem}{'-' + str(n) if n else ''}.json").exists():
            n += 1
        violation.trace_file = str(
            save_trace(document, save_dir, f"{stem}{'-' + str(n) if n else ''}")
        )
    result.violations.append(violation)
    result.complete = False
    result.seconds = time.perf_counter() - started
    result.message = f"{check} after {len(steps)} calls (a shortest counterexample)"
    return result


def rebuild(model: Model, path: Sequence[int]) -> list[Step]:
    """Re-run the edges along ``path`` from the initial state on fresh objects: the trace steps,
    with both sides' outcomes and the generator's holders after each call."""
    spec, target, gen = model.initial()
    steps: list[Step] = []
    for index in path:
        snap = model.reader(spec)
        edge = model.edges(snap, gen, partial(model.clone, spec))[index]
        s_out = invoke(spec, edge.method, edge.args)
        t_out = invoke(target, edge.method, edge.args)
        if s_out.raised is None and edge.then is not None:
            gen = edge.then(gen, s_out.returned)
        steps.append(Step(edge.method, list(edge.args), s_out, t_out, model.holders(gen)))
    return steps
