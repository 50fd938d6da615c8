"""``kvspec diff COMPONENT OLD NEW``: "unchanged behaviour" of NEW against OLD, no spec needed.

The short form of ``check``, ``fuzz`` and ``explore`` with ``--target NEW --baseline OLD``: the
hypothesis machine (profile ``ci``), the seeded fuzzer and the explorer at the component's default
scope, each driving OLD where it drives the spec — equal return values, exceptions and snapshots
(eviction order included), every invariant checked on both sides. OLD and NEW are any target
text: ``impl``, ``MOD:CLASS``, ``FILE.py:CLASS``, an engine at a source (``git:../vllm@main``,
``vllm@/tmp/vllm-0.33.0-….whl``, a tree). Exit 0: no stage found a difference; 1: one did (the
shrunk counterexample printed and saved); 2: could not run (one line).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvspec import components
from kvspec.output import ERR, OUT, TRACE_DIR, UsageError, emit, print_counterexample, progress

STAGES = ("check", "fuzz", "explore")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff",
        help="revision against revision: check, fuzz and explore NEW with OLD as the oracle",
    )
    p.add_argument("component", help=f"one of {', '.join(components.names())}")
    p.add_argument("old", help="the baseline (any --target form, e.g. git:../vllm@main)")
    p.add_argument("new", help="the revision checked (e.g. git:../vllm@HEAD)")
    p.add_argument("--variant", help=components.describe_variants())
    p.add_argument("--ops", type=int, default=20_000, help="fuzzer calls (default 20,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--explore-seconds",
        type=float,
        default=120.0,
        help="time limit of the explorer stage (default 120; 0 leaves the stage out)",
    )
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated subset of {', '.join(STAGES)} (default: all)",
    )
    from kvspec.runs import inputs_options

    inputs_options(p, "all")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    from kvspec.runs import against, counterexample
    from kvspec.targets import load_reference, load_target, resolve_variant
    from stateful_tests import profiles

    comp = components.get(args.component)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise UsageError(f"--stages: choose from {', '.join(STAGES)} (got {args.stages!r})")
    if args.ops <= 0:
        raise UsageError(f"--ops must be positive, got {args.ops}")
    if args.explore_seconds == 0 or comp.explorer is None:
        stages = [s for s in stages if s != "explore"]
    label, cls = load_target(comp.name, args.new)
    reference = load_reference(comp.name, None, args.old, label)
    note = None if args.json else (lambda text: ERR.print(text))
    variant = resolve_variant(comp, comp.check_variant(args.variant), cls, reference, note)
    options = comp.fixed_options
    rows: list[dict[str, Any]] = []
    first_cx: dict[str, Any] | None = None
    if not args.json:
        ERR.print(f"diff {comp.name}: {label} against {against(reference)}")
    for stage in stages:
        started = time.perf_counter()
        row: dict[str, Any] = {"stage": stage}
        with progress(f"diff {stage}", None, not args.json):
            if stage == "check":
                result = comp.check(
                    cls,
                    label,
                    profiles.get("ci"),
                    variant=variant,
                    inputs=args.inputs,
                    reference=reference,
                )
                row |= {"examples": result.examples, "calls": result.steps}
                cx = counterexample(result, comp, cls, 10.0, True, options, reference)
                passed = result.passed
            elif stage == "fuzz":
                result = comp.fuzz(
                    cls,
                    label,
                    args.ops,
                    args.seed,
                    variant=variant,
                    inputs=args.inputs,
                    reference=reference,
                )
                row |= {"calls": result.steps, "seed": args.seed}
                cx = counterexample(result, comp, cls, 10.0, True, options, reference)
                passed = result.passed
            else:
                passed, cx = _explore(comp, cls, label, variant, args, reference, row)
        row |= {
            "status": row.get("status") or ("pass" if passed else "fail"),
            "seconds": round(time.perf_counter() - started, 2),
            "counterexample": cx,
        }
        rows.append(row)
        first_cx = first_cx or cx
        if not passed:
            break  # one difference is the verdict; later stages would only repeat it
    unchanged = all(r["status"] != "fail" for r in rows)
    document = {
        "component": comp.name,
        "baseline": reference.label,
        "target": label,
        "variant": variant,
        "inputs": args.inputs,
        "stages": rows,
        "unchanged": unchanged,
    }
    emit(document, args.json)
    if not args.json:
        for r in rows:
            extra = ", ".join(
                f"{k} {v}" if isinstance(v, bool) or not isinstance(v, int) else f"{k} {v:,}"
                for k, v in r.items()
                if k in ("examples", "calls", "states", "edges", "complete", "reason")
            )
            OUT.print(f"  {r['stage']}: {r['status']} ({extra}; {r['seconds']:.1f}s)")
        if first_cx:
            print_counterexample(first_cx)
        verdict = "[green]unchanged[/]" if unchanged else "[red]CHANGED[/]"
        OUT.print(f"diff {comp.name} {reference.label} -> {label}: {verdict}")
    return 0 if unchanged else 1


def _explore(
    comp: components.Component,
    cls: Any,
    label: str,
    variant: str | None,
    args: argparse.Namespace,
    reference: Any,
    row: dict[str, Any],
) -> tuple[bool, dict[str, Any] | None]:
    """The explorer at the component's default scope; a target it cannot copy is a skip."""
    from kvspec.exploration import explore_component
    from proofs import explorer

    chosen = [variant] if variant else list(comp.target_variants(cls) or comp.variants or ("",))
    overrides = {"bad_inputs": False} if args.inputs == "well-formed" else {}
    bounds_cls = components.resolve(comp.explorer.bounds) if comp.explorer else None
    if bounds_cls is None or "bad_inputs" not in explorer.bound_names(bounds_cls):
        overrides = {}
    try:
        result = explore_component(
            comp,
            cls,
            label,
            variants=chosen,
            overrides=overrides,
            deadline=time.perf_counter() + args.explore_seconds,
            save_dir=TRACE_DIR,
            inputs=args.inputs,
            reference=reference,
        )
    except explorer.ExplorerUnsupported as exc:
        row |= {"status": "skip", "reason": str(exc)}
        return True, None
    doc = result.to_json()
    row |= {
        "states": doc["distinct_states"],
        "edges": doc.get("edges"),
        "complete": doc["complete"],
    }
    if result.passed:
        return True, None
    violation = (doc.get("violations") or [{}])[0]
    return False, {
        "check": violation.get("check"),
        "detail": violation.get("detail"),
        "steps": violation.get("steps", []),
        "trace_file": violation.get("trace_file"),
    }
