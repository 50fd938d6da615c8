"""Exhaustive small-scope explorer: breadth-first search over every operation sequence of a spec.

Layer 3 of shared/DESIGN.md ("TLC for KV caches"). From the spec's initial state, every operation
of a component's alphabet, with every argument of a bounded domain, is applied to a copy of every
reached state — and, in lockstep, to a copy of the paired *target* object (impl by default, or any
``--target``). Every edge compares what :class:`stateful_tests.lockstep.Lockstep` compares (return
value, exception kind, in-place mutation of list arguments, snapshot, ``atomic_failure``) and
every reached state is checked against every invariant, under the names of ``spec/invariants.py``.

* **States** are deduplicated by a canonical key: the spec's snapshot, the generator-side model
  the alphabet depends on (the live block tables and prefix pins of the block manager; the request
  bookkeeping the scheduler snapshot leaves out) and the hash tables of the spec's sets (below).
  The visited set stores 64-bit fingerprints of the keys, as TLC does; objects are kept only for
  the frontier.
* **Set iteration order is state.** Eviction order is the iteration order of the used set
  (reference infinilm.md §9.3), and a CPython set's order depends on its history (deleted entries
  leave dummies, the table grows with the fill): ``copy``, ``deepcopy`` and ``pickle`` rebuild a
  set and can change its future order. States are therefore cloned with every set's hash table
  copied verbatim (:func:`clone_set`, self-tested against the interpreter before a search), and
  the key holds the tables of the spec's sets (and of the target's: a target whose tables differ is
  explored separately). ``distinct_snapshots`` counts states up to those tables.
* **The target is paired with the spec state** through which it was first reached. Its hidden
  state (counters) is checked on *every* edge, not only on new states: the block manager's
  ``get_total_usable_blocks`` (``referenced_count_matches_live_pages``), the offload manager's
  ``_num_evictable_cache_blocks`` (``evictable_counter_matches_scan``), the scheduler's
  reservation and pending counters. Read-only calls (queries, rejected bad inputs) share one copy
  of each side per state; a failure or a spec change on a shared copy is re-decided on a fresh one.
* **Counterexamples are shortest**: BFS checks every edge of depth d before any of depth d+1. The
  path is rebuilt from parent pointers, replayed by the component's own checker, printed as a
  numbered step table and saved as a ``kvspec-trace/1`` document that ``kvspec replay`` re-runs
  (the vLLM offload traces use the offload checker's harness calls and config).
* **Bounds** are declared per component (:class:`BlockManagerBounds`, :class:`SchedulerBounds`,
  :class:`OffloadBounds`); ``max_states`` bounds memory, ``depth`` the path length and a deadline
  the time; any of them stopping the search makes the result ``complete: false`` and says so.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import enum
import itertools
import sys
import time
import types
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from spec import invariants as inv
from stateful_tests.lockstep import (
    Divergence,
    Outcome,
    Step,
    encode,
    same_exception,
    save_trace,
    trace_document,
)
from stateful_tests.vllm_offload import COMPONENTS as OFFLOAD_COMPONENTS
from stateful_tests.vllm_offload import VARIANTS as OFFLOAD_POLICY_VARIANTS
from stateful_tests.vllm_offload import Config as OffloadConfig
from stateful_tests.vllm_offload import ManagerHarness

COMPONENTS = ("infinilm-block-manager", "infinilm-scheduler", "vllm-arc", "vllm-lru")
Check = tuple[str, str]  # (check name, detail)


# ============================================================================ the search
class Edge:
    """One call of the alphabet from one state.

    ``then(returned)`` gives the generator model after a call the spec accepted (``None``: the
    model is unchanged); a call the spec rejects never changes the model. ``readonly``: the spec
    cannot change (a query, or a bad input the spec rejects before any change); ``bad``: the spec
    must reject it — if it does not, the edge is compared but not followed.
    """

    __slots__ = ("args", "bad", "method", "readonly", "then")

    def __init__(
        self,
        method: str,
        args: tuple[Any, ...],
        then: Callable[[Any], Any] | None = None,
        *,
        readonly: bool = False,
        bad: bool = False,
    ) -> None:
        self.method = method
        self.args = args
        self.then = then
        self.readonly = readonly
        self.bad = bad


# ---------------------------------------------------------------------------- exact clones
# Eviction order is the iteration order of a Python set (reference infinilm.md §9.3), and a set's
# iteration order depends on its history (deleted entries leave dummies; the table grows with the
# fill): ``copy``, ``deepcopy`` and ``pickle`` rebuild a set and may change its order. So states are
# cloned with every set's hash table copied verbatim (CPython layout, self-tested before use), and
# the state key includes the tables of the spec's sets: a snapshot alone does not determine the
# future order.


class _SetEntry(ctypes.Structure):
    _fields_ = (("key", ctypes.c_void_p), ("hash", ctypes.c_ssize_t))


class _SetObject(ctypes.Structure):  # CPython's PySetObject (3.11-3.13, default build)
    _fields_ = (
        ("ob_refcnt", ctypes.c_ssize_t),
        ("ob_type", ctypes.c_void_p),
        ("fill", ctypes.c_ssize_t),
        ("used", ctypes.c_ssize_t),
        ("mask", ctypes.c_ssize_t),
        ("table", ctypes.c_void_p),
        ("hash", ctypes.c_ssize_t),
        ("finger", ctypes.c_ssize_t),
        ("smalltable", _SetEntry * 8),
    )


_SMALLTABLE = _SetObject.smalltable.offset
_malloc = ctypes.pythonapi.PyMem_Malloc
_malloc.restype, _malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
_free = ctypes.pythonapi.PyMem_Free
_free.restype, _free.argtypes = None, (ctypes.c_void_p,)


class ExplorerUnsupported(RuntimeError):
    """This interpreter's sets cannot be cloned exactly (the explorer needs CPython 3.11+)."""


def clone_set(s: set[Any]) -> set[Any]:
    """A copy of ``s`` with the same hash table: same slots, dummies, size and fill, hence the
    same iteration order now and after any further sequence of adds and removes."""
    src = _SetObject.from_address(id(s))
    copied = s.copy()  # holds a reference to every element, as the verbatim table needs
    if src.fill == src.used and src.mask == 7 and src.finger == 0:
        return copied  # no dummies, small table: the copy is laid out slot for slot already
    dst = _SetObject.from_address(id(copied))
    mask, small = src.mask, id(copied) + _SMALLTABLE
    size = (mask + 1) * ctypes.sizeof(_SetEntry)
    if mask == 7:
        if dst.table != small:
            _free(dst.table)
            dst.table = small
        ctypes.memmove(small, src.table, size)
    else:
        table = _malloc(size)
        if not table:
            raise MemoryError("cannot allocate a set table")
        ctypes.memmove(table, src.table, size)
        if dst.table != small:
            _free(dst.table)
        dst.table = table
    dst.mask, dst.fill, dst.finger = mask, src.fill, src.finger
    return copied


