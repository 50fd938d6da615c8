"""``kvspec crosshair``: CrossHair on the pure kernels (docs/design.md, "kvspec crosshair").

``kvspec crosshair [--json] [--only NAME ...] [--budget-scale X] [--planted] [--list]`` runs the
checks of :mod:`proofs.crosshair_checks` — ``diffbehavior`` between each legacy kernel and its
optimised counterpart, ``contract`` checks of the kernels' PEP 316 contracts, and ``backend``
property tests on Hypothesis' CrossHair backend — each with an explicit budget, and prints a table,
or with ``--json`` exactly one document
``{"checks": [{"name", "kind", "status", "seconds", "detail", "expected"}]}``. ``--planted`` adds
the planted-bug calibration checks (each passes when CrossHair *finds* its planted bug). ``--only``
takes names or ``fnmatch`` patterns and may name planted checks.

A check passes only when CrossHair spent its whole budget without an error and found nothing;
a difference, a violated contract or a falsified property fails; anything else (crash, timeout,
vacuous precondition) is ``inconclusive``. Exit status: 0 every check passed, 1 a check failed or
was inconclusive, 2 could not run (bad arguments, crosshair-tool not installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.markup import escape
from rich.table import Table

from kvspec.output import ERR, OUT, could_not_run

__all__ = ["add_parser", "cmd_crosshair", "verify_stage"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``crosshair`` to the ``kvspec`` sub-command parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "crosshair",
        help="CrossHair: legacy vs optimised kernels (diffbehavior), kernel contracts, "
        "hypothesis-crosshair properties",
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these checks (names or fnmatch patterns, e.g. 'contract-*'; planted ones too)",
    )
    p.add_argument(
        "--budget-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every budget (iterations, examples) and wall-clock guard by X (default 1)",
    )
    p.add_argument(
        "--planted", action="store_true", help="also run the planted-bug calibration checks"
    )
    p.add_argument("--list", action="store_true", help="list the checks and their budgets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_crosshair)
    return p


def _list(checks: list[Any], scale: float, as_json: bool) -> int:
    from proofs.crosshair_checks import scaled

    rows = [
        {
            "name": c.name,
            "kind": c.kind,
            "budget": scaled(c, scale)[0],
            "expected": c.expect,
            "quick": c.quick,
            "targets": list(c.targets),
            "about": c.about,
        }
        for c in checks
    ]
    if as_json:
        sys.stdout.write(json.dumps({"checks": rows}, indent=1) + "\n")
        return 0
    table = Table(title="kvspec crosshair checks")
    for column in ("name", "kind", "budget", "expected", "about"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["name"], r["kind"], str(r["budget"]), r["expected"], r["about"])
    OUT.print(table)
    return 0


def cmd_crosshair(args: argparse.Namespace) -> int:
    from proofs import crosshair_checks as cc

    scale = args.budget_scale
    if not scale > 0:
        return could_not_run(f"--budget-scale must be positive, got {scale}")
    try:
        chosen = cc.select(args.only, planted=args.planted)
    except ValueError as exc:
        return could_not_run(f"{exc} (see `kvspec crosshair --list --planted`)")
    if args.list:
        return _list(chosen, scale, args.json)
    if not cc.crosshair_available():
        return could_not_run("crosshair-tool is not installed (pip install crosshair-tool)")
    started = time.perf_counter()
    progress = not args.json

    def on_start(check: Any) -> None:
        if progress:
            ERR.print(f"[{chosen.index(check) + 1}/{len(chosen)}] {check.name} ({check.kind}) …")

    def on_result(o: Any) -> None:
        if progress:
            ERR.print(f"      {o.status} in {o.seconds:.1f}s")

    outcomes = cc.run(chosen, scale, on_result=on_result, on_start=on_start)
    seconds = time.perf_counter() - started
    ok = all(o.status == "pass" for o in outcomes)
    if args.json:
        sys.stdout.write(json.dumps({"checks": [o.to_json() for o in outcomes]}, indent=1) + "\n")
        return 0 if ok else 1
    table = Table(title=f"kvspec crosshair (budget scale {scale:g})")
    for column in ("check", "kind", "status", "seconds"):
        table.add_column(column, no_wrap=column == "check")
    colour = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
    for o in outcomes:
        name = o.name if o.expected == "pass" else f"{o.name} (planted)"
        table.add_row(name, o.kind, f"[{colour[o.status]}]{o.status}[/]", f"{o.seconds:.1f}")
    OUT.print(table)
    for o in outcomes:
        OUT.print(f"[bold]{o.name}[/]: {escape(o.detail)}", soft_wrap=True)
    bad = [o.name for o in outcomes if o.status != "pass"]
    OUT.print(
        f"{len(outcomes) - len(bad)}/{len(outcomes)} checks passed in {seconds:.1f} s"
        + (f"; not passed: {', '.join(bad)}" if bad else "")
    )
    return 0 if ok else 1


def verify_stage(quick: bool = False, jobs: int = 1) -> tuple[str, str]:
    """``kvspec verify``'s CrossHair stage at the checks' own budgets: the verify subset plus one
    planted bug per kernel pair, to show the budget sees bugs; with ``quick`` the smoke subset
    (the scheduler kernels, seconds each) and its planted bugs. ``jobs`` CrossHair runs at once.
    Returns ``(status, summary)``."""
    from proofs import crosshair_checks as cc

    if not cc.crosshair_available():
        return "skip", "crosshair-tool is not installed (pip install crosshair-tool)"
    names = cc.SMOKE_PLANTED if quick else cc.VERIFY_PLANTED
    planted = [c for c in cc.PLANTED if c.name in names]
    checks = [c for c in cc.CHECKS if (c.smoke if quick else c.quick)] + planted
    if not cc.hypothesis_crosshair_available():
        checks = [c for c in checks if c.kind != "backend"]
    started = time.perf_counter()
    outcomes = cc.run(checks, jobs=jobs)
    seconds = time.perf_counter() - started
    bad = [o for o in outcomes if o.status != "pass"]
    if bad:
        return "fail", "; ".join(f"{o.name}: {o.status}: {o.detail[:200]}" for o in bad)
    skipped = (
        ""
        if cc.hypothesis_crosshair_available()
        else " (backend checks skipped: pip install hypothesis-crosshair)"
    )
    return "pass", (
        f"{len(outcomes) - len(planted)} checks passed, {len(planted)} planted bugs found in "
        f"{seconds:.1f} s{skipped}"
    )
