"""``kvspec bench``: baseline and impl side by side, as ratios."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from kvspec import components
from kvspec.output import OUT, UsageError, could_not_run, emit, progress


def cmd_bench(args: argparse.Namespace) -> int:
    from kvspec import plots
    from kvspec.bench import run_suite

    suites = components.bench_suites()
    if args.suite not in suites:
        raise UsageError(f"unknown bench suite {args.suite!r}; choose one of {', '.join(suites)}")
    if args.rounds is not None and args.rounds < 7:
        raise UsageError("--rounds must be at least 7")
    if args.plot:
        plots.require()  # before measuring: exit 2 with the extra's name
    from kvspec.bench import BenchMismatch

    try:
        with progress(f"bench {args.suite}", None, not args.json):
            rows = run_suite(args.suite, quick=args.quick, rounds=args.rounds)
    except BenchMismatch as exc:  # the two sides did different work: no ratio to report
        could_not_run(f"bench {args.suite}: {exc}")
        return 1
    document = {"suite": args.suite, "rows": [r.to_json() for r in rows]}
    if args.plot:
        document["plot"] = str(plots.bench(document, args.plot))
    emit(document, args.json)
    if not args.json:
        table = Table(
            title=f"bench {args.suite}: baseline = spec (legacy algorithm), impl = production"
        )
        for column in ("case", "baseline µs", "impl µs", "ratio", "goal"):
            table.add_column(column, justify="right")
        for r in rows:
            goal = "" if r.goal is None else f"≥{r.goal:g}× " + ("✓" if r.ratio >= r.goal else "✗")
            table.add_row(
                ", ".join(f"{k}={v}" for k, v in r.case.items()),
                f"{r.baseline_us:,.2f}",
                f"{r.impl_us:,.2f}",
                f"{r.ratio:,.2f}×",
                goal,
            )
        OUT.print(table)
        if args.plot:
            OUT.print(f"plot: {document['plot']}")
    return 0


def add_parser(sub: Any) -> None:
    """The ``bench`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser("bench", help="side-by-side benchmarks: baseline vs impl, as ratios")
    p.add_argument("suite", help=f"one of {', '.join(components.bench_suites())}")
    p.add_argument("--quick", action="store_true", help="fewer cases and rounds")
    p.add_argument("--rounds", type=int, help="rounds per case (median; at least 7)")
    p.add_argument("--plot", metavar="FILE.png", help="ratio against size (needs kvspec[plot])")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
