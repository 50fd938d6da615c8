"""``kvspec figures``: the README's figure tables come from one measured run.

The rendering and the README rewrite are checked on synthetic documents (no timing involved); one
end-to-end run measures the fuzz section at a tiny size and rewrites a scratch README.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvspec import components, figures
from kvspec.cli import main

README = Path(__file__).resolve().parents[1] / "docs" / "figures.md"

DOC: dict[str, Any] = {
    "date": "2026-12-02",
    "python": "3.11.7",
    "cpus": 2,
    "quick": False,
    "bench": [
        {
            "suite": "reclaim",
            "rows": [
                {
                    "case": {
                        "pages": 512,
                        "unreferenced": 256,
                        "requested": 1,
                        "calls": 16,
                        "pr_ratio": 19.0,
                    },
                    "baseline_us": 25.0,
                    "impl_us": 1.0,
                    "ratio": 25.0,
                    "goal": 19.0,
                    "meets_goal": True,
                },
                {
                    "case": {
                        "pages": 8192,
                        "unreferenced": 4096,
                        "requested": 1,
                        "calls": 16,
                        "pr_ratio": 315.0,
                    },
                    "baseline_us": 1500.0,
                    "impl_us": 10.0,
                    "ratio": 150.0,
                    "goal": 315.0,
                    "meets_goal": False,
                },
            ],
        }
    ],
    "fuzz": [
        {
            "component": "c",
            "target": "impl",
            "variant": None,
            "ops": 1000,
            "seconds": 0.02,
            "ops_per_second": 50_000,
            "cpu_seconds": 0.025,
            "calls_per_cpu_second": 40_000,
            "passed": True,
        },
    ],
    "explore": [
        {
            "component": "c",
            "target": "impl",
            "variant": "a",
            "bounds": {"pages": 3, "variants": ["a", "b"]},
            "complete": False,
            "passed": False,
            "distinct_states": 1234,
            "edges": 5678,
            "seconds": 1.5,
            "states_per_second": 822,
            "edges_per_second": 3785,
            "peak_memory_mb": 64.2,
        },
        {
            "component": "d",
            "target": "impl",
            "variant": None,
            "bounds": {"pages": 2},
            "complete": True,
            "passed": True,
            "distinct_states": 100,
            "edges": 900,
            "seconds": 3.0,
            "states_per_second": 33,
            "edges_per_second": 300,
            "peak_memory_mb": 50.0,
            "rest_over_calls": 0.4,
            "two_workers": {
                "complete": True,
                "passed": True,
                "distinct_states": 100,
                "seconds": 2.0,
                "transferred_states": 40,
                "replayed_paths": 0,
                "peak_memory_mb": 90.0,
                "parallel_efficiency": 0.87,
            },
        },
    ],
}


def test_bench_table_has_every_row_with_pr_and_goal_verdict() -> None:
    table = figures.render_bench(DOC)
    lines = [line for line in table.splitlines() if line.startswith("| reclaim")]
    assert len(lines) == 2
    assert "pages=512, unreferenced=256, requested=1 |" in lines[0]  # calls and PR are not case
    assert "| 25.0× | 19× | ≥ 19× ✓ |" in lines[0]
    assert "| 1,500 | 10.00 | 150.0× | 315× | ≥ 315× ✗ |" in lines[1]
    assert "2026-12-02" in table and "2 CPUs" in table


def test_fuzz_and_explore_tables_show_throughput_and_incompleteness() -> None:
    fuzz = figures.render_fuzz(DOC)
    assert "| `c` | — | 1,000 | 0.0 | 50,000 | 40,000 | 0 |" in fuzz
    explore = figures.render_explore(DOC)
    assert "| `c` | a | pages=3, variants=a/b |" in explore
    assert "**no** (time limit), **violation**" in explore
    assert "| 1,234 | 5,678 | 822 | 3,785 | 64 MB | 1.5 s | — | — | — | — |" in explore
    assert "| 100 | 900 | 33 | 300 | 50 MB | 3.0 s | 0.40 | 2.0 s | 1.50× | 87% |" in explore
    slow = {"explore": [{**DOC["explore"][1], "rest_over_calls": 3.25}]}
    assert "| 3.0 s | **3.25** |" in figures.render_explore({**DOC, **slow})
    assert list(figures.failures(DOC)) == ["explore c: violation"]
    other = {
        "explore": [{**DOC["explore"][1], "two_workers": {**two_workers(), "distinct_states": 101}}]
    }
    assert "(**101 states**)" in figures.render_explore({**DOC, **other})
    assert list(figures.failures(other)) == ["explore d on two workers: another number of states"]


def two_workers() -> dict[str, Any]:
    found: dict[str, Any] = DOC["explore"][1]["two_workers"]
    return dict(found)


def test_update_readme_replaces_only_the_marked_blocks(tmp_path: Path) -> None:
    start, end = figures.markers("fuzz")
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{start}\nold table\n{end}\nafter \\1 text\n")
    table = figures.render_fuzz(DOC) + "\n| a \\1 backslash |"
    assert figures.update_readme(readme, {"fuzz": table}) == ["fuzz"]
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith(f"{end}\nafter \\1 text\n")
    assert "old table" not in text and "a \\1 backslash" in text and "50,000" in text


def test_update_readme_without_markers_writes_nothing(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(ValueError, match="figures:bench:start"):
        figures.update_readme(readme, {"bench": "x"})
    assert readme.read_text() == "no markers here\n"


def test_the_figures_page_has_every_marker_pair() -> None:
    text = README.read_text()
    for section in figures.SECTIONS:
        start, end = figures.markers(section)
        assert text.count(start) == 1 and text.count(end) == 1
        assert text.index(start) < text.index(end)


def test_bad_arguments_exit_2_before_measuring(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["figures", "--only", "bench,nope"]) == 2
    readme = tmp_path / "README.md"
    readme.write_text("nothing\n")
    assert main(["figures", "--only", "fuzz", "--update-readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert "figures:fuzz:start" in err
    assert readme.read_text() == "nothing\n"


def test_one_run_measures_and_rewrites_the_readme(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    start, end = figures.markers("fuzz")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{start}\n{end}\n")
    rc = main(
        ["figures", "--only", "fuzz", "--fuzz-ops", "300", "--update-readme", str(readme), "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["failures"] == []
    names = [c.name for c in components.all_components()]
    assert [r["component"] for r in doc["fuzz"]] == names
    assert all(r["ops"] >= 300 and r["ops_per_second"] > 0 for r in doc["fuzz"])
    text = readme.read_text()
    for name in names:
        assert f"| `{name}` |" in text


def test_an_explore_figure_comes_from_its_own_process() -> None:
    """The explorer runs in a fresh interpreter per component, so its peak memory is its own."""
    doc = figures._explore_in_child("vllm-lru", "v2", 60.0)
    assert doc["complete"] and not doc["violations"]
    assert doc["distinct_states"] > 0 and doc["edges_per_second"] > 0
    assert 0 < doc["peak_memory_mb"] < 2_000
    with pytest.raises(RuntimeError, match="no-such-component"):
        figures._explore_in_child("no-such-component", None, 1.0)


def test_a_child_reports_its_own_peak_memory_not_its_parents() -> None:
    """Linux's ru_maxrss survives fork and exec; the explorer's figure must not."""
    import subprocess
    import sys

    ballast = bytearray(300 << 20)  # this process's peak is now over 300 MB
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page
    code = "from proofs.explorer.engine import peak_mb; print(peak_mb())"
    child = float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    del ballast
    assert 0 < child < 200


def test_scenario_cases_keep_their_scenario_in_the_label() -> None:
    """prefix-cache and radix have one row per (scenario, size): without the scenario the
    table would show three rows per size that look alike."""
    from kvspec.figures import case_label

    labels = {
        case_label("radix", {"scenario": s, "prompts": 128})
        for s in ("match_hit", "insert_cached", "evict_one")
    }
    assert labels == {
        "scenario=match_hit, prompts=128",
        "scenario=insert_cached, prompts=128",
        "scenario=evict_one, prompts=128",
    }