def set_layout(s: set[Any]) -> tuple[int, bytes]:
    """The hash table of ``s`` (fill and raw entries) — equal layouts iterate equally forever.
    Entries hold element addresses: exact for small ints and shared elements (over-distinguishing
    otherwise, which costs states, never soundness)."""
    src = _SetObject.from_address(id(s))
    return src.fill, ctypes.string_at(src.table, (src.mask + 1) * ctypes.sizeof(_SetEntry))


_ATOMIC: set[type] = {
    int,
    float,
    bool,
    str,
    bytes,
    complex,
    type(None),
    type,
    range,
    frozenset,
    types.FunctionType,
    types.BuiltinFunctionType,
}
_STRATEGY: dict[type, Any] = {}
_MISSING = object()


def _slot_names(t: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in t.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)


def _strategy(t: type) -> Any:
    if t in _ATOMIC or issubclass(t, enum.Enum | type):
        _ATOMIC.add(t)
        return "atom"
    if t in (list, dict, set, tuple, deque, OrderedDict, types.MethodType):
        return t.__name__
    plain = (
        getattr(t, "__deepcopy__", None) is None
        and t.__reduce_ex__ is object.__reduce_ex__
        and getattr(t, "__getstate__", object.__getstate__) is object.__getstate__
        and t.__new__ is object.__new__
    )
    if plain:
        return (_slot_names(t), t.__dictoffset__ != 0)
    return "deepcopy"


def clone(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """An exact, independent copy of ``obj``'s object graph (aliasing kept, sets laid out as in
    the original; set elements and functions are shared, as they are hashable values)."""
    memo = {} if memo is None else memo
    t = type(obj)
    how = _STRATEGY.get(t)
    if how is None:
        how = _STRATEGY[t] = _strategy(t)
    if how == "atom":
        return obj
    found = memo.get(id(obj))
    if found is not None:
        return found
    new: Any
    if how == "list" or how == "deque":
        new = memo[id(obj)] = obj.copy()
        for i, x in enumerate(new):
            if type(x) not in _ATOMIC:
                new[i] = clone(x, memo)
    elif how == "dict":
        new = memo[id(obj)] = obj.copy()
        for k, v in new.items():
            if type(v) not in _ATOMIC:
                new[k] = clone(v, memo)
    elif how == "OrderedDict":
        new = memo[id(obj)] = OrderedDict()
        for k, v in obj.items():
            new[k] = v if type(v) in _ATOMIC else clone(v, memo)
    elif how == "set":
        new = memo[id(obj)] = clone_set(obj)
    elif how == "tuple":
        new = memo[id(obj)] = tuple(x if type(x) in _ATOMIC else clone(x, memo) for x in obj)
    elif how == "method":
        new = memo[id(obj)] = types.MethodType(obj.__func__, clone(obj.__self__, memo))
    elif how == "deepcopy":  # a type with its own copy protocol (sets inside it lose layout)
        new = copy.deepcopy(obj, memo)
    else:
        slots, has_dict = how
        new = memo[id(obj)] = object.__new__(t)
        if has_dict:
            state = obj.__dict__.copy()
            for k, v in state.items():
                if type(v) not in _ATOMIC:
                    state[k] = clone(v, memo)
            new.__dict__.update(state)
        for name in slots:
            v = getattr(obj, name, _MISSING)
            if v is not _MISSING:
                object.__setattr__(new, name, v if type(v) in _ATOMIC else clone(v, memo))
    return new


def _self_test() -> None:
    """Clone sets with every kind of history and check that the clones iterate like the
    originals under the same later operations; ``ExplorerUnsupported`` otherwise."""
    import random
    import sys

    if sys.implementation.name != "cpython" or sys.getsizeof(set()) != 216:
        raise ExplorerUnsupported("the explorer clones CPython sets verbatim; run it on CPython")
    rng = random.Random(0)
    for _ in range(300):
        universe = range(rng.choice((4, 8, 13, 40)))
        s: set[int] = set()
        for _ in range(rng.randint(0, 40)):
            (s.add if rng.random() < 0.6 else s.discard)(rng.choice(universe))
        c = clone(s)
        for _ in range(40):
            x, add = rng.choice(universe), rng.random() < 0.6
            for y in (s, c):
                (y.add if add else y.discard)(x)
            if list(s) != list(c) or set_layout(s) != set_layout(c):
                raise ExplorerUnsupported("this interpreter's set layout is not the one expected")


_TESTED: list[bool] = []


def cloner_ready() -> None:
    if not _TESTED:
        _self_test()
        _TESTED.append(True)


def rejected(method: str, args: tuple[Any, ...]) -> Edge:
    """A bad input: the spec must reject it without any change."""
    return Edge(method, args, readonly=True, bad=True)


def _copy_args(args: Sequence[Any]) -> list[Any]:
    # as Lockstep: each side gets its own top-level lists (some calls extend a table in place)
    return [list(a) if isinstance(a, list) else a for a in args]


def _invoke(obj: Any, method: str, args: Sequence[Any]) -> Outcome:
    call_args = _copy_args(args)
    try:
        returned, raised = getattr(obj, method)(*call_args), None
    except Exception as exc:  # both sides' exceptions are data to compare
        returned, raised = None, exc
    return Outcome(returned, raised, [a for a in call_args if isinstance(a, list)])


class Model:
    """A component's alphabet, checks and trace format (one subclass per component)."""

    component = ""
    reader: Callable[[Any], Any]
    snapshot_checks: Mapping[str, str] = {}
    state_invariants: Mapping[str, Callable[[Any], str | None]] = {}

    def __init__(self, target_cls: Callable[..., Any], target: str) -> None:
        self.target_cls = target_cls
        self.target = target

    # --- to override
    def bounds(self) -> dict[str, Any]:
        raise NotImplementedError

    def initial(self) -> tuple[Any, Any, Any]:
        """(spec object, target object, generator model)."""
        raise NotImplementedError

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        """Every call from a state, simplest first (``spec()`` gives a scratch copy of the spec)."""
        raise NotImplementedError

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        """The canonical state: everything the spec's future and the alphabet depend on."""
        return (snap, gen)

    def observable(self, snap: Any, gen: Any) -> Hashable:
        """The state without the spec's hidden layout (set tables): ``distinct_snapshots``."""
        return (snap, gen)

    def clone(self, obj: Any) -> Any:
        """An exact copy of one side (:func:`clone`; a model may know a faster exact way)."""
        return clone(obj)

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return False

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

    def replay(self, document: dict[str, Any]) -> Any:
        """The component checker's replay of a trace (a RunResult), or ``None`` if there is none."""
        return None

    # --- shared
    def compare(self, edge: Edge, before: Any, s: Outcome, t: Outcome, target: Any) -> Check | None:
        """Lockstep's comparison of one call (same checks, same order, same names)."""
        s_exc, t_exc = s.raised, t.raised
        if (s_exc is None) != (t_exc is None) or (
            s_exc is not None and t_exc is not None and not same_exception(s_exc, t_exc)
        ):
            return "exception", f"spec: {s.describe()}; target: {t.describe()}"
        if s_exc is None and s.returned != t.returned and encode(s.returned) != encode(t.returned):
            return "return_value", f"spec: {s.describe()}; target: {t.describe()}"
        if s.args_after != t.args_after and encode(s.args_after) != encode(t.args_after):
            return (
                "argument_mutation",
                f"list arguments after the call: spec {s.args_after} vs target {t.args_after}",
            )
        return None

    def compare_snapshots(self, snap: Any, target_snap: Any) -> Check | None:
        if target_snap == snap:
            return None
        names = snap.differing_fields(target_snap)
        check = next((self.snapshot_checks[f] for f in names if f in self.snapshot_checks), None)
        diffs = "; ".join(
            f"{f}: spec {getattr(snap, f)!r} vs target {getattr(target_snap, f)!r}" for f in names
        )
        return check or "snapshot", diffs


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
    stopped_by: str | None = None  # None (exhausted) | depth | max_states | deadline | violation
    message: str = ""
    violations: list[Violation] = field(default_factory=list)
    dropped_edges: int = 0  # bad inputs the spec accepted (compared, not followed)

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def states_per_second(self) -> float:
        return self.distinct_states / self.seconds if self.seconds > 0 else 0.0

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
            "complete": self.complete,
            "stopped_by": self.stopped_by,
            "message": self.message,
            "violations": [v.to_json() for v in self.violations],
        }


