"""``kvspec fuzz``: the seeded differential fuzzer."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.markup import escape

from kvspec import runs
from kvspec.commands import common
from kvspec.output import OUT, UsageError, progress


def cmd_fuzz(args: argparse.Namespace) -> int:
    comp, variant, options = common.component_args(args)
    component = comp.name
    if args.ops <= 0:
        raise UsageError(f"--ops must be positive, got {args.ops}")
    label, cls, reference, variant = runs.setup(args, comp, variant)
    _ = comp.checker_def  # (its modules imported before the CPU clock starts)
    cpu_started = time.process_time()
    with progress(f"fuzz {component} vs {label}", args.ops, not args.json) as update:
        result = comp.fuzz(
            cls,
            label,
            args.ops,
            args.seed,
            variant=variant,
            progress=update,
            inputs=args.inputs,
            timeout=args.call_timeout,
            reference=reference,
            **options,
        )
    cpu_seconds = time.process_time() - cpu_started
    shrink = 0.0 if args.no_shrink else 10.0
    cx = runs.counterexample(result, comp, cls, shrink, options=options, reference=reference)
    document = {
        "component": component,
        "target": label,
        **runs.oracle_fields(reference),
        "variant": variant,
        "inputs": args.inputs,
        "ops": result.steps,
        "seed": args.seed,
        "seconds": round(result.seconds, 3),
        "ops_per_second": round(result.steps / result.seconds) if result.seconds else None,
        # every op is one lockstep call (for the scheduler: one engine event), all checks run;
        # per CPU second too, the steadier figure on a shared machine
        "calls_per_second": round(result.steps / result.seconds, 1) if result.seconds else None,
        "cpu_seconds": round(cpu_seconds, 3),
        "calls_per_cpu_second": round(result.steps / cpu_seconds, 1) if cpu_seconds else None,
        "divergences": 0 if result.passed else 1,
        **common.findings(comp, result, cx, args.inputs),
    }
    if not common.report(args, document):
        OUT.print(
            f"fuzz {component} {escape(label)} vs {escape(runs.against(reference))}: "
            f"{result.steps:,} ops in {result.seconds:.1f}s "
            f"({document['ops_per_second'] or 0:,} ops/s), seed {args.seed}: "
            + ("[green]no divergence[/]" if result.passed else "[red]DIVERGENCE[/]")
        )
    return 0 if result.passed else 1


def add_parser(sub: Any) -> None:
    """The ``fuzz`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser("fuzz", help="seeded differential fuzzer (no hypothesis overhead)")
    p.add_argument("component", help=f"one of {common.component_names()}")
    p.add_argument("--target", help=common.TARGET_HELP)
    p.add_argument("--ops", type=int, default=100_000, help="lockstep calls to make")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shrink", action="store_true", help="keep the raw failing episode")
    p.add_argument("--variant", help=f"{common.variants_help()} (default: drawn per episode)")
    runs.oracle_options(p)
    runs.inputs_options(p, "all")
    common.add_checker_flags(p, "")
    p.add_argument("--coverage", action="store_true", help="print rule/path coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fuzz)
