"""A fifth component in a few lines: registered in the registry, then checked, fuzzed, replayed,
explored and put through the kill matrix by the same commands as the real ones.

This is the walk-through of docs/adding-a-component.md as a test: a toy id pool (``take`` the lowest
free id, ``give`` one back) with a sorted-list spec, a heap impl, a planted LIFO bug, a driver, an
operations table and an explorer model — and nothing else.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest

from kvspec import components
from kvspec.cli import main
from kvspec.components import Component, ExplorerPlan, VerifyPlan
from proofs.explorer import Edge, Model, rejected
from stateful_tests.checker import SPEC, CheckerDef, Mutant, Operation, Options, Reference
from stateful_tests.lockstep import Chooser, Lockstep, Step

NAME = "toy-id-pool"


# ----------------------------------------------------------------------------- spec and impl
class PoolSnapshot(NamedTuple):
    free: tuple[int, ...]
    used: tuple[int, ...]

    def differing_fields(self, other: PoolSnapshot) -> list[str]:
        return [f for f, a, b in zip(self._fields, self, other, strict=True) if a != b]


class SpecIdPool:
    """The spec: ids ``0..size-1``; ``take`` hands out the lowest free id."""

    def __init__(self, size: int) -> None:
        self.free, self.used = list(range(size)), set[int]()

    def take(self) -> int | None:
        """Post: the lowest free id moves to ``used`` (``None`` when none is free)."""
        if not self.free:
            return None
        i = min(self.free)
        self.free.remove(i)
        self.used.add(i)
        return i

    def give(self, i: int) -> None:
        """Pre: ``i`` is in use (``ValueError`` otherwise, nothing changes). Post: ``i`` is free."""
        if i not in self.used:
            raise ValueError(f"id {i} is not in use")
        self.used.remove(i)
        self.free.append(i)

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(tuple(sorted(self.free)), tuple(sorted(self.used)))


class ImplIdPool(SpecIdPool):
    """The impl: a heap of free ids (same observable behaviour, O(log n) ``take``)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        heapq.heapify(self.free)

    def take(self) -> int | None:
        if not self.free:
            return None
        i = heapq.heappop(self.free)
        self.used.add(i)
        return i

    def give(self, i: int) -> None:
        if i not in self.used:
            raise ValueError(f"id {i} is not in use")
        self.used.remove(i)
        heapq.heappush(self.free, i)


class LifoIdPool(SpecIdPool):
    """A planted bug: the most recently freed id is handed out first."""

    def take(self) -> int | None:
        if not self.free:
            return None
        i = self.free.pop()
        self.used.add(i)
        return i


class TwoBugsIdPool(ImplIdPool):
    """A well-formed bug (``take`` of the last free id raises ``KeyError``) and a bad-input one
    (``give`` of an unknown id raises ``KeyError``, not ``ValueError``, once nothing is in use):
    both are ``exception`` divergences."""

    def take(self) -> int | None:
        if len(self.free) == 1:
            raise KeyError("last id")
        return super().take()

    def give(self, i: int) -> None:
        if not self.used:
            raise KeyError(i)
        super().give(i)


class StrictOnBadInputIdPool(ImplIdPool):
    """Upstream-like: the same on legal calls, another exception kind on a bad ``give``."""

    def give(self, i: int) -> None:
        if i not in self.used:
            raise AssertionError(f"id {i} not held")
        super().give(i)


def ids_partition_pool(s: PoolSnapshot) -> str | None:
    """Every id is free or used, never both."""
    if set(s.free) & set(s.used):
        return f"ids both free and used: {sorted(set(s.free) & set(s.used))}"
    return None


