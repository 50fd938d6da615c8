"""``kvspec``: the command line.

Exit status: 0 everything checked holds, 1 a check failed (counterexample printed and saved),
2 could not run (bad arguments, unknown component or target, missing optional dependency), said in
one line. Human tables go to stdout, progress to stderr; ``--json`` prints exactly one JSON
document. Components, their variants and flags, bench suites and planted bugs come from the
registry (:mod:`kvspec.components`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from kvspec import components
from kvspec.components import Component, ComponentError
from kvspec.output import (
    ERR,
    OUT,
    UsageError,
    could_not_run,
    emit,
    print_counterexample,
    print_coverage,
    progress,
    replace_marked,
)
from kvspec.runs import (
    against,
    counterexample,
    inputs_options,
    oracle_fields,
    oracle_options,
    setup,
)
from kvspec.targets import TargetError, load_reference, load_target
from stateful_tests.lockstep import TargetMisfit
from stateful_tests.profiles import shrink_budget


# ----------------------------------------------------------------------------- helpers
def _component(args: argparse.Namespace) -> tuple[Component, str | None, Mapping[str, Any]]:
    """The component named on the command line, its ``--variant`` and its flags."""
    comp = components.get(args.component)
    variant = comp.check_variant(getattr(args, "variant", None))
    return comp, variant, components.options_of(comp, vars(args))


def print_details(
    args: argparse.Namespace, coverage: dict[str, int], cx: dict[str, Any] | None
) -> None:
    """What check and fuzz print before their verdict: coverage if asked, the counterexample."""
    if args.coverage:
        print_coverage(coverage)
    if cx:
        print_counterexample(cx)


def _scope(comp: Any, result: Any, inputs: str) -> dict[str, Any]:
    from stateful_tests.checker import scope_report

    return scope_report(comp.checker_def, result.coverage, inputs)


def _values(values: list[Any]) -> str:
    """A field's drawn values, short: a run of five or more integers as ``lo..hi (n values)``."""
    if len(values) >= 5 and all(type(v) is int for v in values):
        return f"{values[0]}..{values[-1]} ({len(values)} values)"
    return ", ".join(json.dumps(v) for v in values)


def print_scope(scope: dict[str, Any]) -> None:
    """The option values a check or fuzz run drew and the operations it never ran."""
    dims = "; ".join(f"{name} {_values(vals)}" for name, vals in scope["dimensions"].items())
    OUT.print(f"option values drawn: {escape(dims) or 'none'}")
    OUT.print(f"operations never reached: {', '.join(scope['unreached_operations']) or 'none'}")


