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


def _diff_report(finding: str, **fields: Any) -> str:
    """What :mod:`proofs.crosshair_runner` prints for a diffbehavior run (after any noise)."""
    report = {
        "kind": "diffbehavior",
        "finding": finding,
        "iterations": 60,
        "exhausted": False,
        "nondeterministic": False,
        "diffs": [],
        "error": None,
        **fields,
    }
    return "noise\n" + json.dumps(report) + "\n"


GIVEN = _diff_report(
    "found",
    diffs=[
        {
            "args": {"refs": "[0, 0]", "num_free": "0", "num_required": "2"},
            "first": "returns ([1, 0], True)",
            "second": "returns ([1], False)",
        }
    ],
)
CLEAN = _diff_report("clean")
PLANTED_PAIR = (
    "spec.infinilm.kernels.reservations_by_scan",
    "proofs.crosshair_mutants.counter_skips_dequeue",
)


def _contract_report(*states: str, checkables: int = 2) -> str:
    messages = [
        {"state": st, "message": f"m{i}", "file": "k.py", "line": 3 + i, "function": None}
        for i, st in enumerate(states)
    ]
    report = {"kind": "contract", "checkables": checkables, "messages": messages, "error": None}
    return json.dumps(report) + "\n"


# ----------------------------------------------------------------------------- verdicts
def test_no_difference_after_the_whole_budget_is_a_pass() -> None:
    status, detail = cc.interpret(DIFF, 0, CLEAN, "")
    assert status == "pass"
    assert "60 iterations" in detail and "budget spent" in detail


def test_exhausted_paths_are_a_pass() -> None:
    out = _diff_report("clean", iterations=2, exhausted=True)
    assert cc.interpret(DIFF, 0, out, "") == (
        "pass",
        "no difference in 2 iterations; all paths exhausted",
    )


def test_a_difference_fails_with_the_example() -> None:
    status, detail = cc.interpret(DIFF, 0, GIVEN, "")
    assert status == "fail"
    assert "refs=[0, 0], num_free=0, num_required=2" in detail and "returns ([1], False)" in detail
    assert "f : returns ([1, 0], True)" in detail  # the function's name, not its module path


@pytest.mark.parametrize(
    ("rc", "out", "err", "timed_out"),
    [
        (1, "", "Traceback (most recent call last):\n  ...\nImportError: x", False),
        (0, _diff_report("inconclusive", error="NotFound: Name 'g' not found"), "", False),
        (0, _diff_report("inconclusive", nondeterministic=True), "", False),
        (0, _diff_report("clean", nondeterministic=True), "", False),
        (0, "", "", False),  # no report at all
        (0, "not json\n", "", False),
        (-1, "", "", True),  # wall clock ran out
    ],
    ids=[
        "crash",
        "could-not",
        "nondeterminism",
        "clean-but-nondeterministic",
        "silent",
        "text",
        "timeout",
    ],
)
def test_anything_else_is_inconclusive_never_a_pass(
    rc: int, out: str, err: str, timed_out: bool
) -> None:
    for check in (DIFF, PLANTED_DIFF):
        assert cc.interpret(check, rc, out, err, timed_out=timed_out)[0] == "inconclusive"


def test_contract_verdicts() -> None:
    ok = _contract_report("cannot_confirm", "confirmed")
    status, detail = cc.interpret(CONTRACT, 0, ok, "")
    assert status == "pass" and "2 postconditions" in detail and "1 confirmed" in detail
    for violated in ("post_fail", "exec_err"):
        status, detail = cc.interpret(CONTRACT, 0, _contract_report("confirmed", violated), "")
        assert status == "fail" and "k.py:4" in detail and "m1" in detail
    for unsure in ("pre_unsat", "post_err", "syntax_err", "import_err"):
        assert cc.interpret(CONTRACT, 0, _contract_report("confirmed", unsure), "")[0] == (
            "inconclusive"
        ), unsure
    no_contracts = _contract_report(checkables=0)
    assert cc.interpret(CONTRACT, 0, no_contracts, "")[0] == "inconclusive"
    assert cc.interpret(CONTRACT, 0, _contract_report(), "")[0] == "inconclusive"  # no messages
    assert cc.interpret(CONTRACT, 0, "", "")[0] == "inconclusive"
    broken = json.dumps({"kind": "contract", "finding": "inconclusive", "error": "ImportError: x"})
    status, detail = cc.interpret(CONTRACT, 0, broken, "")
    assert status == "inconclusive" and "ImportError: x" in detail


