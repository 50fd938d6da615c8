"""``kvspec check``: the hypothesis lockstep machine, spec (or a baseline) against a target."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from kvspec import runs
from kvspec.commands import common
from kvspec.output import ERR, OUT, UsageError
from stateful_tests.profiles import shrink_budget


def cmd_check(args: argparse.Namespace) -> int:
    from stateful_tests import profiles

    comp, variant, options = common.component_args(args)
    component = comp.name
    label, cls, reference, variant = runs.setup(args, comp, variant)
    try:
        settings = profiles.get(args.profile)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.json:
        ERR.print(
            f"checking {component}: target {escape(label)} against {escape(runs.against(reference))} "
            f"(hypothesis profile {args.profile})"
        )
    with shrink_budget(args.shrink_seconds):
        result = comp.check(
            cls,
            label,
            settings,
            variant=variant,
            inputs=args.inputs,
            timeout=args.call_timeout,
            reference=reference,
            **options,
        )
    cx = runs.counterexample(result, comp, cls, 10.0, options=options, reference=reference)
    document = {
        "component": component,
        "target": label,
        **runs.oracle_fields(reference),
        "variant": variant,
        "inputs": args.inputs,
        "examples": result.examples,
        "steps": result.steps,
        "passed": result.passed,
        "seconds": round(result.seconds, 2),
        **common.findings(comp, result, cx, args.inputs),
    }
    if not common.report(args, document):
        verdict = "[green]passed[/]" if result.passed else "[red]FAILED[/]"
        OUT.print(
            f"{component} {escape(label)} vs {escape(runs.against(reference))}: {verdict} — "
            f"{result.examples:,} programs, "
            f"{result.steps:,} lockstep calls, {result.seconds:.1f}s"
        )
    return 0 if result.passed else 1


def add_parser(sub: Any) -> None:
    """The ``check`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser("check", help="hypothesis lockstep machine: spec vs target")
    p.add_argument("component", help=f"one of {common.component_names()}")
    p.add_argument("--target", help=common.TARGET_HELP)
    p.add_argument("--profile", default="ci", help="hypothesis profile: ci, dev or deep")
    p.add_argument("--variant", help=f"{common.variants_help()} (default: drawn per run)")
    runs.oracle_options(p)
    runs.inputs_options(p, "all")
    common.add_checker_flags(p, "")
    p.add_argument(
        "--shrink-seconds",
        type=float,
        default=60.0,
        help="bound on hypothesis' shrinking time (default 60)",
    )
    p.add_argument("--coverage", action="store_true", help="print rule/path coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)
