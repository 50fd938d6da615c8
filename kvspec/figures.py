"""``kvspec figures``: every ratio and throughput the docs report, measured in one run.

Three sections, each a list of JSON records and a Markdown table rendered from them:

* ``bench`` — every bench suite of every component (:func:`kvspec.bench.run_suite`): baseline and
  impl side by side, medians, the ratio, the upstream PR's ratio and kvspec's goal;
* ``fuzz`` — lockstep throughput of the seeded fuzzer against the production implementation, per
  component (every check still runs after every call);
* ``explore`` — the exhaustive explorer on each component's default scope: distinct states,
  edges, states/s, edges/s, peak memory, whether it completed.

``--update-readme`` replaces the text between ``<!-- figures:SECTION:start -->`` and
``<!-- figures:SECTION:end -->`` in docs/figures.md with the rendered table, so the docs never show a
figure that no run produced. Ratios, not absolute times, are the comparable result (the machines
here are shared and noisy); the header line says where and when the figures were taken.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvspec import components
from kvspec.output import replace_marked

SECTIONS = ("bench", "fuzz", "explore")
FUZZ_OPS = 200_000
QUICK_FUZZ_OPS = 20_000
EXPLORE_SECONDS = 300.0  # per component: the docs' "largest scope completed in 5 minutes" bar
QUICK_EXPLORE_SECONDS = 30.0


def markers(section: str) -> tuple[str, str]:
    return f"<!-- figures:{section}:start -->", f"<!-- figures:{section}:end -->"


# ------------------------------------------------------------------------------------- measuring
def measure_bench(
    quick: bool = False, rounds: int | None = None, report: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Every bench suite's rows, suite by suite, as ``{"suite", "rows"}`` records."""
    from kvspec.bench import run_suite

    out = []
    for suite in components.bench_suites():
        if report is not None:
            report(f"bench {suite}")
        rows = run_suite(suite, quick=quick, rounds=rounds)
        out.append({"suite": suite, "rows": [r.to_json() for r in rows]})
    return out