@needs_crosshair
def test_the_runner_reports_crosshair_results_as_json() -> None:
    """The real runner, through CrossHair's API, on a tiny pair: no difference between a kernel
    and itself, a difference for a planted off-by-one, and the contracts' message types."""
    import subprocess
    import sys

    def run(*args: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "proofs.crosshair_runner", *args],
            cwd=cc.ROOT,
            env=cc.environment(DIFF),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
        return report

    same = "spec.infinilm.kernels.reservations_by_scan"
    budget = ["--budget", "5", "--per-path-timeout", "5"]
    clean = run("diffbehavior", *budget, same, same)
    assert clean["finding"] == "clean" and clean["iterations"] > 0 and not clean["diffs"]
    found = run("diffbehavior", "--budget", "25", "--per-path-timeout", "5", *PLANTED_PAIR)
    assert found["finding"] == "found" and found["diffs"][0]["args"]
    contract = run("contract", *budget, "impl.infinilm.kernels.add_reservation")
    assert contract["checkables"] >= 1
    assert {m["state"] for m in contract["messages"]} <= {"confirmed", "cannot_confirm"}
    missing = run("diffbehavior", *budget, same, "spec.infinilm.kernels.no_such_kernel")
    assert missing["finding"] == "inconclusive" and "no_such_kernel" in missing["error"]


def _verdicts(*statuses: str, detail: str = "") -> str:
    results = [
        {"target": t, "status": st, "detail": detail}
        for t, st in zip(BACKEND.targets, statuses, strict=False)
    ]
    return "noise from the properties\n" + json.dumps({"results": results}) + "\n"


def test_backend_verdicts() -> None:
    """The backend runner's JSON decides: every property passed, one falsified, anything else is
    inconclusive (a missing verdict, an error such as an unsatisfiable strategy, no document)."""
    assert cc.interpret(BACKEND, 0, _verdicts("passed", "passed"), "")[0] == "pass"
    assert cc.interpret(BACKEND, 0, _verdicts("passed"), "")[0] == "inconclusive"  # one missing
    assert cc.interpret(BACKEND, 0, _verdicts("passed", "error"), "")[0] == "inconclusive"
    failing = _verdicts(
        "passed", "falsified", detail="Falsifying example: test_y(events=[0, 1, -1])"
    )
    status, detail = cc.interpret(BACKEND, 0, failing, "")
    assert status == "fail" and "events=[0, 1, -1]" in detail
    assert cc.interpret(BACKEND, 1, "", "Traceback …\nImportError: x\n")[0] == "inconclusive"


def test_the_backend_runner_reports_what_each_property_call_raised(tmp_path, monkeypatch) -> None:
    """No pytest and no printed report: a passing property, an assertion failure with its note,
    and a Hypothesis error (unsatisfiable) give passed / falsified / error."""
    from proofs import crosshair_backend

    (tmp_path / "kvspec_props_demo.py").write_text(
        "from hypothesis import given, settings, strategies as st\n"
        "@settings(max_examples=20, database=None)\n@given(st.integers())\n"
        "def test_ok(x):\n    assert x == x\n"
        "@settings(max_examples=50, database=None)\n@given(st.integers())\n"
        "def test_bad(x):\n    assert x < 5\n"
        "@settings(max_examples=5, database=None)\n@given(st.integers().filter(lambda x: False))\n"
        "def test_unsat(x):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    got = {
        t.rpartition("::")[2]: crosshair_backend.run_one(t)
        for t in (f"kvspec_props_demo.py::{n}" for n in ("test_ok", "test_bad", "test_unsat"))
    }
    assert got["test_ok"]["status"] == "passed"
    assert got["test_bad"]["status"] == "falsified" and "x=5" in got["test_bad"]["detail"]
    assert got["test_unsat"]["status"] == "error"
    assert crosshair_backend.run_one("nowhere.py::f")["status"] == "error"


def test_a_planted_check_passes_only_when_its_bug_is_found() -> None:
    status, detail = cc.interpret(PLANTED_DIFF, 0, GIVEN, "")
    assert status == "pass" and detail.startswith("planted bug found")
    status, detail = cc.interpret(PLANTED_DIFF, 0, CLEAN, "")
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
    from kvspec import components

    assert set(cc.CATALOGUE_KERNELS) <= set(components.catalogue())


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
    assert argv[argv.index("--budget") + 1] == str(3 * check.budget)
    assert argv[argv.index("--per-path-timeout") + 1] == str(check.per_path_timeout)
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