Progress = Callable[[int, int, int], None]  # (distinct states, edges, depth)


class _Run:
    """One edge applied in lockstep: outcomes, snapshots, the first failed check."""

    __slots__ = ("after", "gen", "problem", "s_out", "spec", "t_out", "target")

    def __init__(self, model: Model, edge: Edge, spec: Any, target: Any, snap: Any, gen: Any):
        self.spec, self.target, self.gen = spec, target, gen
        self.s_out = s_out = _invoke(spec, edge.method, edge.args)
        self.t_out = t_out = _invoke(target, edge.method, edge.args)
        self.after = None
        problem = model.compare(edge, snap, s_out, t_out, target)
        if problem is None:
            reader = model.reader
            # a read-only call leaves the spec as it was (by the spec's contract) unless it is a
            # "bad" input the spec accepted: only then is the spec read again
            if edge.readonly and (s_out.raised is not None or not edge.bad):
                self.after = after = snap
            else:
                self.after = after = reader(spec)
            target_snap = reader(target)
            problem = model.compare_snapshots(after, target_snap)
            if (
                problem is None
                and s_out.raised is not None
                and model.validate_first(edge.method, s_out.raised)
                and target_snap != snap
            ):
                problem = (
                    "atomic_failure",
                    f"{edge.method} raised {type(s_out.raised).__name__} but changed "
                    f"{snap.differing_fields(target_snap)}",
                )
            if problem is None and s_out.raised is None and edge.then is not None:
                self.gen = edge.then(s_out.returned)
        self.problem = problem


def explore(
    model: Model,
    *,
    depth: int | None = None,
    max_states: int | None = 1_000_000,
    deadline: float | None = None,
    progress: Progress | None = None,
    save_dir: Path | None = None,
) -> ExploreResult:
    """Breadth-first search of ``model`` from its initial state.

    Stops at the first violation (the shortest counterexample; it is rebuilt, replayed with the
    component's checker and saved under ``save_dir`` if given), when the reachable states within
    the bounds are exhausted (``complete``), after ``depth`` layers, at ``max_states`` distinct
    states, or at ``deadline`` (a ``time.perf_counter()`` value).
    """
    cloner_ready()
    started = time.perf_counter()
    result = ExploreResult(model.component, model.target, model.bounds())
    reader = model.reader
    spec0, target0, gen0 = model.initial()
    snap0 = reader(spec0)
    problem = model.compare_snapshots(snap0, reader(target0))
    problem = problem or _state_invariants(model, reader(target0))
    problem = problem or model.state_checks(snap0, gen0, spec0, target0)
    if problem:
        return _finish(model, result, started, [], problem, save_dir)
    seen: set[int] = {hash(model.key(snap0, gen0, spec0, target0))}
    observed: set[int] = {hash(model.observable(snap0, gen0))}
    parent = array("q", [-1])  # state id -> parent id
    via = array("l", [-1])  # state id -> index of the edge from the parent
    checked: set[int] = {hash(snap0)}  # fingerprints of snapshots whose state invariants hold
    frontier: list[tuple[int, Any, Any, Any, Any]] = [(0, spec0, target0, snap0, gen0)]
    layer = edges = unexpanded = 0
    found: tuple[list[int], Check] | None = None
    stop: str | None = None
    last_report = 0.0
    dup = model.clone

    def judge(edge: Edge, snap: Any, run: _Run) -> Check | None:
        """The edge's lockstep verdict, then the state invariants of a snapshot not seen before
        (the target's snapshot equals the spec's by then), then the target's hidden state."""
        problem = run.problem
        if problem is None and hash(run.after) not in checked:
            problem = _state_invariants(model, run.after)
            checked.add(hash(run.after))
        if problem is None:
            problem = model.edge_checks(edge, snap, run.after, run.s_out, run.target, run.gen)
        return problem

    while frontier and found is None and stop is None:
        if depth is not None and layer >= depth:
            stop = "depth"
            break
        nxt: list[tuple[int, Any, Any, Any, Any]] = []
        for position, (sid, spec_p, target_p, snap, gen) in enumerate(frontier):
            # read-only calls share one copy of each side; ``history``: the read-only edges already
            # applied to the shared target (its hidden state might remember them)
            shared: list[Any] = []
            history: list[int] = []
            scratch: Callable[[], Any] = partial(dup, spec_p)
            for index, edge in enumerate(model.edges(snap, gen, scratch)):
                edges += 1
                if edge.readonly:
                    if not shared:
                        shared[:] = [dup(spec_p), dup(target_p)]
                        history.clear()
                    run = _Run(model, edge, shared[0], shared[1], snap, gen)
                else:
                    run = _Run(model, edge, dup(spec_p), dup(target_p), snap, gen)
                problem = judge(edge, snap, run)
                extra: list[int] = []
                if edge.readonly and (
                    problem is not None or run.after != snap or run.gen is not gen
                ):
                    if history:  # the shared target saw earlier read-only calls: decide afresh
                        fresh = _Run(model, edge, dup(spec_p), dup(target_p), snap, gen)
                        fresh_problem = judge(edge, snap, fresh)
                        if problem is not None and fresh_problem is None:
                            extra = list(history)  # reproducible only after those calls
                        else:
                            run, problem = fresh, fresh_problem
                    shared.clear()  # that copy has moved on (or the search stops here)
                if problem is not None:
                    found = ([*_path(parent, via, sid), *extra, index], problem)
                    break
                after = run.after
                if edge.readonly and shared:
                    history.append(index)
                    continue  # a self-loop: the shared copies stay usable
                if edge.bad and run.s_out.raised is None:
                    result.dropped_edges += 1  # the spec accepted a "bad" input: not followed
                    continue
                if run.gen is gen and after == snap:
                    continue  # a self-loop (the target was compared; nothing new to explore)
                fp = hash(model.key(after, run.gen, run.spec, run.target))
                if fp in seen:
                    continue
                problem = model.state_checks(after, run.gen, run.spec, run.target)
                if problem is not None:
                    found = ([*_path(parent, via, sid), index], problem)
                    break
                seen.add(fp)
                observed.add(hash(model.observable(after, run.gen)))
                parent.append(sid)
                via.append(index)
                nxt.append((len(parent) - 1, run.spec, run.target, after, run.gen))
                result.max_depth = layer + 1
                if max_states is not None and len(seen) >= max_states:
                    stop = "max_states"
                    break
            if found is not None:
                break
            if stop is not None:
                unexpanded = len(frontier) - position + len(nxt)
                break
            if deadline is not None and time.perf_counter() > deadline:
                stop = "deadline"
            if stop is not None:
                unexpanded = len(frontier) - position - 1 + len(nxt)
                break
            if progress is not None and time.perf_counter() - last_report > 0.25:
                last_report = time.perf_counter()
                progress(len(seen), edges, layer + 1)
        if found is None and stop is None:
            frontier = nxt
            layer += 1
    result.distinct_states = len(seen)
    result.distinct_snapshots = len(observed)
    result.edges = edges
    if progress is not None:
        progress(len(seen), edges, result.max_depth)
    if found is not None:
        path, problem = found
        result.max_depth = max(result.max_depth, len(path))
        return _finish(model, result, started, path, problem, save_dir)
    if stop == "depth":
        unexpanded = len(frontier)
    result.stopped_by = stop
    result.complete = stop is None
    result.seconds = time.perf_counter() - started
    result.message = _message(result, depth, max_states, unexpanded)
    return result


