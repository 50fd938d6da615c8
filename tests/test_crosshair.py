"""``kvspec crosshair``: verdicts, the check table, and the checks themselves at their own budgets.

The real kernel pairs must show no difference, every planted kernel bug must be found with the
budget it is calibrated at (which the real pairs' budgets dominate), the impl kernels' contracts
must hold and the reservation properties must pass on Hypothesis' CrossHair backend. About two
minutes on one core; ``kvspec crosshair --planted`` runs the same table from the command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
from types import SimpleNamespace
from typing import Any

import pytest

from kvspec import crosshair as cli
from proofs import crosshair_checks as cc

needs_crosshair = pytest.mark.skipif(
    not cc.crosshair_available(), reason="crosshair-tool is not installed"
)
needs_backend = pytest.mark.skipif(
    not cc.hypothesis_crosshair_available(), reason="hypothesis-crosshair is not installed"
)

DIFF = cc.Check("d", "diffbehavior", ("a.f", "b.g"), budget=10, about="")
CONTRACT = cc.Check("c", "contract", ("a.f", "a.g"), budget=10, about="")
BACKEND = cc.Check("b", "backend", ("p.py::test_x", "p.py::test_y"), budget=10, about="")
PLANTED_DIFF = cc.Check("pd", "diffbehavior", ("a.f", "m.g"), budget=10, about="", expect="found")

GIVEN = """Given: (refs=[0, 0], num_free=0, num_required=2),
  a.f : returns ([1, 0], True)
  b.g : returns ([1], False)
