"""``kvspec replay``: re-run a saved counterexample trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from kvspec import components, runs
from kvspec.commands.common import add_checker_flags
from kvspec.output import OUT, UsageError, emit, print_counterexample
from kvspec.targets import load_reference, load_target


def cmd_replay(args: argparse.Namespace) -> int:
    from stateful_tests.lockstep import load_trace

    try:
        document = load_trace(Path(args.trace))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read trace: {exc}") from None
    comp = components.get(str(document["component"]))
    component = comp.name
    options = components.options_of(comp, vars(args))
    label, cls = load_target(component, args.target or document["target"])
    oracle = document.get("oracle") or {}
    kind = args.oracle or (None if args.baseline else oracle.get("kind"))
    baseline = args.baseline or (oracle.get("label") if kind == "baseline" else None)
    reference = load_reference(component, kind, baseline, label)
    result = comp.replay(
        document,
        cls,
        label,
        inputs=args.inputs,
        timeout=args.call_timeout,
        reference=reference,
        **options,
    )
    cx = runs.counterexample(result, comp, save=False)
    out = {
        "component": component,
        "target": label,
        **runs.oracle_fields(reference),
        "inputs": args.inputs or document.get("inputs", "all"),
        "examples": 1,
        "steps": result.steps,
        "passed": result.passed,
        "counterexample": cx,
    }
    emit(out, args.json)
    if not args.json:
        if cx:
            print_counterexample(cx)
        OUT.print(
            f"replay of {args.trace} on {escape(label)} vs {escape(runs.against(reference))}: "
            + ("[green]all steps agree[/]" if result.passed else "[red]diverges[/]")
        )
    return 0 if result.passed else 1


def add_parser(sub: Any) -> None:
    """The ``replay`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser("replay", help="re-run a saved counterexample trace")
    p.add_argument("trace", help="a trace file written by check or fuzz")
    p.add_argument("--target", help="override the trace's target")
    runs.oracle_options(p, replay=True)
    runs.inputs_options(p, None)
    add_checker_flags(p, "re-check: ")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)