def _state_invariants(model: Model, target_snap: Any) -> Check | None:
    for name, predicate in model.state_invariants.items():
        problem = predicate(target_snap)
        if problem:
            return name, problem
    return None


def _path(parent: array, via: array, sid: int) -> list[int]:  # type: ignore[type-arg]
    path: list[int] = []
    while sid > 0:
        path.append(via[sid])
        sid = parent[sid]
    return path[::-1]


def _message(result: ExploreResult, depth: int | None, max_states: int | None, left: int) -> str:
    if result.stopped_by == "max_states":
        return (
            f"stopped at --max-states {max_states:,}: every explored state holds, but the search is "
            f"incomplete ({left:,} states left in the frontier); raise --max-states or tighten "
            "the bounds"
        )
    if result.stopped_by == "depth":
        return (
            f"stopped at --depth {depth}: every state within {depth} calls holds; "
            f"{left:,} states at depth {depth} were not expanded (incomplete)"
        )
    if result.stopped_by == "deadline":
        return "stopped at the time budget: incomplete"
    return (
        f"complete: all {result.distinct_states:,} reachable states within the bounds were "
        f"explored (longest shortest path {result.max_depth} calls)"
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
        model.component, model.target, model.trace_config(), steps, divergence
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
        s_out = _invoke(spec, edge.method, edge.args)
        t_out = _invoke(target, edge.method, edge.args)
        if s_out.raised is None and edge.then is not None:
            gen = edge.then(s_out.returned)
        steps.append(Step(edge.method, list(edge.args), s_out, t_out, model.holders(gen)))
    return steps


# ============================================================================ block manager
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

    def validate(self) -> None:
        for name, lo, hi in (
            ("pages", 1, 8),
            ("block_size", 1, 8),
            ("vocab", 1, 8),
            ("tables", 1, 8),
            ("tokens", 1, 64),
        ):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name.replace('_', '-')} must be in [{lo}, {hi}], got {value}")


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
        state["hash_to_block_ids"] = {h: clone_set(v) for h, v in bm.hash_to_block_ids.items()}
        copied = new(cls)
        copied.__dict__.update(state)
        return copied

    return fast


REQUEST, PIN = 0, 1
Holder = tuple[int, tuple[int, ...], int, tuple[int, ...]]  # (kind, table, tokens, published toks)
# A request's published pages are always its leading pages, so the tokens of the published prefix
# (``len == indexed * B``) are all a holder needs: page contents are chosen when pages are
# published (every choice is explored), not when a request is admitted.


def _with(gen: tuple[Holder, ...], old: Holder | None, new: Holder | None) -> tuple[Holder, ...]:
    holders = list(gen)
    if old is not None:
        holders.remove(old)
    if new is not None:
        holders.append(new)
    return tuple(sorted(holders))


