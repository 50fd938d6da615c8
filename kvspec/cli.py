"""``kvspec``: the command line (shared/DESIGN.md "CLI contract").

Exit status: 0 everything checked holds, 1 a check failed (counterexample printed and saved),
2 could not run (bad arguments, unknown target, missing optional dependency), said in one line.
Human tables go to stdout, progress to stderr; ``--json`` prints exactly one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kvspec.targets import COMPONENTS, TargetError, load_target
from stateful_tests.profiles import shrink_budget

OUT = Console(highlight=False)
ERR = Console(stderr=True, highlight=False)
TRACE_DIR = Path(".kvspec/traces")


class UsageError(Exception):
    """Bad arguments: exit 2 with one line."""


# ----------------------------------------------------------------------------- helpers
@contextmanager
def progress(description: str, total: int | None, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr; yields ``update(completed)``."""
    if not enabled or not ERR.is_terminal:
        yield lambda completed: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}"),
        TimeElapsedColumn(),
        console=ERR,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda completed: bar.update(task, completed=completed)


def _component(name: str) -> str:
    if name not in COMPONENTS:
        raise TargetError(
            f"unknown or not yet built component {name!r} (available: {', '.join(sorted(COMPONENTS))})"
        )
    return name


def _checker(component: str) -> Any:
    """The checker module of a component (check, fuzz, replay, shrink_trace)."""
    import importlib

    return importlib.import_module(
        {
            "infinilm-block-manager": "stateful_tests.infinilm_block_manager",
            "infinilm-scheduler": "stateful_tests.infinilm_scheduler",
            "vllm-arc": "stateful_tests.vllm_offload",
            "vllm-lru": "stateful_tests.vllm_offload",
        }[component]
    )


def _options(args: argparse.Namespace, component: str) -> dict[str, Any]:
    """Component-specific checker options: the scheduler's reservation variant and soundness; the
    vLLM offload manager's cache policy and variant (ARC no_fallback/t1_fallback, LRU v1/v2)."""
    variant = getattr(args, "variant", None)
    soundness = getattr(args, "soundness", False)
    if component in ("vllm-arc", "vllm-lru"):
        from stateful_tests.vllm_offload import VARIANTS

        if soundness:
            raise UsageError(f"--soundness applies to infinilm-scheduler, not {component}")
        policy = component.removeprefix("vllm-")
        if variant is not None and variant not in VARIANTS[policy]:
            raise UsageError(
                f"unknown {component} variant {variant!r}; choose one of "
                f"{', '.join(VARIANTS[policy])}"
            )
        return {"policy": policy, "variant": variant}
    if component != "infinilm-scheduler":
        if variant or soundness:
            raise UsageError(f"--variant/--soundness apply to infinilm-scheduler, not {component}")
        return {}
    from spec.infinilm.scheduler import RESERVATIONS

    if variant is not None and variant not in RESERVATIONS:
        raise UsageError(f"unknown variant {variant!r}; choose one of {', '.join(RESERVATIONS)}")
    return {"reservation": variant, "soundness": soundness}


def _save_trace(trace: dict[str, Any], component: str, target: str) -> Path:
    from stateful_tests.lockstep import save_trace

    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in target)[-80:]
    stem = f"{component}-{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 0
    while (TRACE_DIR / f"{stem}{'-' + str(n) if n else ''}.json").exists():
        n += 1  # two failures in the same second must not overwrite each other
    return save_trace(trace, TRACE_DIR, f"{stem}{'-' + str(n) if n else ''}")


