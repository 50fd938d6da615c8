"""One process's share of a search: pairs, the transition memo and read-only batches.

An :class:`Expander` expands explored states. A state is a *pair* (a spec object and the target
object paired with it, identified by :meth:`Model.pair_key`) and the generator model ``gen``.

* **Pairs and the transition memo.** A pair's key covers the whole state of both objects (for
  the block manager: snapshot, set tables, the prefix-index dict order, hidden counters), and
  both sides are deterministic functions of their object state, so the verdict and the successor
  of a call depend only on (pair, call). A model with ``memo = True`` remembers them: a state
  that shares its pair with an explored one (same objects, another generator model) has its
  calls judged once, not once per state. Objects are kept only for the frontier; a remembered
  successor that is a new state is rebuilt by running the call again (:meth:`materialize`).
* **Read-only batches.** Queries and rejected inputs run one after the other on one copy of the
  target with the outcome comparisons and hidden-state checks after each; the snapshots and pair
  keys are compared once at the end. The spec's outcomes come from one copy of the spec, or, for
  a model whose spec answers them from its snapshot alone (``spec_readonly_by_snapshot``), from
  a table per snapshot filled the first time. Anything unexpected (a difference, a "bad" input
  the spec accepts, a side that moved) re-decides the whole batch call by call on the original
  per-edge procedure, so verdicts and counterexamples are the same as without batching.
* **Generator models as small ints.** Every generator model is interned once (``gens``, its hash
  in ``gen_hash``); a state is (pair id, gen id), one int in the visited set.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable
from time import perf_counter
from typing import Any

from spec.errors import KvspecError
from stateful_tests.lockstep import (
    Check,
    Outcome,
    atomic_failure_check,
    compare_outcomes,
    compare_snapshots,
)

SELF = -1  # memo: a self-loop (neither the pair nor the generator model changes)
DROP = -2  # memo: a "bad" input the spec accepted (compared, not followed)
SELF_HIT = (SELF, None, False)

# Seconds spent inside the spec's and the target's own methods in this process (the explorer's
# floor: what is left of a search if its bookkeeping cost nothing). One accumulator per
# process; a search reads it before and after (forked workers inherit the parent's value and
# report their own difference).
CALL_CLOCK = [0.0]

# (edge index, pair id, gen id, objects or None)
Successor = tuple[int, int, int, tuple[Any, Any, Any] | None]
Found = tuple[list[int], Check]  # (edge indices from the expanded state, the failed check)


class Expander:
    """Expands states of one model; keeps the pairs, their fingerprints and the memo."""

    def __init__(
        self, model: Any, *, well_formed: bool, memo: bool, memo_cap: int = 3_000_000
    ) -> None:
        self.model = model
        self.run_cls = _Run
        self.dup: Callable[[Any], Any] = model.clone
        self.well_formed = well_formed
        self.use_memo = memo and model.memo
        self.memo_cap = memo_cap
        self.pair_ids: dict[int, int] = {}  # fingerprint of a pair key -> pair id
        self.pair_fps: list[int] = []  # pair id -> fingerprint (portable across forked workers)
        self.objects: dict[int, tuple[Any, Any, Any]] = {}  # pair id -> (spec, target, snapshot)
        # pair id << 32 | call -> (successor pair or SELF/DROP, the spec's return value, raised)
        self.memo: dict[int, tuple[int, Any, bool]] = {}
        # generator models, interned: gen id -> model, its hash; model -> gen id
        self.gens: list[Any] = []
        self.gen_hash: list[int] = []
        self.gen_ids: dict[Any, int] = {}
        self.edge_cache: dict[Hashable, tuple[list[Any], list[tuple[int, Any, int]]]] = {}
        # the spec's outcomes of read-only calls, per snapshot fingerprint (models whose spec
        # answers them from its snapshot alone: ``Model.spec_readonly_by_snapshot``)
        self.by_snapshot = bool(getattr(model, "spec_readonly_by_snapshot", False))
        self.spec_answers: dict[int, dict[int, Any]] = {}
        # one Outcome object per distinct answer (most snapshots answer a query alike, and an
        # exception with its message is most of a remembered answer's memory)
        self.outcomes: dict[Hashable, Outcome] = {}
        # snapshot fingerprint -> pair id, for models whose pair key is a function of the snapshot
        # (``Model.key_from_snapshot``: offload's renaming of keys is computed once per snapshot)
        self.by_snap: dict[int, int] | None = {} if model.key_from_snapshot else None
        self.checked: set[int] = set()  # snapshots whose state invariants hold
        # a model's pair key from the snapshot's hash (``Model.pair_key_hashed``), if it has one
        self.hashed_key: Callable[[int, Any, Any], Hashable] | None = getattr(
            model, "pair_key_hashed", None
        )
        self.last_hash = 0  # hash(run.after) of the last judged run (judge)
        self.edges = self.executed = self.dropped = self.expanded = 0
        # the operations some expanded state offered (the scope report's reached rows)
        self.methods: set[str] = set()

    # ------------------------------------------------------------------ pairs
    def pair(self, spec: Any, target: Any, snap: Any, snap_hash: int | None = None) -> int:
        """The pair's id (``snap_hash``: ``hash(snap)``, where the caller has it already)."""
        if self.by_snap is not None:  # the key is a function of the snapshot: skip making it
            raw = hash(snap) if snap_hash is None else snap_hash
            found = self.by_snap.get(raw)
            if found is not None:
                return found
        hashed = self.hashed_key
        if hashed is not None:
            fp = hash(hashed(hash(snap) if snap_hash is None else snap_hash, spec, target))
        else:
            fp = hash(self.model.pair_key(snap, spec, target))
        pid = self.pair_ids.get(fp)
        if pid is None:
            pid = self.pair_ids[fp] = len(self.pair_fps)
            self.pair_fps.append(fp)
        if self.by_snap is not None:
            self.by_snap[raw] = pid
        return pid

    def gid(self, gen: Any) -> int:
        """The generator model's small int (interned on first sight)."""
        found = self.gen_ids.get(gen)
        if found is None:
            found = self.gen_ids[gen] = len(self.gens)
            self.gens.append(gen)
            self.gen_hash.append(hash(gen))
        return found

    def fingerprint(self, pid: int, gid: int) -> int:
        """A state's 64-bit fingerprint, equal in every forked worker (pair and gen hashes)."""
        return hash((self.pair_fps[pid], self.gen_hash[gid]))

    def keep(self, pid: int, objects: tuple[Any, Any, Any]) -> None:
        self.objects.setdefault(pid, objects)

    def retain(self, pids: set[int]) -> None:
        """Drop the objects of every pair no frontier state refers to (memory stays frontier-sized);
        the memo is a cache: cleared past its cap."""
        self.objects = {p: o for p, o in self.objects.items() if p in pids}
        if len(self.memo) > self.memo_cap:
            self.memo.clear()
        if len(self.edge_cache) > 200_000:
            self.edge_cache.clear()
        if len(self.spec_answers) > 200_000:
            self.spec_answers.clear()
            self.outcomes.clear()
        if self.by_snap is not None and len(self.by_snap) > 2_000_000:
            self.by_snap.clear()

    # ------------------------------------------------------------------ checks
    def judge(self, edge: Any, snap: Any, run: Any) -> Check | None:
        """The edge's lockstep verdict, the state invariants of a snapshot not checked before (the
        target's equals the spec's by then), then the target's hidden state."""
        problem: Check | None = run.problem
        if problem is None:
            h = self.last_hash = hash(run.after)
            if h not in self.checked:
                problem = _state_invariants(self.model, run.after)
                self.checked.add(h)
        if problem is None:
            problem = self.model.edge_checks(edge, snap, run.after, run.s_out, run.target, run.gen)
        return problem

    def _edges(self, snap: Any, gen: Any, spec: Any) -> list[Any]:
        return self._plan(snap, gen, spec)[0]

    def _rows(self, snap: Any, gen: Any, spec: Any) -> list[tuple[int, Any, int]]:
        """The edges a state runs: (index in the full list, edge, its memo ident)."""
        return self._plan(snap, gen, spec)[1]

    def _plan(self, snap: Any, gen: Any, spec: Any) -> tuple[list[Any], list[tuple[int, Any, int]]]:
        model = self.model
        if model.edges_from_snapshot:
            key = model.observable(snap, gen)
            found = self.edge_cache.get(key)
            if found is not None:
                return found
        edges = list(model.edges(snap, gen, lambda: self.dup(spec)))
        skip = self.well_formed  # bad edges skipped, not removed: a path indexes the full list
        keyed = self.use_memo or self.by_snapshot  # (an ident costs a table look-up)
        rows = [
            (i, e, e.ident if keyed else -1) for i, e in enumerate(edges) if not (skip and e.bad)
        ]
        self.methods.update(e.method for _, e, _ in rows)
        if model.edges_from_snapshot:
            self.edge_cache[key] = (edges, rows)
        return edges, rows

    # ------------------------------------------------------------------ expansion
    def expand(
        self, pid: int, gid: int, last: bool = False
    ) -> tuple[list[Successor], Found | None]:
        """Every successor of state (pair ``pid``, gen id ``gid``), or the first failed check.

        ``last``: no other state will use this pair's objects (the caller's frontier holds it
        once, and it is not kept for a memo): without a memo, the last call runs on the objects
        themselves instead of on copies, and the pair's objects are dropped."""
        spec_p, target_p, snap = self.objects[pid]
        gen = self.gens[gid]
        # (read per state: a model may find out mid-search that its key is not whole-state)
        memo = self.memo if self.use_memo and self.model.memo else None
        self.expanded += 1
        if not self.expanded & 1023:
            # The search runs with the collector off (a full collection would rescan the visited
            # tables and the memo); raised exceptions lose their tracebacks (_call), so cycles
            # are rare and young: collecting the young generation now and then frees them.
            gc.collect(0)
        rows = self._rows(snap, gen, spec_p)
        self.edges += len(rows)
        out: list[Successor] = []
        readonly: list[tuple[int, Any, int]] = []
        mutating: list[tuple[int, Any, int]] = []
        if memo is None:
            for row in rows:
                (readonly if row[1].readonly else mutating).append(row)
        else:
            get, base, intern = memo.get, pid << 32, self.gid
            for row in rows:
                hit = get(base | row[2])
                if hit is None:
                    (readonly if row[1].readonly else mutating).append(row)
                    continue
                succ = hit[0]
                if succ < 0:  # SELF or DROP
                    if succ == DROP:
                        self.dropped += 1
                    continue
                then = row[1].then
                if hit[2] or then is None:
                    out.append((row[0], succ, gid, None))
                else:  # (the row's own edge: one call may update two holders differently)
                    out.append((row[0], succ, intern(then(gen, hit[1])), None))
        # The working copies (``None``: not made yet). Lazy cloning (memo models only): every call
        # runs on them; they are copied afresh only after a call moved them (they become that
        # successor's objects). A self-loop leaves them with the pair key they started with — the
        # whole state of both sides — so they are as good as new. Without a whole-state key, every
        # call gets fresh copies.
        ws: Any = None
        wt: Any = None
        if readonly:
            wt = self.dup(target_p)
            ok, ws = self._batch(pid, gen, readonly, memo, wt)
            if not ok:
                ws = wt = None
                found = self._exact_readonly(pid, gid, readonly, out)
                if found is not None:
                    return out, found
        reuse = self.model.memo
        run_cls, dup, model = self.run_cls, self.dup, self.model
        final = mutating[-1][0] if last and memo is None and not reuse and mutating else -1
        # Without a whole-state pair key, copies serve a next call only after a self-loop that
        # left both sides' snapshots and everything else (``Model.hidden``) as they were.
        hidden = None if reuse else model.hidden
        before: tuple[Any, Any] | None = None
        unmoved = False
        for index, edge, ident in mutating:
            if index == final:  # the last use of the pair's objects: no copies
                ws, wt = spec_p, target_p
                self.objects.pop(pid, None)
            else:
                if ws is None or not (reuse or unmoved):
                    ws = dup(spec_p)
                if wt is None or not (reuse or unmoved):
                    wt = dup(target_p)
            unmoved = False
            run = run_cls(model, edge, ws, wt, snap, gen)
            self.executed += 1
            problem = self.judge(edge, snap, run)
            if problem is not None:
                return out, ([index], problem)
            raised = run.s_out.raised is not None
            if edge.bad and not raised:
                self.dropped += 1
                if memo is not None:
                    memo[pid << 32 | ident] = (DROP, None, False)
                ws = wt = None
                continue
            if not reuse and run.after == snap and run.gen == gen:
                # a self-loop by the snapshot (the target was compared; nothing new)
                if hidden is not None and index != final:
                    if before is None:
                        before = (hidden(spec_p), hidden(target_p))
                    unmoved = (
                        before[0] is not None
                        and before[1] is not None
                        and hidden(ws) == before[0]
                        and hidden(wt) == before[1]
                    )
                continue
            succ = self.pair(ws, wt, run.after, self.last_hash)
            fixed = raised or edge.then is None  # the generator model stays as it is
            g = gid if fixed or run.gen is gen else self.gid(run.gen)
            if memo is not None:
                memo[pid << 32 | ident] = (
                    SELF if succ == pid and fixed else succ,
                    None if fixed else run.s_out.returned,
                    raised,
                )
            if succ != pid or not reuse:
                if succ != pid or g != gid:
                    out.append((index, succ, g, (ws, wt, run.after)))
                ws = wt = None
            elif g != gid:
                out.append((index, succ, g, None))  # the pair's own objects serve
        return out, None

    def _batch(
        self,
        pid: int,
        gen: Any,
        edges: list[tuple[int, Any, int]],
        memo: dict[int, tuple[int, Any, bool]] | None,
        target: Any,
    ) -> tuple[bool, Any]:
        """The read-only calls on the target's working copy, each compared with the spec's
        outcome: remembered per snapshot where the model says the spec's read-only answers depend
        on its snapshot alone (``spec_readonly_by_snapshot``), else run on a working copy of the
        spec. ``(False, None)`` if any call needs the exact path; else ``(True, spec copy or
        None)``."""
        model = self.model
        spec_p, _, snap = self.objects[pid]
        answers: dict[int, Any] | None = None
        fresh: dict[int, Any] = {}
        if self.by_snapshot:
            sfp = hash(snap)
            answers = self.spec_answers.get(sfp)
        spec: Any = None
        edge_checks = model.edge_checks
        for _, edge, ident in edges:
            self.executed += 1
            s_out = None if answers is None else answers.get(ident)
            if s_out is None:
                if spec is None:
                    spec = self.dup(spec_p)
                t0 = perf_counter()
                s_out = fresh[ident] = _call(spec, edge)
                CALL_CLOCK[0] += perf_counter() - t0
            s_exc = s_out.raised
            if edge.bad and s_exc is None:
                return False, None  # a bad input the spec accepted: the exact path follows it
            # the target's call, compared without an Outcome where it agrees in the cheap way
            # (same exception class, or an equal return value; list arguments alike after)
            t0 = perf_counter()
            if edge.lists:
                args = [list(a) if type(a) is list else a for a in edge.args]
                try:
                    returned = getattr(target, edge.method)(*args)
                    raised = None
                except Exception as exc:
                    exc.__traceback__ = None
                    returned, raised = None, exc
                after = [a for a in args if type(a) is list]
            else:
                try:
                    returned = getattr(target, edge.method)(*edge.args)
                    raised = None
                except Exception as exc:
                    exc.__traceback__ = None
                    returned, raised = None, exc
                after = []
            CALL_CLOCK[0] += perf_counter() - t0
            if (
                (type(raised) is not type(s_exc) if s_exc is not None else raised is not None)
                or (s_exc is None and returned != s_out.returned)
                or after != s_out.args_after
            ) and compare_outcomes(s_out, Outcome(returned, raised, after), model.role) is not None:
                return False, None
            if edge_checks(edge, snap, snap, s_out, target, gen) is not None:
                return False, None
        reader = model.reader
        if reader(target) != snap or (spec is not None and reader(spec) != snap):
            return False, None
        # with the memo the copies go on serving: they must still be the pair, hidden state and all
        if model.memo and (
            hash(model.pair_key(snap, spec_p if spec is None else spec, target))
            != self.pair_fps[pid]
        ):
            return False, None
        if self.by_snapshot and fresh:
            if answers is None:
                answers = self.spec_answers[sfp] = {}
            one = self.outcomes.setdefault
            for ident, out in fresh.items():
                answers[ident] = one(_answer_key(out), out)
        if memo is not None:
            base = pid << 32
            for row in edges:
                memo[base | row[2]] = SELF_HIT
        return True, spec

    def _exact_readonly(
        self, pid: int, gid: int, edges: list[tuple[int, Any, int]], out: list[Successor]
    ) -> Found | None:
        """The per-edge procedure for read-only calls: one shared copy of each side while calls
        leave them as they were; ``history`` is the calls the shared target has seen (a failure
        that only reproduces after them keeps them in the counterexample)."""
        model, run_cls, dup = self.model, self.run_cls, self.dup
        spec_p, target_p, snap = self.objects[pid]
        gen = self.gens[gid]
        shared: list[Any] = []
        history: list[int] = []
        for index, edge, _ in edges:
            if not shared:
                shared[:] = [dup(spec_p), dup(target_p)]
                history.clear()
            run = run_cls(model, edge, shared[0], shared[1], snap, gen)
            self.executed += 1
            problem = self.judge(edge, snap, run)
            extra: list[int] = []
            if problem is not None or run.after != snap or run.gen is not gen:
                if history:  # the shared target saw earlier read-only calls: decide afresh
                    fresh = run_cls(model, edge, dup(spec_p), dup(target_p), snap, gen)
                    fresh_problem = self.judge(edge, snap, fresh)
                    if problem is not None and fresh_problem is None:
                        extra = list(history)  # reproducible only after those calls
                    else:
                        run, problem = fresh, fresh_problem
                shared.clear()  # that copy has moved on (or the search stops here)
            if problem is not None:
                return [*extra, index], problem
            if shared:
                history.append(index)
                continue  # a self-loop: the shared copies stay usable
            if edge.bad and run.s_out.raised is None:
                self.dropped += 1  # the spec accepted a "bad" input: not followed
                continue
            succ = self.pair(run.spec, run.target, run.after)
            out.append((index, succ, self.gid(run.gen), (run.spec, run.target, run.after)))
        return None

    def materialize(self, pid: int, gid: int, index: int) -> tuple[Any, Any, Any]:
        """The objects of the successor of (``pid``, gen id ``gid``) by edge ``index`` — a
        remembered transition whose objects were dropped — by running the call again on copies."""
        spec_p, target_p, snap = self.objects[pid]
        gen = self.gens[gid]
        edge = self._edges(snap, gen, spec_p)[index]
        run = self.run_cls(self.model, edge, self.dup(spec_p), self.dup(target_p), snap, gen)
        self.executed += 1
        return run.spec, run.target, run.after