class BlockManagerModel(Model):
    """The block-manager alphabet (mirrors ``stateful_tests.infinilm_block_manager.Driver``)."""

    component = "infinilm-block-manager"

    def __init__(
        self, target_cls: Callable[..., Any], target: str, bounds: BlockManagerBounds
    ) -> None:
        from spec.infinilm.block_manager import BlockManager as SpecBlockManager
        from spec.infinilm.snapshot import read_block_manager
        from stateful_tests import infinilm_block_manager as bm

        super().__init__(target_cls, target)
        bounds.validate()
        self.b = bounds
        self.spec_cls = SpecBlockManager
        self.reader = read_block_manager
        self.snapshot_checks = bm.SNAPSHOT_CHECKS
        self.state_invariants = inv.STATE_INVARIANTS
        self._validate_first = bm.validate_first
        self.contents = list(itertools.product(range(bounds.vocab), repeat=bounds.block_size))
        self._hashes: dict[tuple[int, ...], tuple[bytes, ...]] = {(): ()}
        self._fast: dict[type, Any] = {}

    def bounds(self) -> dict[str, Any]:
        return asdict(self.b)

    def initial(self) -> tuple[Any, Any, Any]:
        b = self.b
        return self.spec_cls(b.pages, b.block_size), self.target_cls(b.pages, b.block_size), ()

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

    def replay(self, document: dict[str, Any]) -> Any:
        from stateful_tests.infinilm_block_manager import replay

        return replay(document, self.target_cls, self.target)

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
    def edges(self, snap: Any, gen: tuple[Holder, ...], spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        n, size = b.pages, b.block_size
        out: list[Edge] = []
        add = out.append
        room = len(gen) < b.tables
        distinct = sorted(set(gen))
        if b.queries:
            add(Edge("get_num_free_blocks", (), readonly=True))
            add(Edge("get_total_usable_blocks", (), readonly=True))
            for k in range(n + 2):
                add(Edge("can_allocate", (k,), readonly=True))
        for k in range(n + 2):
            add(Edge("try_free_blocks", (k,)))
        if room:  # admit a request without prefix lookup (some tokens remote-computed)
            for length in range(1, b.tokens + 1):
                for computed in range(length):
                    add(
                        Edge(
                            "allocate_slots",
                            (length - computed, computed),
                            self._admit(gen, None, length, ()),
                        )
                    )
        index = {h for h, _ in snap.hash_to_block_ids}
        for chain in self.indexed_chains(index) if index else ():
            hashes = list(self.hashes(chain))
            for cap in (len(hashes) * size - 1, len(hashes) * size):  # the P-1 cap, and none
                pages = cap // size
                if pages == 0:
                    add(Edge("get_computed_blocks", (hashes, cap), readonly=True))
                elif room:
                    add(Edge("get_computed_blocks", (hashes, cap), self._pin(gen, chain)))
        miss = next((c for c in self.contents if self.hashes(c)[0] not in index), None)
        if miss is not None:
            add(Edge("get_computed_blocks", (list(self.hashes(miss)), size), readonly=True))
        for h in distinct:  # the scheduler's admission: allocate behind a pinned prefix
            if h[0] != PIN:
                continue
            table, hit = list(h[1]), len(h[1]) * size
            for length in range(hit + 1, b.tokens + 1):
                for computed in range(hit, length):
                    add(
                        Edge(
                            "allocate_slots",
                            (length - computed, computed, table),
                            self._admit(gen, h, length, h[3]),
                        )
                    )
            if b.bad_inputs:
                add(rejected("allocate_slots", (1, hit - 1, table)))
        for h in distinct:
            if h[0] == REQUEST:
                self._request_edges(h, gen, add)
        for h in distinct:
            add(Edge("free_blocks", (list(h[1]),), self._release(gen, h)))
        if b.bad_inputs:
            for page in range(n):
                if snap.ref_counts[page] == 0:
                    add(rejected("free_blocks", ([page],)))  # double release
            add(rejected("free_blocks", ([n],)))
            add(rejected("free_blocks", ([-1],)))
            add(rejected("allocate_slots", (-1, 0)))
            add(rejected("allocate_slots", (1, -1)))
            add(rejected("try_free_blocks", (-1,)))
            add(rejected("can_allocate", (-1,)))
            add(rejected("publish_computed_blocks", ([n], [b"\x01" * 16], 0, size)))
            if snap.free_block_ids:  # publishing a page nobody holds
                free_page = snap.free_block_ids[0]
                add(rejected("publish_computed_blocks", ([free_page], [b"\x01" * 16], 0, size)))
        return out

    def _request_edges(
        self, h: Holder, gen: tuple[Holder, ...], add: Callable[[Edge], None]
    ) -> None:
        b = self.b
        size, n = b.block_size, b.pages
        _, table_t, length, chain = h
        table = list(table_t)
        indexed = len(chain) // size
        end = min(length // size, len(table))
        for stop in range(indexed + 1, end + 1):  # publish every choice of page contents
            for combo in itertools.product(self.contents, repeat=stop - indexed):
                tokens = chain + tuple(itertools.chain.from_iterable(combo))
                add(
                    Edge(
                        "publish_computed_blocks",
                        (table, list(self.hashes(tokens)), indexed, stop * size),
                        self._replace(gen, h, (REQUEST, table_t, length, tokens)),
                    )
                )
        decodable = len(table) == -(-length // size)
        if decodable and length < b.tokens:
            add(Edge("append_slot", (table, length + 1), self._decode(gen, h)))
        if decodable:
            for drafts in range(1, b.tokens - length + 1):
                add(Edge("append_slots", (table, length + 1, drafts), self._drafts(gen, h)))
        for keep in range(1, len(table) * size + 1):
            add(Edge("truncate_blocks", (table, keep), self._truncate(gen, h, keep)))
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

    # ------------------------------------------------------------ model updates
    def _admit(
        self, gen: tuple[Holder, ...], pin: Holder | None, length: int, chain: tuple[int, ...]
    ) -> Callable[[Any], Any]:
        def then(returned: Any) -> Any:
            if returned is None:  # no pages: a pin stays pinned (released later by free_blocks)
                return gen
            return _with(gen, pin, (REQUEST, tuple(returned[0]), length, chain))

        return then

    def _pin(self, gen: tuple[Holder, ...], chain: tuple[int, ...]) -> Callable[[Any], Any]:
        size = self.b.block_size

        def then(returned: Any) -> Any:
            table = tuple(returned[0])
            if not table:
                return gen
            return _with(gen, None, (PIN, table, len(table) * size, chain[: len(table) * size]))

        return then

    def _replace(self, gen: tuple[Holder, ...], old: Holder, new: Holder) -> Callable[[Any], Any]:
        return lambda returned: _with(gen, old, new)

    def _release(self, gen: tuple[Holder, ...], old: Holder) -> Callable[[Any], Any]:
        return lambda returned: _with(gen, old, None)

    def _decode(self, gen: tuple[Holder, ...], h: Holder) -> Callable[[Any], Any]:
        return lambda returned: _with(gen, h, (REQUEST, tuple(returned[0]), h[2] + 1, h[3]))

    def _drafts(self, gen: tuple[Holder, ...], h: Holder) -> Callable[[Any], Any]:
        return lambda returned: _with(gen, h, (REQUEST, tuple(returned[0]), h[2], h[3]))

    def _truncate(self, gen: tuple[Holder, ...], h: Holder, keep: int) -> Callable[[Any], Any]:
        size = self.b.block_size

        def then(returned: Any) -> Any:
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
        if usable != snap.num_blocks - sum(1 for r in snap.ref_counts if r > 0):
            problem = inv.referenced_count_matches_live_pages(snap, usable)
            return "referenced_count_matches_live_pages", str(problem)
        return None

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
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


# ============================================================================ vLLM offload (ARC, LRU)
# component -> variants: the offload checker's table (one list of variant names)
OFFLOAD_VARIANTS = {c: OFFLOAD_POLICY_VARIANTS[p] for c, p in OFFLOAD_COMPONENTS.items()}


@dataclass(frozen=True)
class OffloadBounds:
    """The small scope of the offload explorer: a ``CPUOffloadingManager`` of ``capacity`` blocks
    with the component's policy in ``variant``, keys ``0..keys-1``; ``prepare_store`` of up to
    ``store_width`` distinct keys, ``touch`` of up to ``touch_width``; at most ``max_loads``
    concurrent loads per block. ``symmetry``: keys are opaque to every policy, so states equal up to
    a renaming of keys are explored once (and fresh keys are taken in order)."""

    variant: str = ""
    capacity: int = 3
    keys: int = 5
    store_width: int = 2
    touch_width: int = 2
    max_loads: int = 1
    bad_inputs: bool = True
    symmetry: bool = True

    def validate(self, component: str) -> None:
        if self.variant not in OFFLOAD_VARIANTS[component]:
            raise ValueError(
                f"unknown {component} variant {self.variant!r}; choose one of "
                f"{', '.join(OFFLOAD_VARIANTS[component])}"
            )
        for name, lo, hi in (
            ("capacity", 1, 8),
            ("keys", 1, 12),
            ("store_width", 1, 6),
            ("touch_width", 1, 6),
            ("max_loads", 1, 4),
        ):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name.replace('_', '-')} must be in [{lo}, {hi}], got {value}")


def _relabel(snap: Any) -> tuple[Any, ...]:
    """``snap`` with keys renamed by first appearance (lists front to back, then blocks by id):
    equal for two states iff they are equal up to a renaming of keys."""
    p = snap.policy
    names: dict[Any, int] = {}
    lists = (p.t1, p.t2, p.b1, p.b2) if hasattr(p, "t1") else (p.order,)
    for seq in (*lists, [k for _, k, _ in p.blocks]):
        for k in seq:
            if k not in names:
                names[k] = len(names)
    policy = (
        tuple((b, names[k], r) for b, k, r in p.blocks),
        tuple(tuple(names[k] for k in seq) for seq in lists),
        getattr(p, "target_t1_size", None),
    )
    return (snap.num_allocated_blocks, snap.free_list, policy)


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
    }
)
_POLICY_BLOCKS = ("t1", "t2", "blocks")  # key -> BlockStatus (each block in exactly one)
_POLICY_KEYS = ("b1", "b2", "evictable_blocks", "counts")  # key -> None / int
_POLICY_ATTRIBUTES = frozenset(
    {*_POLICY_BLOCKS, *_POLICY_KEYS, "cache_capacity", "t1_fallback", "target_t1_size"}
    | {"variant", "_v2"}
)


