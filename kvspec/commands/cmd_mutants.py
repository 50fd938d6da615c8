"""``kvspec mutants``: the kill matrix, the real-bug corpus, the generic mutation score."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from kvspec.output import ERR, OUT, UsageError, emit, progress, replace_marked


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


def add_parser(sub: Any) -> None:
    """The ``mutants`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
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
