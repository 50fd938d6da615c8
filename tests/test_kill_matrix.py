"""The kill matrix: every catalogued mutant is killed within budget; a non-bug survives; the
README table is written between its markers; the CLI's arguments are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.infinilm.block_manager import BlockManager
from kvspec import components
from kvspec import kill_matrix as mutants
from kvspec.cli import main
from stateful_tests.checker import Mutant

CATALOGUE = components.catalogue()

BUDGET = 30.0


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_mutant_is_killed_by_the_fuzzer_within_budget(name: str) -> None:
    """CI's assertion of the issue: each planted bug is caught by at least one checker in time
    (the fuzzer is the cheapest that applies to all; the full matrix adds the others)."""
    row = mutants.run_matrix([CATALOGUE[name]], ["fuzzer"], BUDGET)[0]
    attempt = row.attempts[0]
    assert attempt.status == "killed", attempt
    # 0 steps: the target differs as soon as it is built (G7: a usage figure that is never 0)
    assert attempt.repro_steps is not None and attempt.repro_steps >= 0


def test_a_correct_class_survives_and_fails_the_matrix() -> None:
    honest = Mutant("honest", "none", BlockManager, "none", component="infinilm-block-manager")
    row = mutants.run_matrix([honest], ["fuzzer"], 1.0)[0]
    assert row.killed_by == [] and row.attempts[0].status == "survived"
    assert mutants.summary([row])["survivors"] == ["honest"]


def test_the_hypothesis_checker_reports_time_to_first_failure_and_repro() -> None:
    row = mutants.run_matrix([CATALOGUE["reclaim_evicts_referenced_page"]], ["hypothesis"], 30)[0]
    a = row.attempts[0]
    assert a.status == "killed" and a.check is not None
    assert a.seconds is not None and a.seconds < 30 and a.repro_steps is not None


def test_update_readme_rewrites_only_between_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{mutants.README_START}\nold\n{mutants.README_END}\noutro\n")
    rows = mutants.run_matrix([CATALOGUE["lifo_free_list"]], ["fuzzer"], BUDGET)
    mutants.update_readme(readme, mutants.markdown(rows, ["fuzzer"], BUDGET))
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert "`lifo_free_list`" in text and "1/1 killed" in text
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        mutants.update_readme(readme, "x")


def test_cli_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["mutants", "--only", "lifo_free_list", "--checkers", "fuzzer", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    (row,) = document["mutants"]
    assert row["name"] == "lifo_free_list" and row["killed_by"] == ["fuzzer"]
    assert row["origin"] and row["seconds_to_kill"] is not None and row["repro_steps"] >= 1
    assert document["summary"]["killed"] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["mutants", "--checkers", "nonsense"],
        ["mutants", "--only", "no_such_mutant"],
        ["mutants", "--budget", "0"],
    ],
)
def test_cli_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1