def _clone_offload(h: ManagerHarness) -> ManagerHarness:
    """An exact clone of a harness around kvspec's own offload managers and policies: the generic
    :func:`clone`, unrolled (any other shape goes through :func:`clone`)."""
    from spec.vllm import BlockStatus

    m = h.m
    policy = getattr(m, "_policy", None)
    if (
        type(h) is not ManagerHarness
        or not hasattr(m, "__dict__")
        or not m.__dict__.keys() <= _MANAGER_ATTRIBUTES
        or not hasattr(policy, "__dict__")
        or not policy.__dict__.keys() <= _POLICY_ATTRIBUTES
        or m.events
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


class OffloadModel(Model):
    """The offload manager alphabet for one policy variant (ARC or LRU)."""

    def clone(self, obj: Any) -> Any:
        return _clone_offload(obj)

    def __init__(
        self, component: str, target_cls: Callable[..., Any], target: str, bounds: OffloadBounds
    ) -> None:
        from spec.vllm.offload_manager import CPUOffloadingManager, read_offload_manager

        super().__init__(target_cls, target)
        bounds.validate(component)
        self.component = component
        self.b = bounds
        self.spec_cls = CPUOffloadingManager
        self.reader = lambda h: read_offload_manager(h.m)
        self.snapshot_checks = {"free_list": "identical_eviction_order"}
        lru = "v1" if bounds.variant == "v1" else "v2"
        self.state_invariants = {
            "arc_lists_bounded": inv.arc_lists_bounded,
            "offload_ids_partition_pool": inv.offload_ids_partition_pool,
            "lru_order_consistent": lambda s: inv.lru_order_consistent(s, lru),
        }
        self.config = OffloadConfig(
            policy=component.removeprefix("vllm-"),
            variant=bounds.variant,
            num_blocks=bounds.capacity,
            num_keys=bounds.keys,
            enable_events=False,
            store_threshold=1,
            max_tracker_size=8,
        )

    def bounds(self) -> dict[str, Any]:
        return asdict(self.b)

    def initial(self) -> tuple[Any, Any, Any]:
        return (
            ManagerHarness(self.spec_cls, self.config),
            ManagerHarness(self.target_cls, self.config),
            (),
        )

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return True  # every raising manager call validates first

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def replay(self, document: dict[str, Any]) -> Any:
        try:
            from stateful_tests.vllm_offload import replay
        except ImportError:
            return None
        return replay(document, self.target_cls, self.target)

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        return _relabel(snap) if self.b.symmetry else snap

    def observable(self, snap: Any, gen: Any) -> Hashable:
        return self.key(snap, gen, None, None)

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        p = snap.policy
        refs = {k: r for _, k, r in p.blocks}
        ghosts = [*getattr(p, "b1", ()), *getattr(p, "b2", ())]
        known = sorted({*refs, *ghosts})
        unknown = [k for k in range(b.keys) if k not in refs and k not in ghosts]
        fresh = unknown[: b.store_width] if b.symmetry else unknown
        out: list[Edge] = []
        add = out.append
        for k in known + unknown[:1]:
            add(Edge("lookup", (k,), readonly=True))
        for width in range(1, b.touch_width + 1):  # unknown keys are no-ops: one representative
            for keys in itertools.permutations(known, width):
                add(Edge("touch", (list(keys),)))
        if unknown:
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
            add(Edge("complete_store", (pending, True)))
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
        return out

    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        method, args = edge.method, edge.args
        if method == "prepare_store" and spec_out.raised is None and spec_out.returned is None:
            problem = inv.atomic_failure(before, snap)
            if problem:
                return "atomic_failure", f"prepare_store returned None: {problem}"
        if method != "reset_cache":
            protected = list(args[0]) if method == "prepare_store" else []
            released = list(args[0]) if method == "complete_store" and not args[1] else []
            problem = inv.offload_no_live_eviction(
                before,
                snap,
                may_evict=method == "prepare_store",
                protected=protected,
                released=released,
            )
            if problem:
                return "no_live_eviction", problem
        counter = getattr(target.m, "_num_evictable_cache_blocks", None)
        if isinstance(counter, int):
            problem = inv.evictable_counter_matches_scan(snap, counter)
            if problem:
                return "evictable_counter_matches_scan", problem
        return None


# ============================================================================ scheduler
@dataclass(frozen=True)
class SchedulerBounds:
    """The small scope of the scheduler explorer (the engine-loop harness of
    ``stateful_tests.infinilm_scheduler``): a pool of ``pages`` pages of ``block_size`` tokens,
    batches of ``batch`` requests and ``budget`` tokens, at most ``requests`` requests over the
    whole run, prompts of 1..``prompt_tokens`` tokens from ``0..vocab-1``, ``max_tokens`` in
    1..``max_new``; a step's simulated output per scheduled request: EOS or not, the sampled token
    from ``0..gen_vocab-1`` (and draft/accept counts with ``speculation``). ``connector``: a
    scripted PD connector (external tokens none or all, async, delayed free) and its events.
    ``soundness``: also fail when a decode step runs out of pages without draft tokens."""

    variant: str = "legacy"
    pages: int = 4
    block_size: int = 2
    batch: int = 2
    budget: int = 8
    requests: int = 3
    prompt_tokens: int = 3
    max_new: int = 2
    vocab: int = 1
    gen_vocab: int = 1
    prefix_caching: bool = True
    connector: bool = False
    speculation: bool = False
    soundness: bool = False

    def validate(self) -> None:
        from spec.infinilm.scheduler import RESERVATIONS

        if self.variant not in RESERVATIONS:
            raise ValueError(
                f"unknown variant {self.variant!r}; choose one of {', '.join(RESERVATIONS)}"
            )
        for name, lo, hi in (
            ("pages", 1, 8),
            ("block_size", 1, 8),
            ("batch", 1, 8),
            ("budget", 1, 256),
            ("requests", 1, 6),
            ("prompt_tokens", 1, 16),
            ("max_new", 1, 16),
            ("vocab", 1, 4),
            ("gen_vocab", 1, 4),
        ):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name.replace('_', '-')} must be in [{lo}, {hi}], got {value}")


