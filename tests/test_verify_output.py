"""``kvspec verify``: the summary table (readable at 80 columns, messages not eaten as markup), the
exit status, and stages run side by side. The real end-to-end run is tests/test_fresh_install.py."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from rich.console import Console

from kvspec import verify
from kvspec.cli import main
from kvspec.commands.cmd_verify import brief, verify_table
from kvspec.verify import Stage

LONG = "; ".join(f"variant{i} 5,000 calls at 8,{i}00/s, 21 paths" for i in range(8))


def _render(stages: list[Stage], width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(verify_table(stages))
    return console.export_text()


def test_passing_summaries_are_brief_and_failures_and_skips_are_whole() -> None:
    hint = "smoke needs torch (pip install 'kvspec[smoke]')"
    text = _render(
        [
            Stage("fuzz vllm-arc (impl, 8 variants)", "pass", 7.0, LONG),
            Stage("planted bugs", "fail", 41.0, "34 killed; survived: a_mutant, another_one"),
            Stage("gpu smoke (tiny, CPU)", "skip", 0.0, hint),
        ]
    )
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert "variant1" not in flat and "variant0 5,000 calls" in flat  # first clause only
    assert "another_one" in flat  # a failure keeps its whole message
    assert "'kvspec[smoke]')" in flat  # the extra's name survives (not rich markup)
    assert "kvspec verify --json" in flat


def test_brief_cuts_at_the_first_clause_or_the_width() -> None:
    assert brief("a; b") == "a…"
    assert brief("short") == "short"
    cut = brief("x" * 100, width=20)
    assert len(cut) == 20 and cut.endswith("…")


# ----------------------------------------------------------------------------- running the stages
def _passes() -> tuple[str, str]:
    return "pass", f"ran in {os.getpid()}"


def _skips() -> tuple[str, str]:
    return "skip", "needs torch (pip install 'kvspec[smoke]')"


def _fails() -> tuple[str, str]:
    return "fail", "a planted failure"


def _crashes() -> tuple[str, str]:
    raise RuntimeError("boom")


def _fake_plan(*bodies: Any) -> Any:
    def plan(quick: bool, jobs: int = 1) -> list[tuple[str, Any]]:
        return [(f"stage {i}", body) for i, body in enumerate(bodies)] + [("bench x", _passes)]

    return plan


@pytest.mark.parametrize("jobs", [1, 2])
def test_stages_keep_plan_order_and_benches_run_last_in_this_process(monkeypatch, jobs) -> None:
    monkeypatch.setattr(verify, "plan", _fake_plan(_passes, _skips, _crashes, _passes))
    stages = verify.run_all(quick=True, show_progress=False, console=Console(), jobs=jobs)
    assert [s.name for s in stages] == ["stage 0", "stage 1", "stage 2", "stage 3", "bench x"]
    assert [s.status for s in stages] == ["pass", "skip", "fail", "pass", "pass"]
    assert "crashed: RuntimeError: boom" in stages[2].summary
    assert stages[-1].summary == f"ran in {os.getpid()}"  # a bench: never on a worker
    workers = {stages[0].summary, stages[3].summary}
    here = f"ran in {os.getpid()}"
    assert (workers == {here}) if jobs == 1 else (here not in workers)
    assert all(s.cpu_seconds >= 0 and s.seconds >= 0 for s in stages)


@pytest.mark.parametrize(
    ("bodies", "status"),
    [((_passes, _skips), 0), ((_passes, _fails), 1), ((_crashes,), 1)],
    ids=["pass-and-skip", "a-failure", "a-crash"],
)
def test_verify_exit_status(monkeypatch, capsys, bodies, status) -> None:
    """0 when no stage failed (a skip is not a failure), 1 when one failed; one JSON document
    whose stages carry the documented fields."""
    monkeypatch.setattr(verify, "plan", _fake_plan(*bodies))
    assert main(["verify", "--json", "--jobs", "1"]) == status
    doc = json.loads(capsys.readouterr().out)
    for stage in doc["stages"]:
        assert stage.keys() == {"name", "status", "seconds", "cpu_seconds", "summary"}
        assert stage["status"] in {"pass", "fail", "skip"}


def test_verify_rejects_zero_jobs(capsys) -> None:
    assert main(["verify", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
