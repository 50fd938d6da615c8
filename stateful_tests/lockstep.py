"""Generic lockstep harness: one call, applied to the spec and to a target, compared in full.

Every checker (hypothesis machine, seeded fuzzer, replay, later the explorer) drives components
through :class:`Lockstep`, so "equivalent" means the same thing everywhere: after the same call,
the same return value (or the same exception kind), the same in-place mutation of list arguments,
and the same ``snapshot``; state invariants hold on the target; a validate-first operation that
raised changed nothing (``atomic_failure``).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

from spec.errors import KvspecError, exception_kind

T = TypeVar("T")

TRACE_FORMAT = "kvspec-trace/1"


def encode(value: Any) -> Any:
    """A JSON-able, comparable form of a call argument or result (bytes as ``{"bytes": hex}``)."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple) or type(value).__name__ == "deque":
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(encode(v) for v in value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def decode(value: Any) -> Any:
    """Inverse of :func:`encode` for the argument shapes traces hold."""
    if isinstance(value, dict) and set(value) == {"bytes"}:
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


@dataclass(slots=True)
class Outcome:
    """What one side did for one call."""

    returned: Any = None
    raised: BaseException | None = None
    args_after: list[Any] = field(default_factory=list)  # list arguments after the call

    def describe(self) -> str:
        if self.raised is not None:
            return f"raise {type(self.raised).__name__}({self.raised})"
        return json.dumps(encode(self.returned))


@dataclass(slots=True)
class Step:
    """One call of a trace, with both sides' outcomes and the holders the driver knew after it."""

    method: str
    args: list[Any]
    spec: Outcome
    target: Outcome
    holders: Sequence[Sequence[int]] | None = None
    op: str | None = None  # the operation (row of the operations table) that made the call
    bad: bool = False  # made by a bad-input operation (``--inputs well-formed`` leaves it out)

    def call_text(self) -> str:
        return f"{self.method}({', '.join(json.dumps(encode(a)) for a in self.args)})"


class TargetMisfit(Exception):
    """The target cannot be driven at all: its constructor rejects the component's arguments, or
    kvspec's reading code cannot read its state (a missing attribute). Not a divergence: the
    command says so in one line (exit status 2)."""


class CallTimeout(BaseException):
    """A target call ran past the watchdog (a ``BaseException``: it must not be recorded as the
    call's own exception)."""


_WATCHDOG: list[float] = []  # the per-call limit in seconds, while a watchdog is installed
# When the guarded region now running started (``time.monotonic()``), 0.0 outside one. One periodic
# timer reads it (instead of arming and disarming a timer around every call: two system calls and
# a context manager per region were a large share of a fuzzer call).
_REGION = [0.0]


@contextmanager
def call_timeout(seconds: float | None) -> Iterator[None]:
    """Run target calls under a watchdog: a call (or a read of the target's state) that does not
    return within ``seconds`` becomes a ``hang`` divergence instead of a hung checker. Needs the
    main thread and ``SIGALRM``; elsewhere (or with ``None``/0) calls run unguarded.

    One periodic timer ticks every ``seconds / 4``; a tick raises :class:`CallTimeout` when a
    guarded region has run for more than ``seconds``, so a hang is reported after between
    ``seconds`` and ``1.25 * seconds``."""
    usable = (
        seconds
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and not _WATCHDOG
    )
    if not usable:
        yield
        return
    limit = float(seconds)  # type: ignore[arg-type]

    def tick(signum: int, frame: Any) -> None:
        started = _REGION[0]
        # (the region stays marked: a target that swallows the exception gets it again)
        if started and time.monotonic() - started > limit:
            raise CallTimeout(limit)

    old = signal.signal(signal.SIGALRM, tick)
    _WATCHDOG.append(limit)
    _REGION[0] = 0.0
    signal.setitimer(signal.ITIMER_REAL, limit / 4, limit / 4)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _WATCHDOG.clear()
        _REGION[0] = 0.0
        signal.signal(signal.SIGALRM, old)


@contextmanager
def _guarded() -> Iterator[None]:
    """A guarded region (see :func:`call_timeout`); the hot path inlines the same two stores."""
    if not _WATCHDOG:
        yield
        return
    _REGION[0] = time.monotonic()
    try:
        yield
    finally:
        _REGION[0] = 0.0


class Divergence(AssertionError):
    """The target disagreed with the spec, or an invariant failed. ``check`` names which."""

    def __init__(self, check: str, detail: str, steps: Sequence[Step]) -> None:
        super().__init__(f"{check}: {detail} (at step {len(steps)})")
        self.check = check
        self.detail = detail
        self.steps = list(steps)


def same_exception(a: BaseException, b: BaseException) -> bool:
    """Equal kinds; and the same class when both are kvspec's own exceptions."""
    if isinstance(a, KvspecError) and isinstance(b, KvspecError):
        return type(a) is type(b)
    return exception_kind(a) == exception_kind(b)


Check = tuple[str, str]
"""A failed check: (check name, detail)."""


def invoke(obj: Any, method: str, args: Sequence[Any]) -> Outcome:
    """Call ``obj.method(*args)`` on private copies of the list arguments; what happened."""
    lists: list[Any] = []
    call_args = list(args)
    # each side gets its own lists: append_slot/append_slots mutate the caller's table in place
    for i, a in enumerate(call_args):
        if isinstance(a, list):
            call_args[i] = a = list(a)
            lists.append(a)
    try:
        returned = getattr(obj, method)(*call_args)
        raised = None
    except Exception as exc:  # both sides' exceptions are data to compare
        # kept without its traceback: only its kind and message are compared and recorded, and
        # the traceback's frames (this one, the caller's, ...) would tie every outcome of a run
        # into one reference cycle that only a garbage collection frees
        returned, raised = None, exc.with_traceback(None)
    return Outcome(returned, raised, lists)


def compare_outcomes(spec_out: Outcome, target_out: Outcome, role: str = "spec") -> Check | None:
    """The per-call comparison: exception kind, return value, in-place mutation of list
    arguments (in that order; the first difference is the verdict). ``role``: how the detail
    names the reference side (spec, baseline, copy)."""
    s_exc, t_exc = spec_out.raised, target_out.raised
    if (s_exc is None) != (t_exc is None) or (
        s_exc is not None and t_exc is not None and not same_exception(s_exc, t_exc)
    ):
        return "exception", f"{role}: {spec_out.describe()}; target: {target_out.describe()}"
    # raw equality first (cheap); encode() only to forgive tuple-vs-list style differences
    if (
        s_exc is None
        and spec_out.returned != target_out.returned
        and encode(spec_out.returned) != encode(target_out.returned)
    ):
        return "return_value", f"{role}: {spec_out.describe()}; target: {target_out.describe()}"
    if spec_out.args_after != target_out.args_after and encode(spec_out.args_after) != encode(
        target_out.args_after
    ):
        return (
            "argument_mutation",
            f"list arguments after the call: {role} {spec_out.args_after} vs target "
            f"{target_out.args_after}",
        )
    return None


def compare_snapshots(
    spec_snap: Any, target_snap: Any, snapshot_checks: Mapping[str, str], role: str = "spec"
) -> Check | None:
    """Equal snapshots, or the check named by the first differing field in ``snapshot_checks``
    (``snapshot`` otherwise) with every differing field in the detail."""
    if target_snap == spec_snap:
        return None
    fields = spec_snap.differing_fields(target_snap)
    check = next((snapshot_checks[f] for f in fields if f in snapshot_checks), "snapshot")
    diffs = "; ".join(
        f"{f}: {role} {getattr(spec_snap, f)!r} vs target {getattr(target_snap, f)!r}"
        for f in fields
    )
    return check, diffs


CRASHES = (TypeError, AttributeError, NameError, IndexError, ZeroDivisionError, RecursionError)
"""Exceptions that are a program's own fault, never a rejection of its input: raised by a call of
a well-formed operation, they are a ``crash`` even where nothing tells what the call should have
done (the invariants oracle; a baseline that crashes alike)."""


def crash_check(method: str, raised: BaseException | None, role: str) -> Check | None:
    """``crash``: a well-formed call raised one of :data:`CRASHES` (``role``: the reference
    side, named when it crashed the same way)."""
    if raised is None or not isinstance(raised, CRASHES):
        return None
    alike = {"baseline": " (the baseline crashes alike)", "copy": ""}.get(role, "")
    return "crash", f"{method} raised {type(raised).__name__}({raised}) on well-formed input{alike}"


def atomic_failure_check(
    method: str, raised: BaseException, before: Any, target_snap: Any
) -> Check | None:
    """``atomic_failure``: a validate-first call that raised left the snapshot as it was."""
    if target_snap == before:
        return None
    return (
        "atomic_failure",
        f"{method} raised {type(raised).__name__} but changed "
        f"{before.differing_fields(target_snap)}",
    )


class Verdicts:
    """The state keys on which every state invariant of one checker held: a memo of their
    verdicts, shared by the drivers of that checker (and variant).

    Sound because state invariants are pure functions of one snapshot: an equal key gets the same
    verdict, so only the lookup is skipped, never a check. ``key`` picks the part of the snapshot
    the invariants read (the whole snapshot by default). Only passes are remembered (a failure
    is re-run so that it reports its own message); at ``limit`` keys the memo starts afresh."""

    def __init__(self, key: Callable[[Any], Any] | None = None, limit: int = 50_000) -> None:
        self.key = key
        self.limit = limit
        self.passed: set[Any] = set()

    def add(self, key: Any) -> None:
        if len(self.passed) >= self.limit:
            self.passed.clear()
        self.passed.add(key)


class Lockstep:
    """Drives ``spec`` and ``target`` with the same calls and compares everything observable.

    ``verdicts``: a memo of the state invariants' passes (:class:`Verdicts`), for checkers whose
    invariants are pure predicates of hashable snapshots. ``state_holds``: a verdict-preserving
    shortcut (``True`` only where every state invariant holds; the predicates run otherwise).
    ``spec_reader(spec, method, snapshot before)``: the spec's snapshot after ``method``, read
    only where the spec's own code can have changed it (the target is always read in full).

    ``role``: what the reference side is — ``spec`` (the default), ``baseline`` (another
    implementation: a state invariant that fails holds on its equal snapshot too, and says so;
    a well-formed call that crashes is a ``crash`` even when both crash alike) or ``copy`` (a
    second instance of the target, for the invariants oracle: any difference between the two is
    ``deterministic``, and a crash is a ``crash``)."""

    def __init__(
        self,
        spec: Any,
        target: Any,
        reader: Callable[[Any], Any],
        *,
        state_invariants: Mapping[str, Callable[[Any], str | None]],
        validate_first: Callable[[str, BaseException], bool],
        snapshot_checks: Mapping[str, str] | None = None,
        verdicts: Verdicts | None = None,
        state_holds: Callable[[Any], bool] | None = None,
        spec_reader: Callable[[Any, str, Any], Any] | None = None,
        role: str = "spec",
    ) -> None:
        if role not in ("spec", "baseline", "copy"):
            raise ValueError(f"unknown lockstep role {role!r}")
        self.role = role
        self.spec = spec
        self.target = target
        self.reader = reader
        self.state_invariants = state_invariants
        self._predicates = tuple(state_invariants.items())
        self.validate_first = validate_first
        # snapshot field -> invariant name to report when that field differs
        self.snapshot_checks = dict(snapshot_checks or {})
        self.verdicts = verdicts
        self.state_holds = state_holds
        self.spec_reader = spec_reader
        self.steps: list[Step] = []
        # the operation now running (set by the checker plumbing), recorded in every step it makes
        self.op: str | None = None
        self.bad = False
        self.before = reader(spec)
        self.after = self.before
        try:
            with _guarded():
                first = reader(target)
        except CallTimeout:
            raise self.fail("hang", "reading the new target's state did not return") from None
        except Exception as exc:  # the target lacks what kvspec reads: it cannot be driven
            raise TargetMisfit(
                f"cannot read the target's state: {type(exc).__name__}: {exc}"
            ) from exc
        self.target_after = first  # the target's snapshot after the last call
        self._compare_snapshots(first)  # a difference here is a divergence at step 0
        self.target_after = self.after  # (equal: one object, as after every call)

    def fail(self, check: str, detail: str) -> Divergence:
        return Divergence(check, detail, self.steps)

    def differ(self, check: str, detail: str) -> Divergence:
        """The divergence for a difference between the two sides: the copy of the target
        differing from the target is the target's nondeterminism."""
        if self.role == "copy":
            return self.fail(
                "deterministic",
                f"two instances of the target given the same calls differ ({check}): {detail}",
            )
        return self.fail(check, detail)

    def _read_target(self, method: str) -> Any:
        """The target's snapshot after ``method``; a target that no longer reads (or hangs when
        read) diverged."""
        try:
            if _WATCHDOG:
                _REGION[0] = time.monotonic()
            try:
                return self.reader(self.target)
            finally:
                _REGION[0] = 0.0
        except CallTimeout:
            raise self.fail(
                "hang", f"reading the target's state after {method} did not return"
            ) from None
        except Exception as exc:  # its state no longer has the shape the spec's has
            raise self.fail(
                "snapshot", f"reading the target's state failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _compare_snapshots(self, target_snap: Any) -> None:
        problem = compare_snapshots(self.after, target_snap, self.snapshot_checks, self.role)
        if problem is not None:
            raise self.differ(*problem)

    def call(self, method: str, *args: Any) -> Outcome:
        """Apply ``method(*args)`` to both sides; return the spec's outcome or raise Divergence."""
        spec_out = invoke(self.spec, method, args)
        try:
            if _WATCHDOG:
                _REGION[0] = time.monotonic()
            try:
                target_out = invoke(self.target, method, args)
            finally:
                _REGION[0] = 0.0
        except CallTimeout as exc:
            hung = Outcome(raised=TimeoutError(f"no return within {exc.args[0]} s"))
            self.steps.append(Step(method, list(args), spec_out, hung, op=self.op, bad=self.bad))
            raise self.fail("hang", f"{method} did not return within {exc.args[0]} s") from None
        self.steps.append(Step(method, list(args), spec_out, target_out, op=self.op, bad=self.bad))
        if (
            spec_out.raised is not None
            or target_out.raised is not None
            or spec_out.returned != target_out.returned
            or spec_out.args_after != target_out.args_after
        ):  # (the common case, equal and no exception, without the call)
            problem = compare_outcomes(spec_out, target_out, self.role)
            if problem is not None:
                raise self.differ(*problem)
            if self.role != "spec" and not self.bad:
                problem = crash_check(method, target_out.raised, self.role)
                if problem is not None:
                    raise self.fail(*problem)
        self.before = before = self.after
        spec_reader = self.spec_reader
        self.after = (
            self.reader(self.spec)
            if spec_reader is None
            else spec_reader(self.spec, method, before)
        )
        target_snap = self._read_target(method)
        if target_snap != self.after:
            self._compare_snapshots(target_snap)
        # equal values: keep one, so that later comparisons and memo look-ups meet the same objects
        self.target_after = target_snap = self.after
        s_exc = spec_out.raised
        # The atomicity contract is the spec's, for the errors it validates first; against a
        # baseline it binds only where the baseline raises one of kvspec's error classes (an
        # engine's own RuntimeError promises nothing: InfiniLM's append_slots half-allocates).
        if (
            s_exc is not None
            and self.validate_first(method, s_exc)
            and (self.role == "spec" or isinstance(s_exc, KvspecError))
        ):
            problem = atomic_failure_check(method, s_exc, self.before, target_snap)
            if problem is not None:
                raise self.fail(*problem)
        self.check_state(target_snap)
        return spec_out

    def both(self, violation: str) -> str:
        """An invariant's message, saying that a baseline's equal state violates it too (the
        bug is older than the target's change)."""
        if self.role == "baseline":
            return f"{violation} (the baseline too: its state is the same)"
        return violation

    def check_state(self, snap: Any) -> None:
        """Every state invariant on ``snap``: skipped for a key known to pass them all, confirmed
        by ``state_holds`` where it can, run one by one otherwise (and always before a
        failure is reported, so that it names the predicate)."""
        verdicts = self.verdicts
        key = snap if verdicts is None or verdicts.key is None else verdicts.key(snap)
        if verdicts is not None and key in verdicts.passed:
            return
        if self.state_holds is None or not self.state_holds(snap):
            for name, predicate in self._predicates:
                violation = predicate(snap)
                if violation:
                    raise self.fail(name, self.both(violation))
        if verdicts is not None:
            verdicts.add(key)


# ----------------------------------------------------------------------------- draws
class Chooser(Protocol):
    def int(self, lo: int, hi: int) -> int: ...
    def pick(self, items: Sequence[T]) -> T: ...
    def chance(self, p: float) -> bool: ...


class RandomChooser:
    """Seeded draws for the fuzzer.

    ``int`` and ``pick`` are ``randint`` and ``randrange`` minus their argument checks: for a
    non-empty integer range both are ``lo + _randbelow(width)`` in CPython, so the draws (and
    every seed's programs) are the same; anything else takes the checked path and its error."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        below = getattr(rng, "_randbelow", None)
        self._below: Callable[[int], int] = below if callable(below) else rng.randrange

    def int(self, lo: int, hi: int) -> int:
        if hi >= lo:
            return lo + self._below(hi - lo + 1)
        return self.rng.randint(lo, hi)

    def pick(self, items: Sequence[T]) -> T:
        if items:
            return items[self._below(len(items))]
        return items[self.rng.randrange(len(items))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class DataChooser:
    """Draws through hypothesis ``st.data()`` so failures shrink."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def pick(self, items: Sequence[T]) -> T:
        return items[self.data.draw(st.integers(0, len(items) - 1))]

    def chance(self, p: float) -> bool:
        # index 0 (shrink target) = False: shrinking removes the biased branch first
        # a small range draws close to uniformly (a wide one is skewed towards small values)
        return self.data.draw(st.integers(0, 19)) >= 20 - round(p * 20)


@dataclass
class RunResult:
    """Outcome of ``check``, ``fuzz`` or ``replay``: the fields of the CLI's JSON documents."""

    target: str
    passed: bool
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    coverage: dict[str, int] = field(default_factory=dict)
    failure: Divergence | None = None
    trace: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- traces
def trace_document(
    component: str,
    target: str,
    config: Mapping[str, Any],
    steps: Sequence[Step],
    failure: Divergence | None,
    *,
    inputs: str = "all",
    oracle: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The one replayable trace format (``kvspec replay`` reads it); ``inputs``: the alphabet the
    trace was drawn from (``all``, or ``well-formed``: no bad-input operations); ``oracle``: what
    the target was compared with (``{"kind", "label"}``; absent: the spec)."""
    return {
        "format": TRACE_FORMAT,
        "component": component,
        "target": target,
        "inputs": inputs,
        **({"oracle": dict(oracle)} if oracle and oracle.get("kind") != "spec" else {}),
        "config": dict(config),
        "steps": [
            {
                "method": s.method,
                "args": encode(s.args),
                "spec": s.spec.describe(),
                "target": s.target.describe(),
                **({"holders": s.holders} if s.holders is not None else {}),
                **({"op": s.op} if s.op is not None else {}),
                **({"bad": True} if s.bad else {}),
            }
            for s in steps
        ],
        "failure": None
        if failure is None
        else {"check": failure.check, "detail": failure.detail, "step": len(failure.steps)},
    }


def save_trace(document: Mapping[str, Any], directory: Path, stem: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def load_trace(path: Path) -> dict[str, Any]:
    """Read and validate a trace file (``ValueError`` naming what is wrong)."""
    document = json.loads(path.read_text())
    if not isinstance(document, dict) or document.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a kvspec trace (expected format {TRACE_FORMAT!r})")
    missing = [k for k in ("component", "target", "config", "steps") if k not in document]
    if missing:
        raise ValueError(f"{path} lacks the trace fields {', '.join(missing)}")
    if not isinstance(document["steps"], list) or not all(
        isinstance(s, dict) and "method" in s and isinstance(s.get("args"), list)
        for s in document["steps"]
    ):
        raise ValueError(f"{path}: every step needs a method and a list of args")
    return document