class _Run:
    """One edge applied in lockstep: outcomes, snapshots, the first failed check (Lockstep's own
    comparisons, in Lockstep's order)."""

    __slots__ = ("after", "gen", "problem", "s_out", "spec", "t_out", "target")

    def __init__(self, model: Any, edge: Any, spec: Any, target: Any, snap: Any, gen: Any):
        self.spec, self.target, self.gen = spec, target, gen
        t0 = perf_counter()
        self.s_out = s_out = _call(spec, edge)
        self.t_out = t_out = _call(target, edge)
        CALL_CLOCK[0] += perf_counter() - t0
        self.after = None
        s_exc, t_exc = s_out.raised, t_out.raised
        # the cheap agreement first (one exception class, or equal values): compare_outcomes only
        # where it may find a difference
        if (
            (type(s_exc) is type(t_exc) if s_exc is not None else t_exc is None)
            and (s_exc is not None or s_out.returned == t_out.returned)
            and s_out.args_after == t_out.args_after
        ):
            problem = None
        else:
            problem = compare_outcomes(s_out, t_out, model.role)
        if problem is None:
            reader = model.reader
            raised = s_out.raised
            # a read-only call leaves the spec as it was (by the spec's contract) unless it is a
            # "bad" input the spec accepted: only then is the spec read again
            if edge.readonly and (raised is not None or not edge.bad):
                self.after = after = snap
            else:
                self.after = after = reader(spec)
            target_snap = reader(target)
            if target_snap != after:
                problem = compare_snapshots(after, target_snap, model.snapshot_checks, model.role)
            if (
                problem is None
                and raised is not None
                and model.validate_first(edge.method, raised)
                and (model.role == "spec" or isinstance(raised, KvspecError))  # (lockstep.py)
            ):
                problem = atomic_failure_check(edge.method, raised, snap, target_snap)
            if problem is None and raised is None and edge.then is not None:
                self.gen = edge.then(gen, s_out.returned)
        self.problem = problem


