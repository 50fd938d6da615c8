"""``kvspec verify``'s summary table: readable at 80 columns, messages not eaten as markup."""

from __future__ import annotations

from rich.console import Console

from kvspec.cli import brief, verify_table
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
