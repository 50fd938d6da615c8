"""``kvspec verify``: every stage on embedded defaults, and its summary table."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from kvspec.output import ERR, OUT, UsageError, emit


def cmd_verify(args: argparse.Namespace) -> int:
    """Every stage that exists, on embedded defaults, with a summary table."""
    from kvspec import verify

    jobs = verify.default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    stages = verify.run_all(quick=args.quick, show_progress=not args.json, console=ERR, jobs=jobs)
    emit({"stages": [s.to_json() for s in stages]}, args.json)
    if not args.json:
        OUT.print(verify_table(stages))
    return 1 if any(s.status == "fail" for s in stages) else 0


BRIEF = 44  # characters of a passing stage's summary in the table (80 columns; --json has all)


def brief(summary: str, width: int = BRIEF) -> str:
    """A passing stage's summary shortened to its first clause, at most ``width`` characters."""
    first = summary.split("; ")[0]
    more = first != summary
    if len(first) > width:
        first, more = first[: width - 1].rstrip(" ,:/"), True
    return first + ("…" if more else "")


def verify_table(stages: Sequence[Any]) -> Table:
    """The summary: one row per stage; a failure or a skip keeps its whole message (what failed,
    what to install), a pass its first figures. Every text is escaped: an extra such as
    ``kvspec[smoke]`` is not console markup."""
    table = Table(title="kvspec verify", caption="details: kvspec verify --json")
    table.add_column("stage", overflow="fold", ratio=2)
    table.add_column("status", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    table.add_column("summary", overflow="fold", ratio=3)
    colour = {"pass": "green", "fail": "red", "skip": "yellow"}
    for s in stages:
        text = brief(s.summary) if s.status == "pass" else s.summary
        table.add_row(
            escape(s.name), f"[{colour[s.status]}]{s.status}[/]", f"{s.seconds:.0f}", escape(text)
        )
    return table


def add_parser(sub: Any) -> None:
    """The ``verify`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser("verify", help="run every stage on embedded defaults")
    p.add_argument("--quick", action="store_true", help="smaller budgets (smoke run)")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="checking stages side by side on N processes (default: the CPUs available; "
        "1 runs everything in this process)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)
