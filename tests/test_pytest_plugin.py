"""kvspec inside an engine's own test suite: ``kvspec.testing.lockstep_machine``, the pytest plugin
(``--kvspec-target``, ``--kvspec-profile``, ``--kvspec-traces``, the ``kvspec_lockstep`` fixture)
and ``examples/test_engine_conformance.py``, run as an engine would run it: a pytest session of its
own, in a folder of its own (passing on the impl, failing on a planted bug)."""

from __future__ import annotations

import json
import subprocess
import sys
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from kvspec import testing
from kvspec.cli import main
from kvspec.pytest_plugin import _targets

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "test_engine_conformance.py"
BM = "infinilm-block-manager"
MUTANT = "reclaim_evicts_referenced_page"  # found in a handful of programs, shrinks fast
# what the inner sessions run under: kvspec's ci settings with fewer, shorter programs
CONFTEST = """
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "example", max_examples=20, stateful_step_count=20, derandomize=True, deadline=None,
    database=None, report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
)
"""


@pytest.fixture(autouse=True)
def clean_session() -> Any:
    yield
    testing.configure()


def test_lockstep_machine_is_a_state_machine_whose_testcase_is_a_unittest_case() -> None:
    from hypothesis import settings

    machine = testing.lockstep_machine(BM, "impl", inputs="well-formed")
    assert issubclass(machine, RuleBasedStateMachine)
    assert issubclass(machine.TestCase, unittest.TestCase)
    machine.TestCase.settings = settings(max_examples=10, database=None, deadline=None)
    outcome = unittest.TextTestRunner(stream=open("/dev/null", "w")).run(  # noqa: SIM115
        unittest.defaultTestLoader.loadTestsFromTestCase(machine.TestCase)
    )
    assert outcome.wasSuccessful() and outcome.testsRun == 1


def test_the_session_overrides_replace_the_target_and_the_settings() -> None:
    testing.configure({BM: f"mutant:{MUTANT}"}, "ci")
    machine = testing.lockstep_machine(BM, "impl")
    assert machine.kvspec["target"] == f"mutant:{MUTANT}"
    assert machine.TestCase.settings.max_examples == 200 and machine.TestCase.settings.derandomize
    other = testing.lockstep_machine("vllm-lru", "impl")  # another component keeps its target
    assert other.kvspec["target"] == "impl"
    testing.configure({None: "spec"})
    assert testing.lockstep_machine(BM, "impl").kvspec["target"] == "spec"
    testing.configure()
    assert testing.lockstep_machine(BM, "impl").kvspec["target"] == "impl"
    with pytest.raises(ValueError, match="unknown hypothesis profile"):
        testing.configure(profile="warp")


def test_kvspec_target_values() -> None:
    assert _targets(["spec", f"{BM}=mutant:x"]) == {None: "spec", BM: "mutant:x"}


def _run_example(tmp_path: Path, *options: str) -> dict[str, tuple[str, list[str]]]:
    """Run the example file in a pytest session of its own (cwd ``tmp_path``); per test: its
    outcome and its ``kvspec_trace`` properties, read from the JUnit XML report."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / EXAMPLE.name).write_text(EXAMPLE.read_text())
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", EXAMPLE.name, "-p", "no:cacheprovider", "-q",
         f"--junitxml={report}", "--kvspec-profile", "example", *options],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out: dict[str, tuple[str, list[str]]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None else "passed"
        outcome = "error" if case.find("error") is not None else outcome
        traces = [
            p.get("value", "") for p in case.iter("property") if p.get("name") == "kvspec_trace"
        ]
        out[f"{case.get('classname')}.{case.get('name')}"] = (outcome, traces)
    return out


def test_the_example_passes_on_the_impl_and_fails_on_a_planted_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "impl"
    good.mkdir()
    passed = _run_example(good)
    assert len(passed) == 4 and all(o == "passed" for o, _ in passed.values()), passed

    bad = tmp_path / "mutant"
    bad.mkdir()
    found = _run_example(bad, "--kvspec-target", f"{BM}=mutant:{MUTANT}")
    failed = {name: traces for name, (o, traces) in found.items() if o != "passed"}
    assert list(failed) == ["test_engine_conformance.TestBlockManagerConformance.runTest"], found
    [trace] = failed["test_engine_conformance.TestBlockManagerConformance.runTest"]
    path = bad / trace
    document = json.loads(path.read_text())
    assert document["target"] == f"mutant:{MUTANT}" and document["inputs"] == "well-formed"
    monkeypatch.chdir(bad)
    assert main(["replay", str(path), "--json"]) == 1  # kvspec replay re-runs it: still fails
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["counterexample"]["check"] == document["failure"]["check"]


def test_the_fixture_fails_and_saves_a_trace_on_a_planted_bug(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_fixture.py").write_text(
        f"def test_bm(kvspec_lockstep):\n    kvspec_lockstep({BM!r}, 'mutant:{MUTANT}')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "test_fixture.py", "-p", "no:cacheprovider", "-q",
         "--kvspec-profile", "example", "--kvspec-traces", "traces"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert "trace saved to traces/" in result.stdout
    assert len(list((tmp_path / "traces").glob("*.json"))) == 1