def _counterexample(
    result: Any,
    component: str,
    cls: Any = None,
    shrink_seconds: float = 0.0,
    save: bool = True,
    options: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The failing trace, delta-debugged for ``shrink_seconds`` when a target class is given."""
    if result.failure is None:
        return None
    trace = result.trace
    if trace is not None and cls is not None and shrink_seconds > 0:
        extra = {"soundness": True} if (options or {}).get("soundness") else {}
        trace = _checker(component).shrink_trace(
            trace, cls, result.target, budget_seconds=shrink_seconds, **extra
        )
    path = _save_trace(trace, component, result.target) if trace and save else None
    failure = (trace or {}).get("failure") or {}
    return {
        "check": failure.get("check", result.failure.check),
        "detail": failure.get("detail", result.failure.detail),
        "steps": trace["steps"] if trace else [],
        "trace_file": str(path) if path else None,
    }


def _short(value: Any) -> str:
    """Compact argument text for step tables: hashes as their first 8 hex digits."""
    if isinstance(value, dict) and "bytes" in value:
        return "h:" + value["bytes"][:8]
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return json.dumps(value)


def print_counterexample(cx: dict[str, Any]) -> None:
    table = Table(title=f"counterexample — {cx['check']}", show_lines=False)
    for column in ("#", "call", "spec", "target"):
        table.add_column(column, overflow="fold")
    for i, step in enumerate(cx["steps"], 1):
        args = ", ".join(_short(a) for a in step["args"])
        table.add_row(
            str(i), Text(f"{step['method']}({args})"), Text(step["spec"]), Text(step["target"])
        )
    OUT.print(table)
    OUT.print(Text.assemble((cx["check"], "bold red"), ": ", cx["detail"]))
    if cx.get("trace_file"):
        OUT.print(f"trace saved to {cx['trace_file']} (re-run: kvspec replay {cx['trace_file']})")


def print_coverage(coverage: dict[str, int]) -> None:
    table = Table(title="coverage (rules, calls, paths, exceptions)")
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in sorted(coverage):
        table.add_row(key, f"{coverage[key]:,}")
    OUT.print(table)


def print_details(
    args: argparse.Namespace, coverage: dict[str, int], cx: dict[str, Any] | None
) -> None:
    """What check and fuzz print before their verdict: coverage if asked, the counterexample."""
    if args.coverage:
        print_coverage(coverage)
    if cx:
        print_counterexample(cx)


def emit(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(document, indent=1, default=str) + "\n")


# ----------------------------------------------------------------------------- commands
def cmd_check(args: argparse.Namespace) -> int:
    from stateful_tests import profiles

    component = _component(args.component)
    options = _options(args, component)
    label, cls = load_target(component, args.target)
    try:
        settings = profiles.get(args.profile)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.json:
        ERR.print(
            f"checking {component} against target {label} (hypothesis profile {args.profile})"
        )
    with shrink_budget(args.shrink_seconds):
        result = _checker(component).check(cls, label, settings, **options)
    cx = _counterexample(result, component, cls, 10.0, options=options)
    document = {
        "component": component,
        "target": label,
        "examples": result.examples,
        "steps": result.steps,
        "passed": result.passed,
        "seconds": round(result.seconds, 2),
        "counterexample": cx,
        "coverage": result.coverage,
    }
    emit(document, args.json)
    if not args.json:
        print_details(args, result.coverage, cx)
        verdict = "[green]passed[/]" if result.passed else "[red]FAILED[/]"
        OUT.print(
            f"{component} vs {label}: {verdict} — {result.examples:,} programs, "
            f"{result.steps:,} lockstep calls, {result.seconds:.1f}s"
        )
    return 0 if result.passed else 1


def cmd_fuzz(args: argparse.Namespace) -> int:
    component = _component(args.component)
    options = _options(args, component)
    if args.ops <= 0:
        raise UsageError(f"--ops must be positive, got {args.ops}")
    label, cls = load_target(component, args.target)
    with progress(f"fuzz {component} vs {label}", args.ops, not args.json) as update:
        result = _checker(component).fuzz(
            cls, label, args.ops, args.seed, progress=update, **options
        )
    cx = _counterexample(result, component, cls, 0.0 if args.no_shrink else 10.0, options=options)
    document = {
        "component": component,
        "target": label,
        "ops": result.steps,
        "seed": args.seed,
        "seconds": round(result.seconds, 3),
        "ops_per_second": round(result.steps / result.seconds) if result.seconds else None,
        "divergences": 0 if result.passed else 1,
        "counterexample": cx,
        "coverage": result.coverage,
    }
    emit(document, args.json)
    if not args.json:
        print_details(args, result.coverage, cx)
        OUT.print(
            f"fuzz {component} vs {label}: {result.steps:,} ops in {result.seconds:.1f}s "
            f"({document['ops_per_second'] or 0:,} ops/s), seed {args.seed}: "
            + ("[green]no divergence[/]" if result.passed else "[red]DIVERGENCE[/]")
        )
    return 0 if result.passed else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from stateful_tests.lockstep import load_trace

    try:
        document = load_trace(Path(args.trace))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read trace: {exc}") from None
    component = _component(document["component"])
    label, cls = load_target(component, args.target or document["target"])
    extra = {"soundness": True} if args.soundness else {}
    if extra and component != "infinilm-scheduler":
        raise UsageError("--soundness applies to infinilm-scheduler traces")
    result = _checker(component).replay(document, cls, label, **extra)
    cx = _counterexample(result, component, save=False)
    out = {
        "component": component,
        "target": label,
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
            f"replay of {args.trace} on {label}: "
            + ("[green]all steps agree[/]" if result.passed else "[red]diverges[/]")
        )
    return 0 if result.passed else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from kvspec.bench import SUITES, run_suite

    if args.suite not in SUITES:
        raise UsageError(f"unknown bench suite {args.suite!r}; choose one of {', '.join(SUITES)}")
    if args.rounds is not None and args.rounds < 7:
        raise UsageError("--rounds must be at least 7")
    from kvspec.bench import BenchMismatch

    try:
        with progress(f"bench {args.suite}", None, not args.json):
            rows = run_suite(args.suite, quick=args.quick, rounds=args.rounds)
    except BenchMismatch as exc:  # the two sides did different work: no ratio to report
        sys.stderr.write(f"kvspec: bench {args.suite}: {' '.join(str(exc).split())}\n")
        return 1
    emit({"suite": args.suite, "rows": [r.to_json() for r in rows]}, args.json)
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
    return 0


def cmd_admission(args: argparse.Namespace) -> int:
    from kvspec.admission import ManifestError, load_manifest, simulate
    from spec.infinilm.scheduler import RESERVATIONS

    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    variants: dict[str, Any] = {}
    with progress("admission", len(RESERVATIONS), not args.json) as update:
        for i, variant in enumerate(RESERVATIONS, 1):
            variants[variant] = simulate(manifest, variant)
            update(i)
    emit({"manifest": str(args.manifest), "variants": variants}, args.json)
    if not args.json:
        table = Table(
            title=f"admission prediction for {args.manifest} (B={manifest.block_size}, "
            f"N={manifest.num_blocks}, prefix caching "
            f"{'on' if manifest.enable_prefix_caching else 'off'})"
        )
        for column in ("variant", "wave", "running", "reserved", "usable", "admitted"):
            table.add_column(column, justify="right")
        for variant, result in variants.items():
            for record in result["waves"]:
                table.add_row(
                    variant,
                    str(record["wave"]),
                    f"{record['running_requests']} (wave {record['wave'] - 1}: "
                    f"{record['previous_wave_running']}/{len(manifest.waves[record['wave'] - 2])})",
                    str(record["running_reserved_blocks"]),
                    str(record["usable_blocks"]),
                    f"{record['admitted']}/{record['requests']}",
                )
        OUT.print(table)
        OUT.print(
            "running: requests in the running queue just before the wave's schedule() (of them, "
            "the previous wave's); reserved: their decode reservation in pages; usable: "
            "get_total_usable_blocks(); admitted: the wave's requests in that schedule()'s batch"
        )
    return 0


def cmd_mutants(args: argparse.Namespace) -> int:
    """The kill matrix: every applicable checker against every planted bug."""
    if args.generic:
        from kvspec import generic_mutation

        return generic_mutation.cmd(args)
    from kvspec import mutants

    checkers = args.checkers.split(",") if args.checkers else list(mutants.CHECKERS)
    unknown = [c for c in checkers if c not in mutants.CHECKERS]
    if unknown:
        raise UsageError(
            f"unknown checker(s) {', '.join(unknown)}; choose from {', '.join(mutants.CHECKERS)}"
        )
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
    try:
        chosen = mutants.select(args.only, args.component)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with progress("mutants", len(chosen), not args.json) as update:
        rows = mutants.run_matrix(chosen, checkers, args.budget, lambda i, _: update(i))
    summary = mutants.summary(rows)
    emit({"mutants": [r.to_json() for r in rows], "summary": summary}, args.json)
    table = mutants.markdown(rows, checkers, args.budget)
    if args.update_readme:
        mutants.update_readme(Path(args.readme), table)
    if not args.json:
        out = Table(title=f"kill matrix (budget {args.budget:g} s per checker)")
        for column in ("mutant", "component", *checkers):
            out.add_column(column, overflow="fold")
        for r in rows:
            cells = {a.checker: mutants._cell(a) for a in r.attempts}
            out.add_row(r.mutant.name, r.mutant.component, *(cells[c] for c in checkers))
        OUT.print(out)
        OUT.print(
            f"{summary['killed']}/{summary['mutants']} killed; median time to kill "
            f"{summary['median_seconds_to_kill']} s; survivors: "
            f"{', '.join(summary['survivors']) or 'none'}"
        )
    return 0 if not summary["survivors"] else 1


def cmd_verify(args: argparse.Namespace) -> int:
    """Every stage that exists, on embedded defaults, with a summary table."""
    from kvspec import verify

    stages = verify.run_all(quick=args.quick, show_progress=not args.json, console=ERR)
    emit({"stages": [s.to_json() for s in stages]}, args.json)
    if not args.json:
        table = Table(title="kvspec verify")
        for column in ("stage", "status", "seconds", "summary"):
            table.add_column(column, overflow="fold")
        colour = {"pass": "green", "fail": "red", "skip": "yellow"}
        for s in stages:
            table.add_row(
                s.name, f"[{colour[s.status]}]{s.status}[/]", f"{s.seconds:.1f}", s.summary
            )
        OUT.print(table)
    return 1 if any(s.status == "fail" for s in stages) else 0


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Executable specs, production implementations and checkers for KV-cache "
        "bookkeeping.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    components = sorted(COMPONENTS)
    target_help = "impl (default), spec, mutant:NAME, MOD:CLASS or FILE.py:CLASS"

    p = sub.add_parser("verify", help="run every stage on embedded defaults")
    p.add_argument("--quick", action="store_true", help="smaller budgets (smoke run)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("check", help="hypothesis lockstep machine: spec vs target")
    p.add_argument("component", help=f"one of {', '.join(components)}")
    p.add_argument("--target", help=target_help)
    p.add_argument("--profile", default="ci", help="hypothesis profile: ci, dev or deep")
    p.add_argument(
        "--variant",
        help="infinilm-scheduler reservation: legacy, exact or tight; vllm-arc: no_fallback or "
        "t1_fallback; vllm-lru: v2 or v1 (default: drawn per run)",
    )
    p.add_argument(
        "--soundness",
        action="store_true",
        help="infinilm-scheduler: also fail when a decode step runs out of pages "
        "without draft tokens (admission_soundness)",
    )
    p.add_argument(
        "--shrink-seconds",
        type=float,
        default=60.0,
        help="bound on hypothesis' shrinking time (default 60)",
    )
    p.add_argument("--coverage", action="store_true", help="print rule/path coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("fuzz", help="seeded differential fuzzer (no hypothesis overhead)")
    p.add_argument("component", help=f"one of {', '.join(components)}")
    p.add_argument("--target", help=target_help)
    p.add_argument("--ops", type=int, default=100_000, help="lockstep calls to make")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shrink", action="store_true", help="keep the raw failing episode")
    p.add_argument(
        "--variant",
        help="infinilm-scheduler: legacy, exact or tight; vllm-arc: no_fallback or t1_fallback; "
        "vllm-lru: v2 or v1 (default: drawn per episode)",
    )
    p.add_argument(
        "--soundness",
        action="store_true",
        help="infinilm-scheduler: fail on decode out-of-pages without draft tokens",
    )
    p.add_argument("--coverage", action="store_true", help="print rule/path coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fuzz)

    p = sub.add_parser("replay", help="re-run a saved counterexample trace")
    p.add_argument("trace", help="a trace file written by check or fuzz")
    p.add_argument("--target", help="override the trace's target")
    p.add_argument(
        "--soundness", action="store_true", help="infinilm-scheduler: re-check admission_soundness"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("bench", help="side-by-side benchmarks: baseline vs impl, as ratios")
    p.add_argument("suite", help="reclaim, usable, schedule, capacity or admission")
    p.add_argument("--quick", action="store_true", help="fewer cases and rounds")
    p.add_argument("--rounds", type=int, help="rounds per case (median; at least 7)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "admission",
        help="predict how many requests of each next wave the legacy, exact and tight "
        "reservations admit",
    )
    p.add_argument("manifest", help="MANIFEST.json (see examples/admission_manifest.json)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_admission)

    p = sub.add_parser("mutants", help="kill matrix: every checker against every planted bug")
    p.add_argument("--budget", type=float, default=30.0, help="seconds per checker per mutant")
    p.add_argument(
        "--checkers", help="comma-separated subset of hypothesis, fuzzer, explorer, crosshair"
    )
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these mutants")
    p.add_argument("--component", nargs="+", help="only mutants of these components")
    p.add_argument(
        "--update-readme", action="store_true", help="write the matrix into README.md's markers"
    )
    p.add_argument("--readme", default="README.md", help=argparse.SUPPRESS)
    p.add_argument(
        "--generic",
        action="store_true",
        help="cosmic-ray over impl/ with kvspec's tests as the oracle (slow; see README)",
    )
    p.add_argument(
        "--module", action="append", metavar="PATH", help="--generic: only this impl module"
    )
    p.add_argument(
        "--sample", type=int, metavar="N", help="--generic: a seeded random sample per module"
    )
    p.add_argument("--seed", type=int, default=0, help="--generic: seed of --sample")
    p.add_argument(
        "--budget-per-module",
        type=float,
        metavar="SECONDS",
        help="--generic: stop each module after SECONDS (what ran is a random sample)",
    )
    p.add_argument(
        "--workdir", metavar="DIR", help="--generic: keep the copy and sessions here; reruns resume"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_mutants)

    from kvspec import prove

    prove.add_parser(sub)

    from kvspec import smoke

    smoke.add_parser(sub)

    from kvspec import crosshair

    crosshair.add_parser(sub)

    from kvspec import explore

    explore.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (TargetError, UsageError) as exc:
        # plain write: rich would wrap a long reason onto several lines
        sys.stderr.write(f"kvspec: {' '.join(str(exc).split())}\n")
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