_RIDS = tuple(sys.intern(f"r{i}") for i in range(8))  # interned: set tables hold their addresses


class SchedulerModel(Model):
    """Engine events over a spec harness and a target harness (mirrors the scheduler Driver)."""

    component = "infinilm-scheduler"

    def __init__(
        self, target_cls: Callable[..., Any], target: str, bounds: SchedulerBounds
    ) -> None:
        from spec.infinilm.scheduler import Scheduler as SpecScheduler
        from stateful_tests import infinilm_scheduler as sched

        super().__init__(target_cls, target)
        bounds.validate()
        self.b = bounds
        self.sched = sched
        self.spec_cls = SpecScheduler
        self.reader = lambda h: h.snapshot()
        self.state_invariants = {"block_manager": sched._state_invariants}
        self.config = sched.Config(
            num_blocks=bounds.pages,
            block_size=bounds.block_size,
            max_batch_size=bounds.batch,
            max_num_batched_tokens=bounds.budget,
            prefix_caching=bounds.prefix_caching,
            connector=bounds.connector,
            mamba=False,
            speculation=bounds.speculation,
            reservation=bounds.variant,
            vocab=bounds.vocab,
        )
        self.prompts = [
            list(p)
            for n in range(1, bounds.prompt_tokens + 1)
            for p in itertools.product(range(bounds.vocab), repeat=n)
        ]

    def bounds(self) -> dict[str, Any]:
        return asdict(self.b)

    def initial(self) -> tuple[Any, Any, Any]:
        h = self.sched.EngineHarness
        return h(self.spec_cls, self.config), h(self.target_cls, self.config), ()

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def replay(self, document: dict[str, Any]) -> Any:
        return self.sched.replay(document, self.target_cls, self.target, soundness=self.b.soundness)

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        return (snap, _harness_extras(spec), _harness_extras(target))

    def observable(self, snap: Any, gen: Any) -> Hashable:
        return snap  # type: ignore[no-any-return]

    # ------------------------------------------------------------ the alphabet
    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        out: list[Edge] = []
        add = out.append
        statuses = {r[0]: r[1] for r in snap.requests}
        live = [rid for rid, status in statuses.items() if status not in _TERMINAL_NAMES]
        for rid in snap.waiting:
            add(Edge("can_accept_request", (rid, 0), readonly=True))
        for plan in self._plans(spec, live):
            add(Edge("step", (plan,)))
        if len(statuses) < b.requests:
            rid = _RIDS[len(statuses)]
            connector = (
                [(e, a, d) for e in (0, -1) for a in (False, True) for d in (False, True)]
                if b.connector
                else [(0, False, False)]
            )
            for prompt in self.prompts:
                for max_tokens in range(1, b.max_new + 1):
                    for external, is_async, delay in connector:
                        ext = len(prompt) if external < 0 else external
                        add(
                            Edge(
                                "add_request",
                                (rid, prompt, max_tokens, False, ext, is_async, delay),
                            )
                        )
        for rid in live:
            for status in ("CANCELED", "TIMEOUT"):
                add(Edge("abort", (rid, status)))
        if b.connector:
            for events in self._connector_events(snap):
                add(Edge("connector_events", events))
        return out

    def _plans(self, spec: Callable[[], Any], live: list[str]) -> list[list[list[Any]]]:
        """Every simulated model output for the requests the spec would schedule now."""
        b = self.b
        probe = spec()
        try:
            out = probe.s.schedule()
        except Exception:  # the step will raise before any output: one call covers it
            return [[]]
        if out is None:
            return [[]]
        rows_per_request = []
        for req in out.scheduled_requests:
            rows = []
            for token in range(b.gen_vocab):
                for eos in (False, True):
                    drafts = range(3) if b.speculation and not out.is_prefill else range(1)
                    for draft in drafts:
                        for accept in range(draft + 1):
                            rows.append([req.request_id, token, eos, draft, accept])
            rows_per_request.append(rows)
        return [list(rows) for rows in itertools.product(*rows_per_request)]

    def _connector_events(self, snap: Any) -> list[tuple[Any, ...]]:
        """Per remote-pending request: nothing, finished, failed, failed with its first page
        invalid; per parked table: nothing, received, sent; plus events for an unknown id."""
        tables = {r[0]: r[2] for r in snap.requests}
        remote = list(snap.remote)
        parked = [rid for rid, _ in snap.pending_free_blocks]
        choices: list[list[tuple[str, str]]] = [
            [(rid, c) for c in ("none", "finished", "failed", "invalid")] for rid in remote
        ] + [[(rid, c) for c in ("none", "recv", "sent")] for rid in parked]
        out: list[tuple[Any, ...]] = []
        for combo in itertools.product(*choices):
            finished = [rid for rid, c in combo if c in ("finished", "recv")]
            failed = [rid for rid, c in combo if c in ("failed", "invalid")]
            sent = [rid for rid, c in combo if c == "sent"]
            invalid = [tables[rid][0] for rid, c in combo if c == "invalid" and tables[rid]]
            if finished or failed or sent:
                out.append((finished, sent, failed, invalid))
        out.append(([], ["unknown-id"], [], []))
        return out

    # ------------------------------------------------------------ harness invariants
    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        return self.sched.check_harness(target, soundness=self.b.soundness)

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
        return self.sched.check_harness(spec, soundness=self.b.soundness)


_TERMINAL_NAMES = frozenset({"FINISHED", "CANCELED", "TIMEOUT", "FAILED"})


def _harness_extras(h: Any) -> tuple[Any, ...]:
    """What the scheduler snapshot leaves out but the future depends on: each request's prompt,
    max_tokens, multimodal flag and generated tokens, the connector's plan, requests lost to an
    out-of-pages step, and the hash tables of the sets (eviction order, id sets)."""
    s = h.s
    requests = tuple(
        (
            rid,
            tuple(r.prompt_token_ids),
            r.sampling_params.max_tokens,
            r.has_multimodal_inputs,
            tuple(r._generated_token_ids),
        )
        for rid, r in sorted(h.requests.items())
    )
    plan = tuple(sorted(h.connector.plan.items())) if h.connector is not None else ()
    bm = s.cache_manager
    sets = (
        _bm_tables(bm),
        _table(s.finished_receiving_kv_req_ids),
        _table(s.failed_receiving_kv_req_ids),
    )
    return (requests, plan, tuple(sorted(h.lost)), h.decode_oom_without_drafts, sets)


# ============================================================================ entry points
BOUNDS: dict[str, type] = {
    "infinilm-block-manager": BlockManagerBounds,
    "infinilm-scheduler": SchedulerBounds,
    "vllm-arc": OffloadBounds,
    "vllm-lru": OffloadBounds,
}