# ----------------------------------------------------------------------------- the checker
@dataclass(frozen=True)
class ToyConfig:
    size: int = 3

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ToyDriver:
    """The operation alphabet over one spec/target pair."""

    def __init__(
        self, target_cls: Callable[..., Any], config: ToyConfig, reference: Reference = SPEC
    ) -> None:
        self.config = config
        self.target = target_cls(config.size)
        self.ls = Lockstep(
            reference.cls_for(SpecIdPool, target_cls)(config.size),
            self.target,
            lambda pool: pool.snapshot(),
            state_invariants={"ids_partition_pool": ids_partition_pool},
            validate_first=lambda method, exc: True,
            role=reference.role,
        )
        self.coverage: Counter[str] = Counter()

    @property
    def steps(self) -> list[Step]:
        return self.ls.steps

    def take(self, c: Chooser) -> None:
        if self.ls.call("take").returned is None:
            self.coverage["path:pool_full"] += 1

    def give(self, c: Chooser) -> None:
        self.ls.call("give", c.pick(self.ls.after.used))

    def bad_give(self, c: Chooser) -> None:
        self.ls.call("give", self.config.size + c.int(0, 2))

    def check_invariant(self, name: str) -> None:
        problem = ids_partition_pool(self.target.snapshot())
        if problem:
            raise self.ls.fail(name, problem)

    def replay_step(self, step: dict[str, Any]) -> None:
        self.ls.call(step["method"], *step["args"])


def _config(c: Chooser, variant: str | None, options: Options) -> ToyConfig:
    return ToyConfig(size=c.int(1, 4))


TOY_CHECKER = CheckerDef(
    machine_name="ToyLockstep",
    driver=lambda target_cls, config, options, reference: ToyDriver(target_cls, config, reference),
    config_type=ToyConfig,
    machine_config=_config,
    fuzz_config=_config,
    operations=(
        Operation("take", 3),
        Operation("give", 3, lambda d: bool(d.ls.after.used)),
        Operation("bad_give", 1, bad=True),
    ),
    spec_cls=SpecIdPool,
    invariants=("ids_partition_pool",),
    episode_ops=40,
)


# ----------------------------------------------------------------------------- the explorer
@dataclass(frozen=True)
class ToyBounds:
    size: int = 3
    HELP: ClassVar[dict[str, str]] = {"size": "ids in the pool"}

    def validate(self) -> None:
        if not 1 <= self.size <= 6:
            raise ValueError(f"size must be in [1, 6], got {self.size}")


