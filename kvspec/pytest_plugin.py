"""kvspec's pytest plugin (entry point ``pytest11``: active wherever kvspec is installed).

For an engine's own test suite that checks its classes with :mod:`kvspec.testing`:

* ``--kvspec-target [COMPONENT=]TARGET`` (repeatable): build every lockstep machine of the session
  (or only those of ``COMPONENT``) against ``TARGET`` instead of the class the test file names —
  any ``--target`` value: ``impl``, ``spec``, ``mutant:NAME``, ``MOD:CLASS``, ``FILE.py:CLASS``.
  Pointing the suite at a planted bug shows that it bites.
* ``--kvspec-profile PROFILE``: run the machines under kvspec's Hypothesis profile ``ci`` (the
  programs ``kvspec check`` runs: derandomized), ``dev`` or ``deep``, or any profile the suite
  registered; without it the suite's own settings decide.
* ``--kvspec-traces DIR``: where a failing machine's program is saved as a replayable trace
  (default ``.kvspec/traces``); the path is in the failure report and in the test's
  ``user_properties`` (``kvspec_trace``; JUnit XML carries it).
* the fixture ``kvspec_lockstep``: ``kvspec_lockstep(COMPONENT, TARGET, variant=…, inputs=…)``
  builds the machine and runs it in a plain test function (parametrise it over variants).

Without these options the plugin changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TRACES = Path(".kvspec/traces")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec lockstep machines (kvspec.testing)")
    group.addoption(
        "--kvspec-target",
        action="append",
        default=[],
        metavar="[COMPONENT=]TARGET",
        help="build kvspec's lockstep machines (those of COMPONENT) against TARGET: impl, spec, "
        "mutant:NAME, MOD:CLASS or FILE.py:CLASS",
    )
    group.addoption(
        "--kvspec-profile",
        metavar="PROFILE",
        help="run kvspec's lockstep machines under this hypothesis profile (ci, dev, deep, or "
        "one the suite registered)",
    )
    group.addoption(
        "--kvspec-traces",
        metavar="DIR",
        help=f"save a failing machine's program here as a replayable trace (default {TRACES})",
    )


def _targets(values: list[str]) -> dict[str | None, str]:
    out: dict[str | None, str] = {}
    for value in values:
        component, sep, target = value.partition("=")
        out[component if sep else None] = target if sep else value
    return out


def pytest_configure(config: pytest.Config) -> None:
    from kvspec import testing

    targets = _targets(config.getoption("kvspec_target") or [])
    profile = config.getoption("kvspec_profile")
    if targets or profile:
        try:
            testing.configure(targets, profile)
        except ValueError as exc:
            raise pytest.UsageError(f"--kvspec-profile: {exc}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    from kvspec import testing

    testing.configure()


@pytest.fixture
def kvspec_lockstep(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``run(component, target="impl", *, variant=None, inputs="all", **options)``: build the
    lockstep machine (:func:`kvspec.testing.lockstep_machine`) and run it under its
    ``TestCase.settings``; a divergence fails the test (its trace saved)."""
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.testing import lockstep_machine

    def run(component: str, target: Any = "impl", **kwargs: Any) -> None:
        machine = lockstep_machine(component, target, **kwargs)
        request.node.kvspec_machine = machine  # for the report: its trace
        run_state_machine_as_test(machine, settings=machine.TestCase.settings)

    return run


def _divergence(exc: BaseException | None) -> Any:
    """The ``Divergence`` in ``exc`` (itself, or one of an exception group's)."""
    from stateful_tests.lockstep import Divergence

    if isinstance(exc, Divergence):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _divergence(inner)
        if found is not None:
            return found
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if call.when != "call" or call.excinfo is None:
        return report
    failure = _divergence(call.excinfo.value)
    test = getattr(item, "obj", None)
    machine = getattr(item, "kvspec_machine", None) or getattr(
        test, "_hypothesis_state_machine_class", None
    )
    if failure is None or machine is None:
        return report
    from kvspec.output import trace_path
    from kvspec.testing import trace_of
    from stateful_tests.lockstep import save_trace

    trace = trace_of(machine, failure)
    if trace is None:
        return report
    folder = Path(item.config.getoption("kvspec_traces") or TRACES)
    stem = trace_path(folder, f"pytest-{trace['component']}-{trace['target'][-60:]}")
    path = save_trace(trace, folder, stem)
    item.user_properties.append(("kvspec_trace", str(path)))
    report.user_properties = list(item.user_properties)
    report.sections.append(("kvspec", f"trace saved to {path} (re-run: kvspec replay {path})"))
    return report