def test_verify_quick_stage_runs_the_smoke_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify --quick``: the smoke checks (a subset of the verify ones) and their planted bugs,
    the same verdicts whether run one at a time or side by side."""
    smoke = {c.name for c in cc.CHECKS if c.smoke}
    assert smoke and smoke <= {c.name for c in cc.CHECKS if c.quick}
    assert set(cc.SMOKE_PLANTED) <= set(cc.VERIFY_PLANTED)
    ran: list[str] = []
    monkeypatch.setattr(cc, "crosshair_available", lambda: True)
    fake = _fake_run({"planted-counter-skips-dequeue": "fail"})

    def record(check: cc.Check, scale: float = 1.0) -> cc.Outcome:
        ran.append(check.name)
        return fake(check, scale)

    monkeypatch.setattr(cc, "run_check", record)
    serial = cli.verify_stage(quick=True)
    assert sorted(ran) == sorted([*smoke, *cc.SMOKE_PLANTED])
    assert serial[0] == "fail" and "planted-counter-skips-dequeue" in serial[1]
    assert cli.verify_stage(quick=True, jobs=3) == serial


@needs_crosshair
def test_kill_matrix_hook() -> None:
    from kvspec import kill_matrix

    killed = kill_matrix.run_crosshair(
        SimpleNamespace(name="counter_not_decremented_on_dequeue"),  # type: ignore[arg-type]
        120.0,
    )
    assert killed.checker == "crosshair" and killed.status == "killed", killed
    lifo = SimpleNamespace(name="lifo_free_list")
    assert kill_matrix.run_crosshair(lifo, 120.0).status == "n/a"  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- ARC victim selection
# vLLM's ARC eviction kernels (reference §2.3, §7.1 O5/O6): spec.vllm.arc.rescan_victims vs
# impl.vllm.arc.one_pass_victims. The real pairs and the planted variants run in the parametrized
# tests above (test_real_pair_shows_no_difference, test_planted_bug_is_found,
# test_impl_kernel_contracts_hold); these pin the table, the adapters on the reference scenarios,
# and the equivalent variant.
ARC_REAL = ("arc-one-pass-vs-rescan", "arc-one-pass-vs-rescan-t1-fallback")
ARC_PLANTED = {  # planted check -> catalogue mutant whose bug it carries
    "planted-arc-restart-after-t2-pick": "arc_iterator_restarted_after_t2_pick",
    "planted-arc-stop-iteration": "arc_stop_iteration_on_exhausted_list",
    "planted-arc-missing-t1-fallback": "arc_missing_t1_fallback",
    "planted-arc-fallback-restarts-t1": "arc_fallback_restarts_t1_iterator",
}


def test_arc_checks_are_in_the_tables() -> None:
    checks = {c.name: c for c in (*cc.CHECKS, *cc.PLANTED, *cc.EQUIVALENT)}
    assert len(checks) == len(cc.CHECKS) + len(cc.PLANTED) + len(cc.EQUIVALENT)
    for name in ARC_REAL:
        assert checks[name].kind == "diffbehavior" and checks[name].expect == "pass"
    for name, mutant in ARC_PLANTED.items():
        assert checks[name].kind == "diffbehavior" and checks[name].expect == "found"
        assert checks[name].budget == cc.PLANTED_BUDGET
        assert cc.CATALOGUE_KERNELS[mutant] == name
    assert checks["contract-arc-one-pass"].quick
    assert checks["planted-contract-arc-restart-after-t2-pick"].expect == "found"
    for c in cc.EQUIVALENT:  # an equivalent variant passes when nothing is found
        assert c.kind == "diffbehavior" and c.expect == "pass"
        assert c.budget >= 4 * cc.PLANTED_BUDGET
        for target in c.targets:
            assert callable(_resolve(target)), (c.name, target)
    assert [c.name for c in cc.select(["equivalent-*"])] == [c.name for c in cc.EQUIVALENT]
    assert not {c.name for c in cc.EQUIVALENT} & {c.name for c in cc.select(None, planted=True)}


def test_arc_adapters_on_the_reference_scenarios() -> None:
    """Plain Python, no CrossHair: the adapters reproduce reference §2.3/§2.5 for both kernels."""
    from proofs import crosshair_pairs as pairs

    kernels = (pairs.arc_rescan_every_n, pairs.arc_one_pass_every_n)
    with_fallback = (
        pairs.arc_rescan_every_n_with_fallback,
        pairs.arc_one_pass_every_n_with_fallback,
    )
    # #50992 test: T1 = [loading, protected], T2 = [c, d] idle, target 0, evict(2) -> [c, d].
    for run in (*kernels, *with_fallback):
        assert run([False, False, True, True], 2, 0)[2] == [(-1, False), (-2, False)]
    # v matters: T1 = [a, b, c], T2 = [x, y] all idle, target 2, evict(3) -> [a, b, x].
    for run in (*kernels, *with_fallback):
        assert run([True] * 5, 3, 2)[3] == [(0, True), (1, True), (-1, False)]
    # §2.5 (#55461): T1 = [3] idle, T2 = [1] pinned, target 2, evict(1): None, or 3 with fallback.
    assert [run([True, False], 1, 2)[1] for run in kernels] == [None, None]
    assert [run([True, False], 1, 2)[1] for run in with_fallback] == [[(0, True)]] * 2
    for run in (*kernels, *with_fallback):  # out of the domain: the same error on both sides
        for entries, split, target in (([True], -1, 0), ([True], 2, 0), ([True], 0, -1)):
            with pytest.raises(ValueError, match="outside the domain"):
                run(entries, split, target)
    assert pairs.arc_one_pass_on_flags([True], [False], 0, 2) is None
    assert pairs.arc_one_pass_on_flags_with_fallback([True, True], [False], 5, 2) == [
        (0, True),
        (1, True),
    ]


def test_arc_planted_variants_differ_on_a_witness() -> None:
    """Plain Python: each planted ARC variant really is a bug (a witness input), and the
    equivalent variant agrees with the rescan on every input of a small scope (exhaustive)."""
    import itertools

    from proofs import crosshair_mutants as mutants
    from proofs import crosshair_pairs as pairs

    rescan, rescan_fb = pairs.arc_rescan_every_n, pairs.arc_rescan_every_n_with_fallback
    witnesses = [  # (legacy, variant, entries, split, target)
        (rescan, mutants.arc_restart_after_t2_pick, [True, True], 1, 0),
        (rescan_fb, mutants.arc_no_fallback_with_fallback, [True], 1, 2),
        (rescan_fb, mutants.arc_fallback_restarts_t1_with_fallback, [True], 1, 0),
    ]
    for legacy, variant, entries, split, target in witnesses:
        assert legacy(entries, split, target) != variant(entries, split, target), variant
    assert rescan([True], 0, 0)[1] == [(-1, False)]
    with pytest.raises(StopIteration):
        mutants.arc_stop_iteration([True], 0, 0)
    for size in range(5):
        for entries in itertools.product((False, True), repeat=size):
            for split, target in itertools.product(range(size + 1), range(size + 2)):
                args = (list(entries), split, target)
                assert mutants.arc_decrement_on_t2_pick(*args) == rescan(*args), args
                assert mutants.arc_decrement_on_t2_pick_with_fallback(*args) == rescan_fb(*args)


@needs_crosshair
def test_equivalent_arc_variant_shows_no_difference() -> None:
    """EVIDENCE OF EQUIVALENCE WITHIN THE BUDGET, NOT A PROOF: "virtual T1 size decremented on T2
    picks" (docs/vllm.md §2.3, O5; ``EQUIVALENT_MUTANTS`` in the catalogue) is not a bug. At the real
    pairs' budget — four times the one at which CrossHair finds every planted ARC bug — it reports
    no difference from the rescan. Why there is none is argued in
    ``proofs.crosshair_mutants._decrement_on_t2_pick``. The catalogue runs it without the T1
    fallback, as here; ``kvspec crosshair --only 'equivalent-*'`` adds the fallback pair (also no
    difference, ~15 s), and test_arc_planted_variants_differ_on_a_witness checks both
    exhaustively on every input of up to four entries."""
    check = next(c for c in cc.EQUIVALENT if c.name == "equivalent-arc-decrement-on-t2-pick")
    outcome = cc.run_check(check)
    assert outcome.status == "pass", outcome.detail
    assert outcome.detail.startswith("no difference"), outcome.detail


def test_a_planted_method_variant_is_the_real_method_with_one_change() -> None:
    """The planted ``try_free_blocks`` variants are the production method's own source with one
    substitution: a substitution that no longer matches exactly once is an error, never a silent
    copy of the real method."""
    from proofs import crosshair_mutants as m

    widened = m.method_on_pages(m._method_with("if limit <= 1:", "if limit <= 2:"))
    assert widened([0, 0], 0, 2) == ([1], False)  # one page evicted where legacy evicts two
    with pytest.raises(RuntimeError, match="occurs 0 times"):
        m._method_with("no such line", "x")
    with pytest.raises(RuntimeError, match="occurs 2 times"):
        m._method_with("if blocks[page].ref_count == 0:", "if True:")