class ToyModel(Model):
    checker = TOY_CHECKER
    state_invariants: ClassVar[dict[str, Callable[[Any], str | None]]] = {
        "ids_partition_pool": ids_partition_pool
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reader = lambda pool: pool.snapshot()

    def initial(self) -> tuple[Any, Any, Any]:
        return SpecIdPool(self.b.size), self.target_cls(self.b.size), ()

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        out = [Edge("take", ())]
        out += [Edge("give", (i,)) for i in snap.used]
        out.append(rejected("give", (self.b.size,)))
        return out

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return True

    def trace_config(self) -> dict[str, Any]:
        return {"size": self.b.size}


TOY = Component(
    name=NAME,
    summary="a toy id pool (tests/test_toy_component.py)",
    spec=f"{__name__}:SpecIdPool",
    impl=f"{__name__}:ImplIdPool",
    required_api=("take", "give", "snapshot"),
    checker=TOY_CHECKER,
    mutants=(
        Mutant("lifo_ids", "a plausible rewrite (free list as a stack)", LifoIdPool, "snapshot"),
    ),
    explorer=ExplorerPlan(ToyModel, ToyBounds, {"size": 2}),
    verify=VerifyPlan(check_examples=20, fuzz_ops=(500, 2_000)),
)


# ----------------------------------------------------------------------------- the tests
@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Component:
    monkeypatch.chdir(tmp_path)  # traces go under ./.kvspec/traces
    with components.registered(TOY) as component:
        yield component


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return rc, document


def test_registered_toy_is_checked_by_the_hypothesis_machine(
    toy: Component, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run_json(capsys, "check", NAME)
    assert rc == 0 and doc["passed"] and doc["component"] == NAME
    assert {"rule:take", "rule:give", "rule:bad_give", "path:pool_full"} <= set(doc["coverage"])


def test_registered_toy_is_fuzzed_and_its_mutant_replayed(
    toy: Component, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run_json(capsys, "fuzz", NAME, "--ops", "3000")
    assert rc == 0 and doc["ops"] >= 3000 and doc["divergences"] == 0
    rc, doc = run_json(capsys, "fuzz", NAME, "--target", "mutant:lifo_ids", "--ops", "3000")
    assert rc == 1 and doc["divergences"] == 1
    cx = doc["counterexample"]
    assert cx["check"] in ("return_value", "snapshot") and len(cx["steps"]) <= 6
    rc, replayed = run_json(capsys, "replay", cx["trace_file"])
    assert rc == 1 and replayed["counterexample"]["check"] == cx["check"]
    rc, replayed = run_json(capsys, "replay", cx["trace_file"], "--target", "impl")
    assert rc == 0 and replayed["passed"]


def test_registered_toy_is_explored_exhaustively(
    toy: Component, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run_json(capsys, "explore", NAME, "--size", "3")
    assert rc == 0 and doc["complete"] and doc["distinct_states"] == 8  # every subset in use
    rc, doc = run_json(capsys, "explore", NAME, "--target", "mutant:lifo_ids")
    assert rc == 1 and doc["violations"][0]["replay"] == "reproduced"
    assert doc["violations"][0]["depth"] == 1  # the first take hands out the highest id
    assert main(["explore", NAME, "--size", "9"]) == 2


def test_registered_toy_joins_the_kill_matrix_and_the_cli(
    toy: Component, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run_json(
        capsys, "mutants", "--component", NAME, "--checkers", "fuzzer,explorer", "--budget", "10"
    )
    assert rc == 0 and doc["summary"]["killed"] == 1
    assert main(["check", NAME, "--variant", "x"]) == 2  # the toy has no variants
    assert "--variant does not apply" in capsys.readouterr().err


def test_the_toy_is_gone_after_the_test() -> None:
    assert NAME not in components.names()


def test_inputs_well_formed_leaves_the_bad_input_operations_out(
    toy: Component, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"{__name__}:StrictOnBadInputIdPool"
    rc, doc = run_json(capsys, "fuzz", NAME, "--target", target, "--ops", "2000")
    assert rc == 1 and doc["inputs"] == "all"
    assert doc["counterexample"]["check"] == "exception"
    trace = json.loads(Path(doc["counterexample"]["trace_file"]).read_text())
    assert trace["inputs"] == "all" and trace["steps"][-1] == {**trace["steps"][-1], "bad": True}
    # the same trace without its bad-input calls agrees
    rc, again = run_json(
        capsys, "replay", doc["counterexample"]["trace_file"], "--inputs", "well-formed"
    )
    assert rc == 0 and again["inputs"] == "well-formed"
    for command in (["fuzz", NAME, "--ops", "2000"], ["check", NAME], ["explore", NAME]):
        rc, doc = run_json(capsys, *command, "--target", target, "--inputs", "well-formed")
        assert rc == 0 and doc["inputs"] == "well-formed", doc


def test_shrinking_keeps_the_input_class_of_the_failing_call(toy: Component) -> None:
    """take, take, give(5) (rejected alike), take (the well-formed bug): deleting the first two
    takes would turn it into the bad-input bug under the same check name; the shrinker refuses."""
    from stateful_tests.checker import signature

    steps = [
        {"method": "take", "args": [], "op": "take"},
        {"method": "take", "args": [], "op": "take"},
        {"method": "give", "args": [5], "op": "bad_give", "bad": True},
        {"method": "take", "args": [], "op": "take"},
    ]
    document = {"format": "kvspec-trace/1", "component": NAME, "target": "two-bugs",
                "config": {"size": 3}, "steps": steps, "failure": None}  # fmt: skip
    failed = toy.replay(document, TwoBugsIdPool, "two-bugs")
    assert failed.trace is not None
    assert signature(failed.trace) == ("take", "well-formed", "exception")
    short = toy.shrink(failed.trace, TwoBugsIdPool, "two-bugs", budget_seconds=5)
    assert signature(short) == ("take", "well-formed", "exception")
    assert [s["method"] for s in short["steps"]] == ["take", "take", "take"]


def test_the_testing_api_runs_the_machine_in_an_engines_own_suite(toy: Component) -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.testing import lockstep_machine
    from stateful_tests.lockstep import Divergence

    machine = lockstep_machine(NAME, ImplIdPool)
    run_state_machine_as_test(machine, settings=settings(max_examples=30, database=None))
    assert machine.TestCase is not None
    strict = lockstep_machine(NAME, StrictOnBadInputIdPool, inputs="well-formed")
    run_state_machine_as_test(strict, settings=settings(max_examples=30, database=None))
    with pytest.raises(Divergence):
        run_state_machine_as_test(
            lockstep_machine(NAME, f"{__name__}:StrictOnBadInputIdPool"),
            settings=settings(max_examples=100, database=None),
        )
