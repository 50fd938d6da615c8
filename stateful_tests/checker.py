"""Generic lockstep plumbing: one hypothesis machine builder, one fuzzer, one replay, one shrinker.

A component's checker module keeps only what is its own — a driver (the operation alphabet over a
spec/target pair in :class:`~stateful_tests.lockstep.Lockstep`, with the generator-side model the
alphabet needs), its configuration draws and the facts its enabling conditions read — and describes
itself in one :class:`CheckerDef`. Everything else is here, written once:

* :func:`make_machine` generates the ``RuleBasedStateMachine``: one ``@initialize`` (draw a
  configuration, start a driver), one ``@rule`` per row of the operations table with its
  ``@precondition`` taken from the same row, one ``@invariant`` per invariant the checker names.
* :func:`check` runs that machine, then the checker's explicit programs (:class:`Example`), so that
  the paths the tests require are reached whatever hypothesis' generator does.
* :func:`fuzz` draws the same table with seeded weights (volume), :func:`replay` re-runs a trace,
  :func:`shrink` delta-debugs one.

A driver offers: ``config``, ``steps``, ``coverage``, one method per operation name taking a
:class:`~stateful_tests.lockstep.Chooser`, ``check_invariant(name)`` (raises ``Divergence``) and
``replay_step(step)`` (re-run one trace step with the same checks as the live call).
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time
import zlib
from bisect import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from stateful_tests.lockstep import (
    Chooser,
    DataChooser,
    Divergence,
    RandomChooser,
    RunResult,
    TargetMisfit,
    call_timeout,
    decode,
    trace_document,
)

CALL_TIMEOUT = 10.0
"""Seconds a target call (or a read of its state) may take before it is a ``hang``."""

Options = Mapping[str, Any]

INPUTS = ("all", "well-formed")
"""The two alphabets: every operation, or only those a well-formed caller makes (for targets that
are not meant to share the spec's contract on bad input; ``kvspec audit`` reports that contract)."""


ORACLES = ("spec", "baseline", "invariants")


@dataclass(frozen=True)
class Reference:
    """What a checker compares the target with (``--oracle`` / ``--baseline``).

    * ``spec`` (the default): the component's executable spec, every observable equal.
    * ``baseline``: ``cls``, another implementation of the same API (the previous revision of the
      target, another release) driven where the spec is driven: return values, exceptions and
      snapshots must be equal, and every invariant still holds (on both sides: their snapshots
      are equal by then).
    * ``invariants``: no reference behaviour at all, only the component's invariants. The
      target runs beside a second instance of itself (so the operation alphabet keeps a state to
      draw from), which makes any difference between the two nondeterminism, reported as
      ``deterministic``.

    ``label``: how reports name the reference (the baseline's target text)."""

    kind: str = "spec"
    cls: Callable[..., Any] | None = None
    label: str = "spec"

    def __post_init__(self) -> None:
        if self.kind not in ORACLES:
            raise ValueError(f"unknown oracle {self.kind!r}; choose one of {', '.join(ORACLES)}")
        if (self.kind == "baseline") != (self.cls is not None):
            raise ValueError("a baseline reference needs its class (and only a baseline has one)")

    @property
    def role(self) -> str:
        """The reference side's name in messages: spec, baseline, or copy (of the target)."""
        return {"spec": "spec", "baseline": "baseline", "invariants": "copy"}[self.kind]

    def cls_for(
        self, spec_cls: Callable[..., Any], target_cls: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The class driven on the reference side against ``target_cls`` (``spec_cls``: the
        component's spec)."""
        if self.kind == "spec":
            return spec_cls
        return target_cls if self.cls is None else self.cls

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label}


SPEC = Reference()


def check_inputs(inputs: str) -> str:
    if inputs not in INPUTS:
        raise ValueError(f"unknown --inputs {inputs!r}; choose one of {', '.join(INPUTS)}")
    return inputs


@dataclass(frozen=True)
class Operation:
    """One row of an operations table: the driver method, its fuzzer weight, and when it may run
    (a predicate over the checker's facts; the hypothesis rule's precondition is the same)."""

    name: str
    weight: int
    enabled: Callable[[Any], bool] = lambda facts: True
    bad: bool = False  # a bad-input operation: left out with ``inputs="well-formed"``


@dataclass(frozen=True)
class Example:
    """An explicit program that every ``check`` runs after hypothesis' own programs, so that the
    paths the tests require are reached whatever hypothesis' generator does: the configuration the
    machine draws from ``random.Random(seed)`` with the ``config`` fields replaced, then the
    scripted ``ops`` in order (one that is not enabled is skipped and counted
    ``example:skipped:NAME``), then ``steps`` operations drawn by weight as the fuzzer draws
    them. ``variants``: only for runs of these variants (a run with a drawn variant takes the
    first)."""

    seed: int
    steps: int = 0
    ops: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckerDef:
    """What a component's lockstep checker is made of (its own parts; the plumbing is generic).

    ``driver(target_cls, config, options, reference)`` starts a driver (``reference``: a
    :class:`Reference`, whose class the driver drives where it drives the spec by default);
    ``config_type(**fields)`` rebuilds a trace's configuration; ``machine_config`` /
    ``fuzz_config`` ``(chooser, variant, options)`` draw one (``variant=None``: drawn too);
    ``facts(driver)`` computes once per step what the ``enabled`` predicates read; ``spec_cls``
    is the spec as a target (a shrunk trace must replay cleanly spec-vs-spec, unless its failure
    is one of ``spec_properties`` — a question about the spec itself); ``simplify(step)`` yields
    smaller variants of one trace step for the shrinker.
    """

    machine_name: str
    driver: Callable[[Callable[..., Any], Any, Options, Reference], Any]
    config_type: Callable[..., Any]
    machine_config: Callable[[Chooser, str | None, Options], Any]
    fuzz_config: Callable[[Chooser, str | None, Options], Any]
    operations: tuple[Operation, ...]
    spec_cls: Callable[..., Any]
    invariants: tuple[str, ...] = ()
    facts: Callable[[Any], Any] = lambda driver: driver
    episode_ops: int = 300
    options: tuple[str, ...] = ()
    spec_properties: frozenset[str] = frozenset()
    examples: tuple[Example, ...] = ()
    simplify: Callable[[dict[str, Any]], Iterator[dict[str, Any]]] | None = None

    def rows(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.operations)

    def table(self, inputs: str = "all") -> tuple[Operation, ...]:
        """The operations of one alphabet (``all``, or ``well-formed``: no bad-input rows)."""
        if check_inputs(inputs) == "all":
            return self.operations
        return tuple(op for op in self.operations if not op.bad)


@dataclass(frozen=True)
class Mutant:
    """A planted bug: a small subclass of an impl class (never an edit of impl source) whose
    docstring names its origin. ``component`` is filled in by the registry; ``variant`` is the
    variant the bug lives in (``None``: every variant); ``options`` the checker options that put it
    in reach (e.g. a PD connector); ``inputs`` the input classes the checkers draw (``well-formed``
    for a bug re-introduced into real engine code, which does not validate its arguments)."""

    name: str
    origin: str
    cls: type
    expected_check: str  # the check that should name the failure (documentation, not enforced)
    variant: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    component: str = ""
    inputs: str = "all"


# ----------------------------------------------------------------------------- hypothesis machine
def _rule(op: Operation, facts: Callable[[Any], Any]) -> Callable[..., None]:
    def run(self: Any, data: st.DataObject) -> None:
        self.run_operation(op, data)

    run.__name__ = run.__qualname__ = op.name
    return precondition(lambda self: bool(op.enabled(facts(self.d))))(rule(data=st.data())(run))


def _invariant(name: str) -> Callable[[Any], None]:
    def check(self: Any) -> None:
        self.d.check_invariant(name)

    check.__name__ = check.__qualname__ = name
    return invariant()(check)


class LockstepMachine(RuleBasedStateMachine):
    """The base of every generated machine: class-level run statistics, the driver of the last
    program (after a failure hypothesis re-runs the shrunk program last, so it holds the
    counterexample), and the one rule body."""

    drivers_started = 0
    steps_run = 0
    last_driver: Any = None
    last_config: Any = None
    coverage: Counter[str]
    d: Any

    def run_operation(self, op: Operation, data: st.DataObject) -> None:
        before = len(self.d.steps)
        try:
            run_op(self.d, op, DataChooser(data))
        finally:
            cls = type(self)
            cls.steps_run += len(self.d.steps) - before
            cls.coverage[f"rule:{op.name}"] += 1

    def teardown(self) -> None:
        if getattr(self, "d", None) is not None:
            type(self).coverage.update(self.d.coverage)


def make_machine(
    checker: CheckerDef,
    target_cls: Callable[..., Any],
    variant: str | None,
    options: Options,
    *,
    seed_label: str,
    derandomize: bool = True,
    inputs: str = "all",
    reference: Reference = SPEC,
) -> type[LockstepMachine]:
    """The lockstep ``RuleBasedStateMachine`` of ``checker`` against ``target_cls``.

    Rules are the operations table's rows (simple first: shrinking prefers them), preconditions
    the rows' ``enabled`` over ``facts``, invariants the checker's named ones. Hypothesis derives a
    derandomized run's seed from the machine's source, which is this generic builder's for every
    component: with ``derandomize`` the seed is therefore set from ``seed_label`` and the table's
    row names instead, so a run depends on the component and its operations table, not on how the
    plumbing is written.
    """

    def start(self: Any, data: st.DataObject) -> None:
        cls = type(self)
        cls.last_config = config = checker.machine_config(DataChooser(data), variant, options)
        count_config(cls.coverage, config)
        cls.last_driver = None
        self.d = start_driver(checker, target_cls, config, options, reference)
        cls.drivers_started += 1
        cls.last_driver = self.d

    namespace: dict[str, Any] = {
        "coverage": Counter(),
        "start": initialize(data=st.data())(start),
        "__module__": __name__,
        "__qualname__": checker.machine_name,
    }
    table = checker.table(inputs)
    for op in table:
        namespace[op.name] = _rule(op, checker.facts)
    for name in checker.invariants:
        namespace[name] = _invariant(name)
    machine = type(checker.machine_name, (LockstepMachine,), namespace)
    if derandomize:
        label = f"{seed_label}|{'|'.join(op.name for op in table)}"
        machine._hypothesis_internal_use_seed = zlib.crc32(label.encode())  # type: ignore[attr-defined]
    return machine


def _to_stderr(text: object) -> None:
    sys.stderr.write(f"{text}\n")


def run_op(d: Any, op: Operation, chooser: Chooser) -> None:
    """Run one operation of the table on driver ``d``; the calls it makes are tagged with it."""
    d.ls.op, d.ls.bad = op.name, op.bad
    try:
        getattr(d, op.name)(chooser)
    finally:
        d.ls.op, d.ls.bad = None, False


def start_driver(
    checker: CheckerDef,
    target_cls: Callable[..., Any],
    config: Any,
    options: Options,
    reference: Reference = SPEC,
) -> Any:
    """A new driver. A difference in the first snapshot is a step-0 ``Divergence``; a target
    (or baseline) whose constructor rejects the component's arguments cannot be driven
    (``TargetMisfit``)."""
    try:
        return checker.driver(target_cls, config, options, reference)
    except (Divergence, TargetMisfit):
        raise
    except Exception as exc:
        raise TargetMisfit(f"constructing the target failed: {type(exc).__name__}: {exc}") from exc


def _trace(
    component: str,
    target: str,
    config: Any,
    failure: Divergence,
    inputs: str,
    reference: Reference = SPEC,
) -> dict[str, Any]:
    return trace_document(
        component,
        target,
        config.to_json(),
        failure.steps,
        failure,
        inputs=inputs,
        oracle=reference.to_json(),
    )


def check(
    component: str,
    checker: CheckerDef,
    target_cls: Callable[..., Any],
    target: str,
    settings: Any,
    *,
    variant: str | None = None,
    options: Options | None = None,
    variants: Sequence[str] = (),
    inputs: str = "all",
    timeout: float | None = CALL_TIMEOUT,
    reference: Reference = SPEC,
) -> RunResult:
    """Run the lockstep machine under ``settings``, then the explicit programs; the first failure
    (hypothesis' shrunk program, or the explicit program's trace) with its trace. With a drawn
    variant (``None``) the explicit programs run once per variant of ``variants`` (a drawn one
    would change every later draw of a seeded program)."""
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import run_state_machine_as_test

    opts = dict(options or {})
    machine = make_machine(
        checker,
        target_cls,
        variant,
        opts,
        seed_label=component,
        derandomize=settings.derandomize,
        inputs=inputs,
        reference=reference,
    )
    started = time.perf_counter()
    failure: Divergence | None = None
    try:
        # hypothesis' own reports (e.g. its shrink-time warning) go to stderr: stdout may carry
        # the CLI's one JSON document
        with with_reporter(_to_stderr), call_timeout(timeout):
            run_state_machine_as_test(machine, settings=settings)  # type: ignore[no-untyped-call, unused-ignore]
    except Divergence as exc:
        failure = exc
    result = RunResult(
        target,
        failure is None,
        machine.drivers_started,
        machine.steps_run,
        0.0,
        dict(machine.coverage),
        failure,
    )
    if failure is not None:
        config = machine.last_config if machine.last_driver is None else machine.last_driver.config
        result.trace = _trace(component, target, config, failure, inputs, reference)
    if result.passed:
        for run_variant in [variant] if variant is not None or not variants else variants:
            for example in checker.examples:
                if example.variants and run_variant not in (None, *example.variants):
                    continue
                run = run_example(
                    component,
                    checker,
                    target_cls,
                    target,
                    example,
                    variant=run_variant,
                    options=opts,
                    inputs=inputs,
                    timeout=timeout,
                    reference=reference,
                )
                result.examples += 1
                result.steps += run.steps
                result.coverage = dict(Counter(result.coverage) + Counter(run.coverage))
                if not run.passed:
                    result.passed, result.failure, result.trace = False, run.failure, run.trace
                    break
            if not result.passed:
                break
    result.seconds = time.perf_counter() - started
    return result


def count_config(coverage: Counter[str], config: Any) -> None:
    """Count one drawn configuration in ``coverage`` (``config:FIELD=VALUE``, JSON, per scalar or
    list field), so a report can say which option values its programs ran under."""
    for name, value in config.to_json().items():
        if value is None or isinstance(value, (bool, int, float, str, list, tuple)):
            coverage[f"config:{name}={json.dumps(value)}"] += 1


def scope_report(checker: CheckerDef, coverage: Mapping[str, int], inputs: str) -> dict[str, Any]:
    """What a check or fuzz run covered: each configuration field's values drawn (from the
    ``config:`` counts of :func:`count_config`) and the operations table's rows never run."""
    drawn: dict[str, set[str]] = {}
    for key in coverage:
        if key.startswith("config:"):
            name, _, value = key[len("config:") :].partition("=")
            drawn.setdefault(name, set()).add(value)  # JSON text: a list is not hashable
    return {
        "dimensions": {
            name: sorted(map(json.loads, values), key=lambda v: (type(v).__name__, v))
            for name, values in sorted(drawn.items())
        },
        "unreached_operations": [
            op.name for op in checker.table(inputs) if not coverage.get(f"rule:{op.name}")
        ],
    }


def run_example(
    component: str,
    checker: CheckerDef,
    target_cls: Callable[..., Any],
    target: str,
    example: Example,
    *,
    variant: str | None = None,
    options: Options | None = None,
    inputs: str = "all",
    timeout: float | None = CALL_TIMEOUT,
    reference: Reference = SPEC,
) -> RunResult:
    """One explicit program (:class:`Example`) against ``target_cls``: the configuration the
    machine draws from its seed with its ``config`` fields, its scripted ops, then its weighted
    steps. A run with a drawn variant (``None``) takes the example's first variant, if any."""
    opts = dict(options or {})
    if variant is None and example.variants:
        variant = example.variants[0]
    chooser = RandomChooser(random.Random(example.seed))
    config = checker.machine_config(chooser, variant, opts)
    if example.config:  # the fields the run's options fix stay fixed
        drawn = config.to_json()
        kept = {k: drawn[k] for k in opts if k in drawn}
        config = checker.config_type(**{**drawn, **example.config, **kept})
    table = checker.table(inputs)
    by_name = {op.name: op for op in checker.operations}
    coverage: Counter[str] = Counter()
    count_config(coverage, config)
    started = time.perf_counter()
    d: Any = None
    failure: Divergence | None = None
    try:
        with call_timeout(timeout):
            d = start_driver(checker, target_cls, config, opts, reference)
            _run_program(checker, d, chooser, example, table, by_name, coverage)
    except Divergence as exc:
        failure = exc
    if d is not None:
        coverage.update(d.coverage)
    return RunResult(
        target,
        failure is None,
        1,
        len(d.steps) if d is not None else 0,
        time.perf_counter() - started,
        dict(coverage),
        failure,
        None if failure is None else _trace(component, target, config, failure, inputs, reference),
    )


def _run_program(
    checker: CheckerDef,
    d: Any,
    chooser: RandomChooser,
    example: Example,
    table: Sequence[Operation],
    by_name: Mapping[str, Operation],
    coverage: Counter[str],
) -> None:
    """An example's scripted ops, then its weighted steps, on driver ``d``."""
    for name in example.ops:
        op = by_name[name]
        if op not in table or not op.enabled(checker.facts(d)):
            coverage[f"example:skipped:{name}"] += 1
            continue
        run_op(d, op, chooser)
        coverage[f"rule:{name}"] += 1
    _episode(checker, d, chooser, len(d.steps) + example.steps, coverage, table)


def _episode(
    checker: CheckerDef,
    d: Any,
    chooser: RandomChooser,
    until: int,
    coverage: Counter[str],
    table: Sequence[Operation],
) -> None:
    """Weighted draws from the enabled rows of ``table`` until ``until`` calls.

    The draw is ``rng.choices(enabled, weights)`` written out (the same bisection over the same
    cumulative weights, so the same row for the same random number), with the enabled rows and
    their cumulative weights computed once per distinct facts value when facts are a (hashable)
    tuple, as :class:`~stateful_tests.infinilm_block_manager.Facts` is."""
    rng = chooser.rng
    random_ = rng.random
    steps = d.steps
    facts = checker.facts
    draws: dict[Any, tuple[list[Operation], list[int], float]] = {}
    rule = {op.name: f"rule:{op.name}" for op in table}
    while len(steps) < until:
        now = facts(d)
        draw = draws.get(now) if isinstance(now, tuple) else None
        if draw is None:
            chosen = [op for op in table if op.enabled(now)]
            cum = list(accumulate(op.weight for op in chosen))
            draw = chosen, cum, cum[-1] + 0.0
            if isinstance(now, tuple):
                draws[now] = draw
        chosen, cum, total = draw
        op = chosen[bisect(cum, random_() * total, 0, len(chosen) - 1)]
        run_op(d, op, chooser)
        coverage[rule[op.name]] += 1


# ----------------------------------------------------------------------------- fuzzer
def fuzz(
    component: str,
    checker: CheckerDef,
    target_cls: Callable[..., Any],
    target: str,
    ops: int,
    seed: int,
    *,
    variant: str | None = None,
    options: Options | None = None,
    episode_ops: int | None = None,
    progress: Callable[[int], None] | None = None,
    inputs: str = "all",
    timeout: float | None = CALL_TIMEOUT,
    rows: Collection[str] | None = None,
    reference: Reference = SPEC,
) -> RunResult:
    """Seeded differential fuzzing: fresh drivers (episodes) until ``ops`` lockstep calls; each
    step draws one enabled row of the operations table by weight (``rows``: only these rows of
    the ``inputs`` alphabet)."""
    opts = dict(options or {})
    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    per_episode = episode_ops or checker.episode_ops
    table = tuple(op for op in checker.table(inputs) if rows is None or op.name in rows)
    if not table:
        raise ValueError(f"no operation of {sorted(rows or ())} is in the {inputs} alphabet")
    coverage: Counter[str] = Counter()
    done = episodes = 0
    started = time.perf_counter()
    with call_timeout(timeout), _collect_per_episode():
        while done < ops:
            config = checker.fuzz_config(chooser, variant, opts)
            count_config(coverage, config)
            episodes += 1
            d: Any = None
            try:
                d = start_driver(checker, target_cls, config, opts, reference)
                _episode(checker, d, chooser, min(per_episode, ops - done), coverage, table)
            except Divergence as exc:
                steps = len(d.steps) if d is not None else 0
                if d is not None:
                    coverage.update(d.coverage)
                return RunResult(
                    target,
                    False,
                    episodes,
                    done + steps,
                    time.perf_counter() - started,
                    dict(coverage),
                    exc,
                    _trace(component, target, config, exc, inputs, reference),
                )
            done += len(d.steps)
            coverage.update(d.coverage)
            d = None  # the episode's objects go now, most by reference counting
            gc.collect(1)  # its cycles (raised exceptions and their frames) too
            if progress is not None:
                progress(done)
    return RunResult(target, True, episodes, done, time.perf_counter() - started, dict(coverage))


@contextmanager
def _collect_per_episode() -> Iterator[None]:
    """No automatic garbage collection while the fuzzer runs; it collects the young generations
    after each episode instead. Automatic collections kept traversing everything long-lived (the
    episode's trace, the verdict memo) and took about half of a fuzzer's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# ----------------------------------------------------------------------------- replay and shrink
def replay(
    component: str,
    checker: CheckerDef,
    document: Mapping[str, Any],
    target_cls: Callable[..., Any],
    target: str,
    *,
    options: Options | None = None,
    inputs: str | None = None,
    timeout: float | None = CALL_TIMEOUT,
    reference: Reference = SPEC,
) -> RunResult:
    """Re-run a trace's calls on a fresh reference (the spec unless ``reference`` says
    otherwise) and ``target``, with the checks of the live run. ``inputs`` (default: the trace's
    own) ``well-formed`` leaves out the bad-input calls."""
    config = checker.config_type(**document["config"])
    chosen = check_inputs(inputs or document.get("inputs", "all"))
    started = time.perf_counter()
    d = None
    try:
        with call_timeout(timeout):
            d = start_driver(checker, target_cls, config, dict(options or {}), reference)
            for step in document["steps"]:
                if chosen == "well-formed" and step.get("bad"):
                    continue
                d.ls.op, d.ls.bad = step.get("op"), bool(step.get("bad"))
                d.replay_step({**step, "args": decode(step["args"])})
    except Divergence as exc:
        return RunResult(
            target,
            False,
            1,
            len(exc.steps),
            time.perf_counter() - started,
            failure=exc,
            trace=trace_document(
                component,
                target,
                config.to_json(),
                exc.steps,
                exc,
                inputs=chosen,
                oracle=reference.to_json(),
            ),
        )
    steps = len(d.steps) if d is not None else 0
    return RunResult(target, True, 1, steps, time.perf_counter() - started)


def shrink_steps(
    document: dict[str, Any],
    attempt: Callable[[list[dict[str, Any]]], dict[str, Any] | None],
    deadline: float,
) -> dict[str, Any]:
    """Delta debugging over a trace's steps: delete chunks (halving their size) while
    ``attempt(steps)`` still returns a failing trace; the smallest one found by ``deadline``."""
    best = attempt(document["steps"])
    if best is None:
        return document
    chunk = max(1, len(best["steps"]) // 2)
    while chunk >= 1 and time.perf_counter() < deadline:
        i, progressed = 0, False
        while i < len(best["steps"]) and time.perf_counter() < deadline:
            smaller = attempt(best["steps"][:i] + best["steps"][i + chunk :])
            if smaller is not None:
                best, progressed = smaller, True
            else:
                i += chunk
        if not progressed:
            chunk //= 2
    return best


def signature(document: Mapping[str, Any]) -> tuple[str, str, str]:
    """A failing trace's (operation, input class, check): what shrinking must not change. The
    operation and input class are those of the failing call (its last step)."""
    failure = document.get("failure") or {}
    last = document["steps"][-1] if document.get("steps") else {}
    op = str(last.get("op") or last.get("method") or "construction")
    return op, "bad-input" if last.get("bad") else "well-formed", str(failure.get("check"))


def shrink(
    component: str,
    checker: CheckerDef,
    document: dict[str, Any],
    target_cls: Callable[..., Any],
    target: str,
    *,
    budget_seconds: float = 10.0,
    options: Options | None = None,
    same_operation: bool = False,
    reference: Reference = SPEC,
) -> dict[str, Any]:
    """Delete steps from a failing trace (then simplify the survivors with ``checker.simplify``)
    while it still fails the same check on a call of the same input class (a well-formed
    failure never shrinks into a bad-input one; with ``same_operation``, also of the same
    operation) and — unless that check is one of the spec's own properties — still replays
    cleanly with the reference as its own target, so a shrunk trace never blames the reference's
    misuse (a baseline may fail the same check itself: its own bug, which the target shares).
    Recorded generator state (``holders``) is dropped from candidates: deleting a step makes it
    stale. The shortest failing trace found within ``budget_seconds``."""
    want = signature(document)
    deadline = time.perf_counter() + budget_seconds
    opts = dict(options or {})
    # (with the invariants oracle the reference is the target itself: nothing more to ask)
    own_property = want[2] in checker.spec_properties or reference.kind == "invariants"
    sanity_cls = reference.cls_for(checker.spec_cls, target_cls)

    def same(found: Mapping[str, Any]) -> bool:
        got = signature(found)
        return got[1:] == want[1:] and (not same_operation or got[0] == want[0])

    def attempt(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        candidate = {
            **document,
            "steps": [{k: v for k, v in s.items() if k != "holders"} for s in steps],
        }
        result = replay(
            component, checker, candidate, target_cls, target, options=opts, reference=reference
        )
        if result.passed or result.trace is None or not same(result.trace):
            return None
        if not own_property:
            own = replay(
                component,
                checker,
                candidate,
                sanity_cls,
                reference.label,
                options=opts,
                reference=reference,
            )
            if (
                own.failure is not None
                and own.failure.check not in checker.spec_properties
                and not (reference.kind == "baseline" and own.failure.check == want[2])
            ):
                return None
        return result.trace

    best = shrink_steps(document, attempt, deadline)
    if best is document or checker.simplify is None:
        return best
    index = 0
    while index < len(best["steps"]) and time.perf_counter() < deadline:
        for smaller_step in checker.simplify(best["steps"][index]):
            steps = [*best["steps"][:index], smaller_step, *best["steps"][index + 1 :]]
            smaller = attempt(steps)
            if smaller is not None:
                best = smaller
                break
            if time.perf_counter() >= deadline:
                break
        else:
            index += 1
    return best
