"""``kvspec prove``: the z3 theorems of ``proofs/`` (docs/design.md, "kvspec prove").

``kvspec prove [--json] [--only NAME ...] [--timeout-ms N]`` checks every theorem (or those named;
``fnmatch`` patterns such as ``'admission_*'`` work) and prints a table, or with ``--json`` exactly
one document ``{"theorems": [{"name", "expected", "status", "seconds", "detail"}]}``. A theorem
passes when its status equals its expected outcome; ``unknown`` and timeouts are ``failed``.
Exit status: 0 every theorem as expected, 1 some theorem not, 2 bad arguments (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvspec.output import ERR, OUT, could_not_run


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``prove`` to the ``kvspec`` sub-command parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "prove", help="z3 theorems: reservation arithmetic, admission soundness, counters, ARC"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these theorems (exact names or fnmatch patterns, e.g. 'admission_*')",
    )
    p.add_argument(
        "--timeout-ms",
        type=int,
        default=None,
        metavar="N",
        help="z3 budget per theorem in ms, for every theorem (default: each theorem's own)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_prove)
    return p


def cmd_prove(args: argparse.Namespace) -> int:
    from proofs import theorems
    from proofs.z3_core import describe

    if args.timeout_ms is not None and args.timeout_ms <= 0:
        return could_not_run(f"--timeout-ms must be positive, got {args.timeout_ms}")
    try:
        chosen = theorems.select(args.only)
    except ValueError as exc:
        return could_not_run(f"{exc} (see `kvspec prove` for the list)")
    started = time.perf_counter()
    if not args.json and ERR.is_terminal:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=ERR,
            transient=True,
        ) as bar:
            task = bar.add_task("prove", total=len(chosen))
            results = theorems.run(chosen, args.timeout_ms, lambda r: bar.advance(task))
    else:
        results = theorems.run(chosen, args.timeout_ms)
    seconds = time.perf_counter() - started
    ok = all(r.passed for r in results)
    if args.json:
        document = {"theorems": [r.to_json() for r in results]}
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
        return 0 if ok else 1
    table = Table(title="kvspec prove (z3)")
    table.add_column("theorem", no_wrap=True)
    for column in ("expected", "status", "seconds", "detail"):
        table.add_column(column, overflow="fold")
    for r in results:
        colour = "green" if r.passed else "red"
        mark = "✓" if r.passed else "✗"
        detail = f"refuted: {', '.join(r.models)}" if r.models else r.detail
        table.add_row(
            r.name, r.expected, f"[{colour}]{mark} {r.status}[/]", f"{r.seconds:.3f}", detail
        )
    OUT.print(table)
    for r in results:
        for obligation, values in r.models.items():
            OUT.print(
                f"[bold]{r.name}[/] — counterexample to "
                f"{describe(obligation, values, r.notes.get(obligation))}",
                soft_wrap=True,
            )
    bad = [r.name for r in results if not r.passed]
    OUT.print(
        f"{len(results) - len(bad)}/{len(results)} theorems as expected in {seconds:.1f} s"
        + (f"; not as expected: {', '.join(bad)}" if bad else "")
    )
    return 0 if ok else 1


def verify_stage() -> tuple[str, str]:
    """``kvspec verify``'s z3 stage: every theorem at its own budget; ``(status, summary)``."""
    from proofs import theorems

    started = time.perf_counter()
    results = theorems.run(theorems.THEOREMS.values())
    seconds = time.perf_counter() - started
    bad = [r for r in results if not r.passed]
    if bad:
        return "fail", "; ".join(
            f"{r.name}: expected {r.expected}, got {r.status} ({r.detail[:160]})" for r in bad
        )
    proved = sum(r.status == "proved" for r in results)
    refuted = [r.name for r in results if r.status == "counterexample"]
    return "pass", (
        f"{len(results)} theorems as expected in {seconds:.1f} s: {proved} proved, "
        f"{len(refuted)} refuted as expected ({', '.join(refuted)})"
    )