"""


# ----------------------------------------------------------------------------- verdicts
def test_no_difference_after_the_whole_budget_is_a_pass() -> None:
    out = (
        "No differences found. (attempted 60 iterations)\n"
        "Consider increasing the --max_uninteresting_iterations option.\n"
    )
    status, detail = cc.interpret(DIFF, 0, out, "")
    assert status == "pass"
    assert "60 iterations" in detail and "budget spent" in detail


def test_exhausted_paths_are_a_pass() -> None:
    out = (
        "No differences found. (attempted 2 iterations)\n"
        "All paths exhausted, functions are likely the same!\n"
    )
    assert cc.interpret(DIFF, 0, out, "") == (
        "pass",
        "no difference in 2 iterations; all paths exhausted",
    )


def test_a_difference_fails_with_the_example() -> None:
    status, detail = cc.interpret(DIFF, 1, GIVEN, "")
    assert status == "fail"
    assert "refs=[0, 0], num_free=0, num_required=2" in detail and "returns ([1], False)" in detail


@pytest.mark.parametrize(
    ("rc", "out", "err", "timed_out"),
    [
        (1, "", "Traceback (most recent call last):\n  ...\nNotFound: Name 'g' not found", False),
        (2, "", "Could not determine signature", False),  # crosshair's own "could not"
        (2, "No differences found. (attempted 9 iterations)\n", "nondeterminism detected", False),
        (0, "", "", False),  # no verdict printed at all
        (-1, "", "", True),  # wall clock ran out
    ],
    ids=["crash", "could-not", "nondeterminism", "silent", "timeout"],
)
def test_anything_else_is_inconclusive_never_a_pass(
    rc: int, out: str, err: str, timed_out: bool
) -> None:
    for check in (DIFF, PLANTED_DIFF):
        assert cc.interpret(check, rc, out, err, timed_out=timed_out)[0] == "inconclusive"


def test_contract_verdicts() -> None:
    ok = "/x/k.py:3: info: Not confirmed.\n/x/k.py:4: info: Confirmed over all paths.\n"
    status, detail = cc.interpret(CONTRACT, 0, ok, "")
    assert status == "pass" and "2 postconditions" in detail
    bad = ok + "/x/k.py:5: error: false when calling f([0, 0], 0, 2) (which returns ([1], False))\n"
    status, detail = cc.interpret(CONTRACT, 1, bad, "")
    assert status == "fail" and "k.py:5" in detail and "f([0, 0], 0, 2)" in detail
    vacuous = ok + "/x/k.py:9: info: Unable to meet precondition.\n"
    assert cc.interpret(CONTRACT, 0, vacuous, "")[0] == "inconclusive"
    raising = (
        "/x/k.py:5: error: Error while evaluating post condition: NameError: x when calling f()\n"
    )
    assert cc.interpret(CONTRACT, 1, raising, "")[0] == "inconclusive"
    no_contracts = "WARNING: Targets found, but contain no checkable functions.\n"
    assert cc.interpret(CONTRACT, 0, "", no_contracts)[0] == "inconclusive"
    assert cc.interpret(CONTRACT, 0, "", "")[0] == "inconclusive"


def test_backend_verdicts() -> None:
    assert cc.interpret(BACKEND, 0, "..\n2 passed in 9.1s\n", "")[0] == "pass"
    assert cc.interpret(BACKEND, 0, "1 passed, 1 skipped in 3s\n", "")[0] == "inconclusive"
    assert cc.interpret(BACKEND, 0, "1 passed in 3s\n", "")[0] == "inconclusive"  # one missing
    failing = "E       Falsifying example: test_x(\nE           events=[0, 1, -1],\nE       )\n\n1 failed\n"
    status, detail = cc.interpret(BACKEND, 1, failing, "")
    assert status == "fail" and "events=[0, 1, -1]" in detail
    assert cc.interpret(BACKEND, 4, "ERROR: file or directory not found\n", "")[0] == "inconclusive"


def test_a_planted_check_passes_only_when_its_bug_is_found() -> None:
    status, detail = cc.interpret(PLANTED_DIFF, 1, GIVEN, "")
    assert status == "pass" and detail.startswith("planted bug found")
    missed = "No differences found. (attempted 60 iterations)\n"
    status, detail = cc.interpret(PLANTED_DIFF, 0, missed, "")
    assert status == "fail" and "NOT found" in detail


# ----------------------------------------------------------------------------- the table
def _resolve(target: str) -> Any:
    if "::" in target:  # pytest node id
        path, _, name = target.partition("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        return getattr(module, name)
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_check_names_real_functions_and_unique_names() -> None:
    checks = [*cc.CHECKS, *cc.PLANTED]
    assert len({c.name for c in checks}) == len(checks)
    for c in checks:
        for target in c.targets:
            assert callable(_resolve(target)), (c.name, target)
        assert c.budget >= 1 and c.timeout > 0
    assert all(c.expect == "pass" for c in cc.CHECKS)
    assert all(c.expect == "found" for c in cc.PLANTED)
    assert set(cc.VERIFY_PLANTED) <= {c.name for c in cc.PLANTED}


def test_real_budgets_dominate_planted() -> None:
    """Every planted diffbehavior variant is compared with a legacy kernel that a real pair checks
    at four times (or more) the budget at which the planted variant is found."""
    real = {c.targets[0]: c for c in cc.CHECKS if c.kind == "diffbehavior"}
    for planted in (c for c in cc.PLANTED if c.kind == "diffbehavior"):
        assert planted.targets[0] in real, planted.name
        assert real[planted.targets[0]].budget >= 4 * planted.budget, planted.name


def test_kill_matrix_mapping_names_planted_checks_and_catalogue_mutants() -> None:
    planted = {c.name for c in cc.PLANTED}
    assert set(cc.CATALOGUE_KERNELS.values()) <= planted
    catalogue = pytest.importorskip("stateful_tests.mutants").CATALOGUE
    assert set(cc.CATALOGUE_KERNELS) <= set(catalogue)


def test_select_by_name_and_pattern() -> None:
    assert [c.name for c in cc.select(None)] == [c.name for c in cc.CHECKS]
    assert len(cc.select(None, planted=True)) == len(cc.CHECKS) + len(cc.PLANTED)
    assert {c.kind for c in cc.select(["contract-*"])} == {"contract"}
    assert [c.name for c in cc.select(["planted-counter-skips-dequeue"])] == [
        "planted-counter-skips-dequeue"
    ]
    with pytest.raises(ValueError, match="no-such-check"):
        cc.select(["no-such-check"])


def test_budget_scale_reaches_the_command_line() -> None:
    check = next(c for c in cc.CHECKS if c.name == "reclaim-bounded-vs-legacy")
    argv = cc.command(check, scale=3)
    assert argv[argv.index("--max_uninteresting_iterations") + 1] == str(3 * check.budget)
    assert argv[argv.index("--per_path_timeout") + 1] == str(check.per_path_timeout)
    backend = next(c for c in cc.CHECKS if c.kind == "backend")
    assert cc.environment(backend, scale=0.5)["KVSPEC_CROSSHAIR_EXAMPLES"] == str(
        round(backend.budget / 2)
    )


# ----------------------------------------------------------------------------- the checks
def _by_name(name: str) -> cc.Check:
    return next(c for c in (*cc.CHECKS, *cc.PLANTED) if c.name == name)


@needs_crosshair
@pytest.mark.parametrize("name", [c.name for c in cc.CHECKS if c.kind == "diffbehavior"])
def test_real_pair_shows_no_difference(name: str) -> None:
    outcome = cc.run_check(_by_name(name))
    assert outcome.status == "pass", outcome.detail


@needs_crosshair
@pytest.mark.parametrize("name", [c.name for c in cc.PLANTED if c.kind != "backend"])
def test_planted_bug_is_found(name: str) -> None:
    outcome = cc.run_check(_by_name(name))
    assert outcome.status == "pass", outcome.detail
    assert outcome.detail.startswith("planted bug found")


@needs_crosshair
@pytest.mark.parametrize(
    "name",
    [
        c.name
        for c in cc.CHECKS
        if (c.kind == "contract" and c.quick) or c.name == "contract-bounded-reclaim"
    ],
)
def test_impl_kernel_contracts_hold(name: str) -> None:
    outcome = cc.run_check(_by_name(name))
    assert outcome.status == "pass", outcome.detail


@needs_crosshair
@needs_backend
def test_reservation_properties_pass_on_the_crosshair_backend() -> None:
    outcome = cc.run_check(_by_name("backend-reservation-properties"))
    assert outcome.status == "pass", outcome.detail


@needs_crosshair
@needs_backend
def test_crosshair_backend_falsifies_the_planted_counter() -> None:
    outcome = cc.run_check(_by_name("planted-backend-counter-dequeues-tail"))
    assert outcome.status == "pass", outcome.detail
    assert "events=" in outcome.detail


# ----------------------------------------------------------------------------- CLI glue
def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvspec")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["crosshair", *argv])


def _fake_run(statuses: dict[str, str]) -> Any:
    def run_check(check: cc.Check, scale: float = 1.0) -> cc.Outcome:
        return cc.Outcome(check.name, check.kind, statuses.get(check.name, "pass"), 0.5, "fake")

    return run_check


def test_cli_json_document_and_exit_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cc, "crosshair_available", lambda: True)
    monkeypatch.setattr(cc, "run_check", _fake_run({}))
    args = _args("--json")
    assert args.func(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in document["checks"]] == [c.name for c in cc.CHECKS]
    for entry in document["checks"]:
        assert {"name", "kind", "status", "seconds", "detail"} <= set(entry)
        assert entry["kind"] in cc.KINDS and entry["status"] in ("pass", "fail", "inconclusive")
    for status in ("fail", "inconclusive"):
        monkeypatch.setattr(cc, "run_check", _fake_run({"reservation-counter-vs-scan": status}))
        args = _args("--json", "--only", "reservation-*", "contract-reservation-counter")
        assert args.func(args) == 1
        names = [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]]
        assert names == ["reservation-counter-vs-scan", "contract-reservation-counter"]


def test_cli_could_not_run_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args("--only", "no-such-check")
    assert args.func(args) == 2
    assert "no-such-check" in capsys.readouterr().err
    args = _args("--budget-scale", "0")
    assert args.func(args) == 2
    monkeypatch.setattr(cc, "crosshair_available", lambda: False)
    args = _args("--json")
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "crosshair-tool is not installed" in captured.err


def test_cli_list_shows_budgets(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--list", "--planted", "--budget-scale", "2", "--json")
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)["checks"]
    assert len(rows) == len(cc.CHECKS) + len(cc.PLANTED)
    assert rows[0]["budget"] == 2 * cc.CHECKS[0].budget


@needs_crosshair
def test_cli_runs_a_real_check(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--json", "--only", "contract-per-step-admissions", "--budget-scale", "0.2")
    assert args.func(args) == 0, capsys.readouterr().out
    (entry,) = json.loads(capsys.readouterr().out)["checks"]
    assert entry["status"] == "pass" and "budget 10 uninteresting iterations" in entry["detail"]


def test_verify_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "crosshair_available", lambda: True)
    monkeypatch.setattr(cc, "run_check", _fake_run({}))
    status, summary = cli.verify_stage()
    assert status == "pass" and f"{len(cc.VERIFY_PLANTED)} planted bugs found" in summary
    monkeypatch.setattr(cc, "run_check", _fake_run({"reclaim-bounded-vs-legacy": "inconclusive"}))
    status, summary = cli.verify_stage()
    assert status == "fail" and "reclaim-bounded-vs-legacy: inconclusive" in summary
    monkeypatch.setattr(cc, "crosshair_available", lambda: False)
    assert cli.verify_stage()[0] == "skip"


@needs_crosshair
def test_kill_matrix_hook() -> None:
    pytest.importorskip("kvspec.mutants")
    killed = cc.check_mutant(SimpleNamespace(name="counter_not_decremented_on_dequeue"), 120.0)
    assert killed.checker == "crosshair" and killed.status == "killed", killed
    assert cc.check_mutant(SimpleNamespace(name="lifo_free_list"), 120.0).status == "n/a"