def _freeze(value: Any) -> Any:
    """``value`` as a hashable value (lists and tuples as tagged tuples, recursively)."""
    t = type(value)
    if t is list or t is tuple:
        return (t is list, tuple(_freeze(v) for v in value))
    if t is dict:
        return (dict, tuple((k, _freeze(v)) for k, v in value.items()))
    return value


def _answer_key(out: Outcome) -> Hashable:
    """What every comparison reads of a spec outcome (the exception's class and text, the
    returned value, the list arguments after), as one hashable value: outcomes with one key are
    interchangeable."""
    exc = out.raised
    return (
        None if exc is None else (type(exc), str(exc), repr(exc.args)),
        type(out.returned),
        repr(out.returned),  # (repr, not ==: True and 1 are equal and stay apart here)
        repr(out.args_after),
    )


def _state_invariants(model: Any, target_snap: Any) -> Check | None:
    for name, predicate in model.state_invariants.items():
        problem = predicate(target_snap)
        if problem:
            return name, problem
    return None


def _call(obj: Any, edge: Any) -> Outcome:
    """``lockstep.invoke`` for an edge: private copies of its list arguments (only when it has
    any), and the exception without its traceback — the frames it holds (and the copies they
    reference) would otherwise wait for the cycle collector; verdicts read only the exception."""
    if edge.lists:
        args = [list(a) if type(a) is list else a for a in edge.args]
        try:
            returned = getattr(obj, edge.method)(*args)
        except Exception as exc:
            exc.__traceback__ = None
            return Outcome(None, exc, [a for a in args if type(a) is list])
        return Outcome(returned, None, [a for a in args if type(a) is list])
    try:
        return Outcome(getattr(obj, edge.method)(*edge.args), None, [])
    except Exception as exc:
        exc.__traceback__ = None
        return Outcome(None, exc, [])


def peak_mb() -> float:
    """This process's own peak resident memory in MB: ``VmHWM`` where Linux reports it (the high
    water mark of this address space), else ``ru_maxrss``. Not ``ru_maxrss`` on Linux: it carries
    the parent's peak across fork and exec, so a child started by a big process would report its
    parent's figure."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return float(own) / (1 << 20 if sys.platform == "darwin" else 1 << 10)


def rss_mb() -> float:
    """This process's resident memory now, in MB (``/proc/self/statm``; the peak where Linux has
    no such file)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return peak_mb()
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
