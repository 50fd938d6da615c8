"""``kvspec audit``: conformance and robustness findings, deduplicated by signature, shrunk
without changing it, saved as replayable traces; exit 1 only on conformance (or ``--strict``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_toy_component import NAME, TOY

from kvspec import components
from kvspec.audit import describe
from kvspec.cli import main


@pytest.fixture(autouse=True)
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.chdir(tmp_path)
    with components.registered(TOY) as component:
        yield component


def audit(capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> tuple[int, Any]:
    rc = main(["audit", NAME, "--target", target, "--budget", "2", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_a_target_strict_on_bad_input_conforms_with_one_robustness_finding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, doc = audit(capsys, "test_toy_component:StrictOnBadInputIdPool")
    assert rc == 0 and doc["conformance"] == [] and doc["calls"] > 1000
    (finding,) = doc["robustness"]
    assert finding["signature"] == "bad_give/bad-input/exception"
    assert finding["what"] == "raised AssertionError where the spec raises ValueError"
    assert finding["steps"] == 1 and finding["count"] >= 1
    # the saved trace replays the same failure
    assert main(["replay", finding["trace"], "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["counterexample"]["check"] == "exception"
    rc, _ = audit(capsys, "test_toy_component:StrictOnBadInputIdPool", "--strict")
    assert rc == 1


def test_a_well_formed_bug_is_a_conformance_finding(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = audit(capsys, "test_toy_component:TwoBugsIdPool")
    assert rc == 1
    signatures = {f["signature"] for f in doc["conformance"]}
    assert signatures == {"take/well-formed/exception"}
    # shrunk without changing the signature: the failing call is still a take, not a bad give
    (finding,) = doc["conformance"]
    last = json.loads(Path(finding["trace"]).read_text())["steps"][-1]
    assert last["op"] == "take" and "bad" not in last
    assert {f["signature"] for f in doc["robustness"]} == {"bad_give/bad-input/exception"}


def test_the_impl_has_no_findings(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = audit(capsys, "impl")
    assert rc == 0 and doc["conformance"] == [] and doc["robustness"] == []


def test_describe_names_what_the_target_did() -> None:
    def trace(spec: str, target: str, check: str) -> dict[str, Any]:
        step = {"method": "m", "args": [], "spec": spec, "target": target}
        return {"steps": [step], "failure": {"check": check, "detail": "d"}}

    assert describe(trace("raise ValueError(x)", "null", "exception")).startswith("accepted it")
    assert describe(trace("null", "raise KeyError(1)", "exception")) == (
        "raised KeyError on a call the spec accepts"
    )
    assert describe(trace("raise ValueError(x)", "raise ValueError(x)", "atomic_failure")) == (
        "changed state before failing"
    )
    assert describe(trace("null", "raise TimeoutError(x)", "hang")).endswith("(hang)")
    assert describe({"steps": [], "failure": {"check": "snapshot"}}).endswith("(construction)")