# ----------------------------------------------------------------------------- commands
def cmd_check(args: argparse.Namespace) -> int:
    from stateful_tests import profiles

    comp, variant, options = _component(args)
    component = comp.name
    label, cls, reference, variant = setup(args, comp, variant)
    try:
        settings = profiles.get(args.profile)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.json:
        ERR.print(
            f"checking {component}: target {escape(label)} against {escape(against(reference))} "
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
    cx = counterexample(result, comp, cls, 10.0, options=options, reference=reference)
    document = {
        "component": component,
        "target": label,
        **oracle_fields(reference),
        "variant": variant,
        "inputs": args.inputs,
        "examples": result.examples,
        "steps": result.steps,
        "passed": result.passed,
        "seconds": round(result.seconds, 2),
        "counterexample": cx,
        "scope": _scope(comp, result, args.inputs),
        "coverage": result.coverage,
    }
    emit(document, args.json)
    if not args.json:
        print_details(args, result.coverage, cx)
        print_scope(document["scope"])
        verdict = "[green]passed[/]" if result.passed else "[red]FAILED[/]"
        OUT.print(
            f"{component} {escape(label)} vs {escape(against(reference))}: {verdict} — "
            f"{result.examples:,} programs, "
            f"{result.steps:,} lockstep calls, {result.seconds:.1f}s"
        )
    return 0 if result.passed else 1


def cmd_fuzz(args: argparse.Namespace) -> int:
    comp, variant, options = _component(args)
    component = comp.name
    if args.ops <= 0:
        raise UsageError(f"--ops must be positive, got {args.ops}")
    label, cls, reference, variant = setup(args, comp, variant)
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
    cx = counterexample(result, comp, cls, shrink, options=options, reference=reference)
    document = {
        "component": component,
        "target": label,
        **oracle_fields(reference),
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
        "counterexample": cx,
        "scope": _scope(comp, result, args.inputs),
        "coverage": result.coverage,
    }
    emit(document, args.json)
    if not args.json:
        print_details(args, result.coverage, cx)
        print_scope(document["scope"])
        OUT.print(
            f"fuzz {component} {escape(label)} vs {escape(against(reference))}: "
            f"{result.steps:,} ops in {result.seconds:.1f}s "
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
    cx = counterexample(result, comp, save=False)
    out = {
        "component": component,
        "target": label,
        **oracle_fields(reference),
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
            f"replay of {args.trace} on {escape(label)} vs {escape(against(reference))}: "
            + ("[green]all steps agree[/]" if result.passed else "[red]diverges[/]")
        )
    return 0 if result.passed else 1


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
    from kvspec import kill_matrix as mutants

    if args.corpus:
        return _cmd_corpus(args)
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


def _cmd_corpus(args: argparse.Namespace) -> int:
    """``mutants --corpus upstream``: the real-bug corpus through the kill-matrix checkers."""
    from kvspec import corpus
    from kvspec import kill_matrix as mutants

    # crosshair diffs kvspec's own pure kernels: it never applies to release code
    checkers = args.checkers.split(",") if args.checkers else ["fuzzer", "hypothesis", "explorer"]
    unknown = [c for c in checkers if c not in mutants.CHECKERS or c == "crosshair"]
    if unknown:
        raise UsageError(
            f"unknown checker(s) for the corpus: {', '.join(unknown)}; choose from fuzzer, "
            "hypothesis, explorer"
        )
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
    try:
        bugs = corpus.select(corpus.load(), args.only)
    except corpus.CorpusError as exc:
        raise UsageError(str(exc)) from None
    if args.component:
        bugs = [b for b in bugs if b.component in args.component]
    with progress("corpus", len(bugs), not args.json) as update:
        outcomes = corpus.run(
            bugs,
            checkers,
            args.budget,
            first_kill=args.first_kill,
            progress=lambda i, _: update(i),
            note=lambda line: ERR.print(line),
        )
    summary = corpus.summary(outcomes)
    emit({"corpus": [o.to_json() for o in outcomes], "summary": summary}, args.json)
    if args.update_readme:
        text = Path(args.readme).read_text()
        table = corpus.markdown(outcomes, checkers, args.budget)
        Path(args.readme).write_text(
            replace_marked(text, corpus.README_START, corpus.README_END, table, where=args.readme)
        )
    if not args.json:
        out = Table(title=f"real-bug corpus (budget {args.budget:g} s per checker)")
        for column in ("bug", "release", "upstream", *checkers):
            out.add_column(column, overflow="fold")
        for o in outcomes:
            b, cells = o.bug, o.cells(checkers)
            out.add_row(
                b.name, f"{b.engine} {b.release}", b.upstream, *(cells.get(c, "") for c in checkers)
            )
        OUT.print(out)
        OUT.print(
            f"{summary['killed']}/{summary['bugs']} caught; survivors: "
            f"{', '.join(summary['survivors']) or 'none'}; errors: {len(summary['errors'])}"
        )
    return 0 if not summary["survivors"] and not summary["errors"] else 1


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


# ----------------------------------------------------------------------------- parser
def _flags(p: argparse.ArgumentParser, what: str) -> None:
    """The components' checker options on ``p``: boolean flags (``--soundness``, …) and valued
    settings (``--request-module MOD``, …)."""
    for flag, text in components.all_flags().items():
        owners = ", ".join(components.with_flag(flag))
        p.add_argument(f"--{flag}", action="store_true", help=f"{owners}: {what}{text}")
    for name, text in components.all_settings().items():
        owners = ", ".join(c.name for c in components.all_components() if name in c.settings)
        p.add_argument(f"--{name.replace('_', '-')}", metavar="VALUE", help=f"{owners}: {text}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Executable specs, production implementations and checkers for KV-cache "
        "bookkeeping.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    names = ", ".join(components.names())
    target_help = (
        "impl (default), spec, mutant:NAME, MOD:CLASS, FILE.py:CLASS, an engine name (vllm, "
        "sglang, infinilm), ENGINE@SOURCE or a bare SOURCE: git:REPO[@REV], a wheel, a tree"
    )
    variants = components.describe_variants()

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

    p = sub.add_parser("check", help="hypothesis lockstep machine: spec vs target")
    p.add_argument("component", help=f"one of {names}")
    p.add_argument("--target", help=target_help)
    p.add_argument("--profile", default="ci", help="hypothesis profile: ci, dev or deep")
    p.add_argument("--variant", help=f"{variants} (default: drawn per run)")
    oracle_options(p)
    inputs_options(p, "all")
    _flags(p, "")
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
    p.add_argument("component", help=f"one of {names}")
    p.add_argument("--target", help=target_help)
    p.add_argument("--ops", type=int, default=100_000, help="lockstep calls to make")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shrink", action="store_true", help="keep the raw failing episode")
    p.add_argument("--variant", help=f"{variants} (default: drawn per episode)")
    oracle_options(p)
    inputs_options(p, "all")
    _flags(p, "")
    p.add_argument("--coverage", action="store_true", help="print rule/path coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fuzz)

    p = sub.add_parser("replay", help="re-run a saved counterexample trace")
    p.add_argument("trace", help="a trace file written by check or fuzz")
    p.add_argument("--target", help="override the trace's target")
    oracle_options(p, replay=True)
    inputs_options(p, None)
    _flags(p, "re-check: ")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("bench", help="side-by-side benchmarks: baseline vs impl, as ratios")
    p.add_argument("suite", help=f"one of {', '.join(components.bench_suites())}")
    p.add_argument("--quick", action="store_true", help="fewer cases and rounds")
    p.add_argument("--rounds", type=int, help="rounds per case (median; at least 7)")
    p.add_argument("--plot", metavar="FILE.png", help="ratio against size (needs kvspec[plot])")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "admission",
        help="predict how many requests of each next wave the legacy, exact and tight "
        "reservations admit",
    )
    p.add_argument("manifest", help="MANIFEST.json (see kvspec/data/admission_manifest.json)")
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
        "--update-readme",
        action="store_true",
        help="write the matrix (or the corpus table) into docs/mutation.md's markers",
    )
    p.add_argument("--readme", default="docs/mutation.md", help=argparse.SUPPRESS)
    p.add_argument(
        "--generic",
        action="store_true",
        help="cosmic-ray over impl/ with kvspec's tests as the oracle (slow; docs/mutation.md)",
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
    p.add_argument(
        "--corpus",
        choices=("upstream",),
        help="upstream: the real-bug corpus, bugs fixed upstream put back into release trees "
        "(kvspec/data/corpus; wheels from $KVSPEC_VLLM_WHEEL / $KVSPEC_SGLANG_WHEEL or pip)",
    )
    p.add_argument(
        "--first-kill",
        action="store_true",
        help="--corpus: stop a bug's checkers at the first kill (the CI run)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_mutants)

    from kvspec import audit, exploration, figures, prove, soak

    soak.add_parser(sub, _flags, inputs_options)

    audit.add_parser(sub)
    prove.add_parser(sub)

    from kvspec import smoke

    smoke.add_parser(sub)

    from kvspec import crosshair

    crosshair.add_parser(sub)

    exploration.add_parser(sub)
    from kvspec import diff

    diff.add_parser(sub)
    figures.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (TargetError, TargetMisfit, UsageError, ComponentError) as exc:
        return could_not_run(exc)
    return code


if __name__ == "__main__":
    sys.exit(main())