def measure_fuzz(
    ops: int, seed: int = 0, report: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The fuzzer's lockstep throughput against ``impl``, per component with a checker."""
    from kvspec.targets import load_target

    out = []
    for comp in components.all_components():
        if report is not None:
            report(f"fuzz {comp.name}")
        label, cls = load_target(comp.name, None)
        variant = comp.target_variant(None, cls)
        _ = comp.checker_def  # (its modules imported before the clock starts)
        cpu = time.process_time()
        result = comp.fuzz(cls, label, ops, seed, variant=variant)
        cpu = time.process_time() - cpu
        out.append(
            {
                "component": comp.name,
                "target": label,
                "variant": variant or ("drawn per episode" if comp.variants else None),
                "ops": result.steps,
                "seconds": round(result.seconds, 3),
                "ops_per_second": round(result.steps / result.seconds) if result.seconds else None,
                # the steadier figure on a shared machine: one core's calls per CPU second
                "cpu_seconds": round(cpu, 3),
                "calls_per_cpu_second": round(result.steps / cpu) if cpu else None,
                "passed": result.passed,
            }
        )
    return out


def _explore_in_child(
    name: str, variant: str | None, seconds: float, workers: int = 1
) -> dict[str, Any]:
    """``kvspec explore NAME --json`` in a fresh interpreter: a process's peak memory only grows,
    so each search's own peak needs its own process. Its JSON document is the result."""
    argv = [sys.executable, "-c", "from kvspec.cli import main; raise SystemExit(main())"]
    argv += ["explore", name, "--time-limit", f"{seconds:g}", "--json"]
    if workers > 1:
        argv += ["--workers", str(workers)]
    if variant is not None:
        argv += ["--variant", variant]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):  # 2: could not run (said in one line on stderr)
        raise RuntimeError(f"explore {name}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def measure_explore(
    seconds: float, report: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The explorer on each component's default scope (its first variant), ``seconds`` at most
    each, each search in its own process; then the same search on two workers right after it
    (its time and the speed-up: the same machine, the same minutes)."""
    out = []
    for comp in components.all_components():
        if comp.explorer is None:
            continue
        if report is not None:
            report(f"explore {comp.name}")
        # one search per component: its first variant (every variant would multiply the time by
        # up to eight without a new scope; `kvspec explore --variant V` runs any other)
        variant = comp.variants[0] if comp.variants else None
        started = time.perf_counter()
        doc = _explore_in_child(comp.name, variant, seconds)
        wall = time.perf_counter() - started
        two = _explore_in_child(comp.name, variant, seconds, workers=2)
        edges = int(doc.get("edges", 0))
        out.append(
            {
                "component": comp.name,
                "target": doc.get("target", "impl"),
                "variant": variant,
                "bounds": doc.get("bounds", {}),
                "complete": bool(doc.get("complete")),
                "passed": not doc.get("violations"),
                "distinct_states": doc.get("distinct_states", 0),
                "edges": edges,
                "seconds": round(float(doc.get("seconds", wall)), 2),
                "states_per_second": doc.get("states_per_second", 0),
                "edges_per_second": doc.get("edges_per_second", 0),
                "peak_memory_mb": doc.get("peak_memory_mb", 0.0),
                "workers": doc.get("workers", 1),
                # the floor: CPU seconds outside the two sides' methods per second inside them
                "rest_over_calls": doc.get("floor", {}).get("rest_over_calls"),
                # the same search on two worker processes
                "two_workers": {
                    "complete": bool(two.get("complete")),
                    "passed": not two.get("violations"),
                    "distinct_states": two.get("distinct_states", 0),
                    "seconds": round(float(two.get("seconds", 0.0)), 2),
                    "transferred_states": two.get("transferred_states", 0),
                    "replayed_paths": two.get("replayed_paths", 0),
                    "peak_memory_mb": two.get("peak_memory_mb", 0.0),
                    "parallel_efficiency": two.get("parallel_efficiency"),
                },
            }
        )
    return out


def measure(
    sections: Sequence[str],
    *,
    quick: bool = False,
    rounds: int | None = None,
    fuzz_ops: int | None = None,
    explore_seconds: float | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The figures document: where and when, then one record list per requested section."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": quick,
    }
    if "bench" in sections:
        doc["bench"] = measure_bench(quick, rounds, report)
    if "fuzz" in sections:
        doc["fuzz"] = measure_fuzz(fuzz_ops or (QUICK_FUZZ_OPS if quick else FUZZ_OPS), 0, report)
    if "explore" in sections:
        limit = explore_seconds or (QUICK_EXPLORE_SECONDS if quick else EXPLORE_SECONDS)
        doc["explore"] = measure_explore(limit, report)
    return doc


# ------------------------------------------------------------------------------------- rendering
_HIDDEN_CASE_KEYS = {"calls", "pr_ratio", "target_t1_size", "evicted_t1", "evicted_t2"}


def case_label(suite: str, case: Mapping[str, Any]) -> str:
    """A bench case in a few words: its integer fields (``k=v``), its variant, and for
    ``admission`` the scan that is the baseline."""
    parts = [f"{k}={v:,}" for k, v in case.items() if type(v) is int and k not in _HIDDEN_CASE_KEYS]
    if "variant" in case:
        parts.insert(0, str(case["variant"]))
    if "scenario" in case:  # prefix-cache and radix: one row per scenario and size
        parts.insert(0, f"scenario={case['scenario']}")
    if suite == "admission":
        parts.insert(0, f"{case.get('baseline', '')} vs counter")
    return ", ".join(parts)


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:,.2f}"


def _ratio(value: float) -> str:
    return f"{value:,.1f}×" if value >= 10 else f"{value:,.2f}×"


def _header(doc: Mapping[str, Any], what: str) -> str:
    quick = ", --quick" if doc.get("quick") else ""
    return (
        f"{what} (`kvspec figures`{quick}, {doc['date']}, {doc['cpus']} CPUs, "
        f"Python {doc['python']}):"
    )


def render_bench(doc: Mapping[str, Any]) -> str:
    lines = [
        _header(doc, "Measured side by side, median of the rounds"),
        "",
        "| suite | case | baseline µs | impl µs | ratio | upstream PR measured | kvspec goal |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for record in doc["bench"]:
        suite = record["suite"]
        for row in record["rows"]:
            case = row["case"]
            pr = case.get("pr_ratio")
            goal = row.get("goal")
            verdict = "" if goal is None else f"≥ {goal:g}× " + ("✓" if row["meets_goal"] else "✗")
            lines.append(
                f"| {suite} | {case_label(suite, case)} | {_us(row['baseline_us'])} | "
                f"{_us(row['impl_us'])} | {_ratio(row['ratio'])} | "
                f"{'' if pr is None else f'{pr:g}×'} | {verdict} |"
            )
    return "\n".join(lines)


def render_fuzz(doc: Mapping[str, Any]) -> str:
    lines = [
        _header(doc, "Fuzzer throughput against `impl`, seed 0, one process"),
        "",
        "| component | variant | lockstep calls | seconds | calls/s | calls/CPU s | divergences |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["fuzz"]:
        per_cpu = r.get("calls_per_cpu_second")
        lines.append(
            f"| `{r['component']}` | {r['variant'] or '—'} | {r['ops']:,} | {r['seconds']:,.1f} | "
            f"{r['ops_per_second'] or 0:,} | {f'{per_cpu:,}' if per_cpu else '—'} | "
            f"{0 if r['passed'] else 1} |"
        )
    return "\n".join(lines)


def _bounds(bounds: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k}={'/'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in bounds.items()
    )


def _rest(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if value <= 0.5 else f"**{value:.2f}**"


def render_explore(doc: Mapping[str, Any]) -> str:
    lines = [
        _header(
            doc,
            "Explorer on each default scope (first variant) against `impl`, one process, then "
            "the same search on `--workers 2`",
        ),
        "",
        "| component | variant | default scope | complete | distinct states | edges | states/s "
        "| edges/s | peak memory | time | rest per call-second (goal ≤ 0.5) | time, 2 workers "
        "| speed-up | parallel efficiency |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["explore"]:
        done = "yes" if r["complete"] else "**no** (time limit)"
        if not r["passed"]:
            done += ", **violation**"
        two = r.get("two_workers")
        efficiency = "—"
        if two is None:
            parallel = ratio = "—"
        else:
            if two.get("parallel_efficiency") is not None:
                efficiency = f"{two['parallel_efficiency']:.0%}"
            parallel = f"{two['seconds']:,.1f} s"
            if not two["complete"]:
                parallel += " (**incomplete**)"
            elif two["distinct_states"] != r["distinct_states"]:
                parallel += f" (**{two['distinct_states']:,} states**)"
            if not two["passed"]:
                parallel += ", **violation**"
            ratio = f"{r['seconds'] / two['seconds']:.2f}×" if two["seconds"] > 0 else "—"
        lines.append(
            f"| `{r['component']}` | {r.get('variant') or '—'} | {_bounds(r['bounds'])} | {done} | "
            f"{r['distinct_states']:,} | {r['edges']:,} | {r['states_per_second']:,} | "
            f"{r['edges_per_second']:,} | {r['peak_memory_mb']:,.0f} MB | {r['seconds']:,.1f} s | "
            f"{_rest(r.get('rest_over_calls'))} | {parallel} | {ratio} | {efficiency} |"
        )
    return "\n".join(lines)


RENDER: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "bench": render_bench,
    "fuzz": render_fuzz,
    "explore": render_explore,
}


def rendered(doc: Mapping[str, Any]) -> dict[str, str]:
    """The Markdown table of every section the document holds."""
    return {s: RENDER[s](doc) for s in SECTIONS if s in doc}


def update_readme(readme: Path, tables: Mapping[str, str]) -> list[str]:
    """Replace each section's marked block in ``readme``; every marker pair must be present
    (``ValueError`` naming the missing one, nothing written). Returns the sections replaced."""
    text = readme.read_text()
    for section, table in tables.items():
        text = replace_marked(text, *markers(section), table, where=readme)
    readme.write_text(text)
    return list(tables)


def failures(doc: Mapping[str, Any]) -> Iterable[str]:
    """What in the document is a failure: a divergence or a violation (a missed goal is not)."""
    for r in doc.get("fuzz", []):
        if not r["passed"]:
            yield f"fuzz {r['component']}: divergence"
    for r in doc.get("explore", []):
        if not r["passed"]:
            yield f"explore {r['component']}: violation"
        two = r.get("two_workers")
        if two is not None and not two["passed"]:
            yield f"explore {r['component']} on two workers: violation"
        elif (
            two is not None
            and r["complete"]
            and two["complete"]
            and two["distinct_states"] != r["distinct_states"]  # the search must not change
        ):
            yield f"explore {r['component']} on two workers: another number of states"


# ------------------------------------------------------------------------------------- command
def add_parser(subparsers: Any) -> None:
    """Register ``figures`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "figures",
        help="measure every bench ratio, fuzz and explorer throughput in one run; "
        "optionally rewrite the tables of docs/figures.md",
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all)",
    )
    p.add_argument("--quick", action="store_true", help="fewer bench rounds and cases, short runs")
    p.add_argument("--rounds", type=int, help="bench rounds per case (median; at least 7)")
    p.add_argument(
        "--fuzz-ops", type=int, help=f"lockstep calls per component (default {FUZZ_OPS:,})"
    )
    p.add_argument(
        "--explore-seconds",
        type=float,
        help=f"time limit per component's default scope (default {EXPLORE_SECONDS:g} s)",
    )
    p.add_argument(
        "--update-readme",
        nargs="?",
        const="docs/figures.md",
        metavar="PATH",
        help="replace the marked figure tables in PATH (default docs/figures.md)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_figures)


def cmd_figures(args: Any) -> int:
    """0: measured (goals may be missed: the table says so); 1: a divergence or violation was
    found on the way; 2: could not run (bad arguments, a page without markers)."""
    from kvspec.output import ERR, OUT, UsageError, emit

    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        raise UsageError(f"--only takes a subset of {', '.join(SECTIONS)}, got {args.only!r}")
    if args.rounds is not None and args.rounds < 7:
        raise UsageError("--rounds must be at least 7")
    if args.fuzz_ops is not None and args.fuzz_ops <= 0:
        raise UsageError(f"--fuzz-ops must be positive, got {args.fuzz_ops}")
    if args.explore_seconds is not None and args.explore_seconds <= 0:
        raise UsageError(f"--explore-seconds must be positive, got {args.explore_seconds}")
    readme = None if args.update_readme is None else Path(args.update_readme)
    if readme is not None:  # fail before an hour of measuring, not after
        if not readme.is_file():
            raise UsageError(f"--update-readme: no file {readme}")
        text = readme.read_text()
        for s in sections:
            start, end = markers(s)
            if start not in text or end not in text:
                raise UsageError(f"--update-readme: {readme} has no {start} … {end} markers")
    started = time.perf_counter()

    def report(step: str) -> None:
        ERR.print(f"figures: {step} ({time.perf_counter() - started:,.0f} s)", highlight=False)

    doc = measure(
        sections,
        quick=args.quick,
        rounds=args.rounds,
        fuzz_ops=args.fuzz_ops,
        explore_seconds=args.explore_seconds,
        report=report,
    )
    tables = rendered(doc)
    if readme is not None:
        update_readme(readme, tables)
        doc["readme_updated"] = str(readme)
    found = list(failures(doc))
    doc["failures"] = found
    emit(doc, args.json)
    if not args.json:
        for s in sections:
            OUT.print(tables[s], highlight=False, markup=False, soft_wrap=True)
            OUT.print()
        for f in found:
            OUT.print(f"[red]{f}[/]")
        if readme is not None:
            OUT.print(f"updated {', '.join(sections)} in {readme}")
    return 1 if found else 0