def variants(component: str) -> tuple[str, ...]:
    """The named variants a component's exploration runs through (one run each)."""
    if component == "infinilm-scheduler":
        from spec.infinilm.scheduler import RESERVATIONS

        return tuple(RESERVATIONS)
    return OFFLOAD_VARIANTS.get(component, ("",))


def default_bounds(component: str, variant: str = "", **overrides: Any) -> Any:
    """The component's default small scope with ``overrides`` (``ValueError`` if out of range or
    not a bound of this component). A scheduler with a PD connector defaults to 2 requests (the
    connector multiplies every admission by 8 choices)."""
    if component not in BOUNDS:
        raise ValueError(f"unknown component {component!r} (one of {', '.join(COMPONENTS)})")
    cls = BOUNDS[component]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"{', '.join('--' + u.replace('_', '-') for u in unknown)} does not apply to "
            f"{component}"
        )
    values = dict(overrides)
    if "variant" in names:
        values["variant"] = variant or variants(component)[0]
    if component == "infinilm-scheduler" and values.get("connector"):
        values.setdefault("requests", 2)
    bounds = cls(**values)
    if isinstance(bounds, OffloadBounds):
        bounds.validate(component)
    else:
        bounds.validate()
    return bounds


def make_model(component: str, target_cls: Callable[..., Any], target: str, bounds: Any) -> Model:
    if component == "infinilm-block-manager":
        return BlockManagerModel(target_cls, target, bounds)
    if component == "infinilm-scheduler":
        return SchedulerModel(target_cls, target, bounds)
    return OffloadModel(component, target_cls, target, bounds)


@dataclass
class Exploration:
    """One ``kvspec explore`` run: one search per variant (the CLI's JSON document)."""

    component: str
    target: str
    runs: list[tuple[str, ExploreResult]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for _, r in self.runs)

    def to_json(self) -> dict[str, Any]:
        results = [r for _, r in self.runs]
        seconds = sum(r.seconds for r in results)
        states = sum(r.distinct_states for r in results)
        bounds = dict(results[0].bounds) if results else {}
        if "variant" in bounds:
            del bounds["variant"]
            bounds["variants"] = [v for v, _ in self.runs]
        violations = [
            {"variant": v or None, **x.to_json()} for v, r in self.runs for x in r.violations
        ]
        return {
            "component": self.component,
            "target": self.target,
            "bounds": bounds,
            "distinct_states": states,
            "distinct_snapshots": sum(r.distinct_snapshots for r in results),
            "edges": sum(r.edges for r in results),
            "max_depth": max((r.max_depth for r in results), default=0),
            "seconds": round(seconds, 3),
            "states_per_second": round(states / seconds) if seconds > 0 else 0,
            "complete": bool(results) and all(r.complete for r in results),
            "violations": violations,
            "runs": [{"variant": v or None, **r.to_json()} for v, r in self.runs],
        }


def run(
    component: str,
    target_cls: Callable[..., Any],
    target: str,
    *,
    variant_names: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    depth: int | None = None,
    max_states: int | None = 1_000_000,
    deadline: float | None = None,
    progress: Callable[[str, int, int, int], None] | None = None,
    save_dir: Path | None = None,
) -> Exploration:
    """Explore ``component`` against ``target_cls`` for each variant (all by default), stopping
    after the first variant that fails."""
    out = Exploration(component, target)
    names = list(variant_names) if variant_names else list(variants(component))
    models = [
        (
            v,
            make_model(
                component, target_cls, target, default_bounds(component, v, **(overrides or {}))
            ),
        )
        for v in names
    ]
    for v, model in models:
        report = None if progress is None else (lambda s, e, d, v=v: progress(v, s, e, d))
        result = explore(
            model,
            depth=depth,
            max_states=max_states,
            deadline=deadline,
            progress=report,
            save_dir=save_dir,
        )
        out.runs.append((v, result))
        if not result.passed or (deadline is not None and time.perf_counter() > deadline):
            break
    return out


def mutant_bounds(m: Any) -> tuple[list[str], dict[str, Any]]:
    """The variants and bound overrides that put a planted bug in its configuration."""
    component = m.component
    if component == "infinilm-scheduler":
        names = [m.variant] if m.variant else list(variants(component))
        return names, ({"connector": True} if m.connector else {})
    variant = getattr(m, "variant", None)
    if variant in variants(component):
        return [variant], {}
    return list(variants(component)), {}


def explore_mutant(m: Any, budget: float) -> Any:
    """The kill-matrix checker (``kvspec mutants``): explore the mutant's component at the
    default bounds within ``budget`` seconds; the repro length is the shortest counterexample's."""
    from kvspec.mutants import Attempt

    if m.component not in BOUNDS:
        return Attempt("explorer", "n/a")
    names, overrides = mutant_bounds(m)
    started = time.perf_counter()
    result = run(
        m.component,
        m.cls,
        f"mutant:{m.name}",
        variant_names=names,
        overrides=overrides,
        deadline=started + budget,
    )
    seconds = time.perf_counter() - started
    for _, r in result.runs:
        if r.violations:
            v = r.violations[0]
            return Attempt("explorer", "killed", seconds, v.depth, v.check)
    return Attempt("explorer", "survived", seconds)


VERIFY_SCOPES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("infinilm-block-manager", {"pages": 2, "vocab": 2, "tables": 1, "tokens": 2}),
    ("infinilm-scheduler", {"pages": 3, "requests": 2, "prompt_tokens": 2, "max_new": 2}),
    ("vllm-arc", {"capacity": 2, "keys": 3}),
    ("vllm-lru", {"capacity": 2, "keys": 3}),
)


def verify_stage() -> tuple[str, str]:
    """``kvspec verify``'s explorer stage: impl against spec, every component at a small scope
    explored completely (a few seconds). Returns ``(status, summary)``."""
    from kvspec.targets import TargetError, load_target

    parts: list[str] = []
    for component, overrides in VERIFY_SCOPES:
        try:
            label, cls = load_target(component, "impl")
        except TargetError:
            label, cls = "impl", builtin_target(component, "impl")
        result = run(component, cls, label, overrides=overrides, max_states=200_000)
        doc = result.to_json()
        if not result.passed:
            v = doc["violations"][0]
            return "fail", f"{component}: {v['check']} after {v['depth']} calls: {v['detail']}"
        if not doc["complete"]:
            return (
                "fail",
                f"{component}: the small scope did not complete ({doc['runs'][-1]['message']})",
            )
        parts.append(f"{component} {doc['distinct_states']:,} states")
    return "pass", "complete, no violation: " + ", ".join(parts)


def builtin_target(component: str, name: str) -> Callable[..., Any]:
    """``impl`` / ``spec`` for the offload components until ``kvspec.targets`` knows them."""
    if component in ("vllm-arc", "vllm-lru") and name in ("impl", "spec"):
        from impl.vllm.offload_manager import CPUOffloadingManager as Impl
        from spec.vllm.offload_manager import CPUOffloadingManager as Spec

        return Impl if name == "impl" else Spec
    raise ValueError(f"no built-in target {name!r} for {component}")
