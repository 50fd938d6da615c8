"""``kvspec explore``: the exhaustive small-scope explorer on the command line.

``kvspec explore COMPONENT [--target …] [--variant V] [--depth N] [--max-states N] [bounds…]
[--json]`` runs :mod:`proofs.explorer` (one breadth-first search per variant unless ``--variant``
picks one) and prints a table, or one JSON document with ``--json`` (shared/DESIGN.md "CLI
contract"). Exit status: 0 every reached state and every edge holds (``complete`` says whether
the bounds were exhausted), 1 a violation (the shortest counterexample is printed and saved under
``.kvspec/traces/``), 2 could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TRACE_DIR = Path(".kvspec/traces")

# bound option -> (bounds field, value when the flag is given; None: the option's own value)
_INT_BOUNDS = (
    "pages",
    "block_size",
    "vocab",
    "tables",
    "tokens",
    "batch",
    "budget",
    "requests",
    "prompt_tokens",
    "max_new",
    "gen_vocab",
    "capacity",
    "keys",
    "store_width",
    "touch_width",
    "max_loads",
)
_FLAGS = {  # argparse dest -> (bounds field, value)
    "connector": ("connector", True),
    "speculation": ("speculation", True),
    "soundness": ("soundness", True),
    "no_prefix_caching": ("prefix_caching", False),
    "no_symmetry": ("symmetry", False),
    "no_bad_inputs": ("bad_inputs", False),
}
_HELP = {
    "pages": "pages in the pool (block manager, scheduler; at most 8)",
    "block_size": "tokens per page",
    "vocab": "prompt token alphabet size",
    "tables": "block manager: live request tables and prefix pins at once",
    "tokens": "block manager: tokens a request holds at most (prompt, decode, drafts)",
    "batch": "scheduler: max batch size",
    "budget": "scheduler: max batched tokens",
    "requests": "scheduler: requests over the whole run",
    "prompt_tokens": "scheduler: longest prompt",
    "max_new": "scheduler: largest max_tokens",
    "gen_vocab": "scheduler: sampled token alphabet size",
    "capacity": "vllm-arc/vllm-lru: CPU blocks",
    "keys": "vllm-arc/vllm-lru: key alphabet size",
    "store_width": "vllm-arc/vllm-lru: keys per prepare_store",
    "touch_width": "vllm-arc/vllm-lru: keys per touch",
    "max_loads": "vllm-arc/vllm-lru: concurrent loads per block",
}


def add_parser(subparsers: Any) -> None:
    """Register ``explore`` on the CLI's subparsers."""
    from proofs.explorer import COMPONENTS

    p = subparsers.add_parser(
        "explore",
        help="exhaustive small-scope explorer: BFS over every call sequence, shortest "
        "counterexample",
    )
    p.add_argument("component", help=f"one of {', '.join(COMPONENTS)}")
    p.add_argument("--target", help="impl (default), spec, mutant:NAME, MOD:CLASS or FILE.py:CLASS")
    p.add_argument(
        "--variant",
        help="scheduler: legacy, exact or tight; vllm-arc: no_fallback or t1_fallback; "
        "vllm-lru: v2 or v1 (default: every variant, one search each)",
    )
    p.add_argument("--depth", type=int, help="stop after N calls (default: until complete)")
    p.add_argument(
        "--max-states",
        type=int,
        default=1_000_000,
        help="stop at N distinct states (memory bound; default 1,000,000)",
    )
    p.add_argument("--time-limit", type=float, help="stop after S seconds")
    bounds = p.add_argument_group("bounds (each applies to the components named)")
    for name in _INT_BOUNDS:
        bounds.add_argument("--" + name.replace("_", "-"), type=int, help=_HELP[name])
    bounds.add_argument(
        "--connector", action="store_true", help="scheduler: a scripted PD connector"
    )
    bounds.add_argument(
        "--speculation", action="store_true", help="scheduler: draft tokens in decode steps"
    )
    bounds.add_argument(
        "--soundness",
        action="store_true",
        help="scheduler: also fail when a decode step runs out of pages without draft tokens",
    )
    bounds.add_argument(
        "--no-prefix-caching", action="store_true", help="scheduler: prefix caching off"
    )
    bounds.add_argument(
        "--no-symmetry",
        action="store_true",
        help="vllm-arc/vllm-lru: explore states equal up to a renaming of keys separately",
    )
    bounds.add_argument(
        "--no-bad-inputs", action="store_true", help="leave rejected inputs out of the alphabet"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explore)


def _usage(message: str) -> Exception:
    from kvspec.cli import UsageError

    return UsageError(message)


def _load_target(component: str, target: str | None) -> tuple[str, Callable[..., Any]]:
    from kvspec.targets import COMPONENTS, TargetError, load_target
    from proofs.explorer import builtin_target

    if component in COMPONENTS:
        return load_target(component, target)
    label = target or "impl"
    try:  # the offload components, until kvspec.targets registers them
        return label, builtin_target(component, label)
    except ValueError:
        raise TargetError(
            f"--target {label} for {component}: only impl and spec until kvspec.targets "
            f"knows {component}"
        ) from None


def _overrides(args: argparse.Namespace, component: str) -> dict[str, Any]:
    from proofs.explorer import BOUNDS

    fields = {f.name for f in dataclasses.fields(BOUNDS[component])}
    given: dict[str, tuple[str, Any]] = {}
    for name in _INT_BOUNDS:
        value = getattr(args, name, None)
        if value is not None:
            given["--" + name.replace("_", "-")] = (name, value)
    for dest, (name, value) in _FLAGS.items():
        if getattr(args, dest, False):
            given["--" + dest.replace("_", "-")] = (name, value)
    wrong = [flag for flag, (name, _) in given.items() if name not in fields]
    if wrong:
        raise _usage(f"{', '.join(wrong)} does not apply to {component}")
    return {name: value for name, value in given.values()}


@contextmanager
def _progress(enabled: bool, component: str) -> Iterator[Callable[[str, int, int, int], None]]:
    """A live line on stderr: variant, distinct states, edges, depth, elapsed time."""
    from kvspec.cli import ERR

    if not enabled or not ERR.is_terminal:
        yield lambda variant, states, edges, depth: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[figures]}"),
        TimeElapsedColumn(),
        console=ERR,
        transient=True,
    ) as bar:
        task = bar.add_task(f"explore {component}", total=None, figures="")

        def update(variant: str, states: int, edges: int, depth: int) -> None:
            bar.update(
                task,
                description=f"explore {component}" + (f" [{variant}]" if variant else ""),
                figures=f"{states:,} states, {edges:,} edges, depth {depth}",
            )

        yield update


def cmd_explore(args: argparse.Namespace) -> int:
    """``kvspec explore``: 0 holds, 1 a violation (counterexample printed and saved), 2 could
    not run (raised as the CLI's UsageError / TargetError)."""
    from proofs import explorer

    component = args.component
    if component not in explorer.COMPONENTS:
        raise _usage(
            f"unknown component {component!r} (available: {', '.join(explorer.COMPONENTS)})"
        )
    names = explorer.variants(component)
    if args.variant is not None and args.variant not in names:
        if names == ("",):
            raise _usage(f"--variant does not apply to {component}")
        raise _usage(
            f"unknown {component} variant {args.variant!r}; choose one of {', '.join(names)}"
        )
    for option, value, low in (("--depth", args.depth, 1), ("--max-states", args.max_states, 1)):
        if value is not None and value < low:
            raise _usage(f"{option} must be at least {low}, got {value}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise _usage(f"--time-limit must be positive, got {args.time_limit}")
    overrides = _overrides(args, component)
    try:  # bounds first: a bad bound is a usage error even before the target loads
        for v in [args.variant] if args.variant else names:
            explorer.default_bounds(component, v, **overrides)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    label, cls = _load_target(component, args.target)
    deadline = None if args.time_limit is None else time.perf_counter() + args.time_limit
    try:
        with _progress(not args.json, component) as update:
            result = explorer.run(
                component,
                cls,
                label,
                variant_names=[args.variant] if args.variant else None,
                overrides=overrides,
                depth=args.depth,
                max_states=args.max_states,
                deadline=deadline,
                progress=update,
                save_dir=TRACE_DIR,
            )
    except explorer.ExplorerUnsupported as exc:
        raise _usage(str(exc)) from None
    document = result.to_json()
    if args.json:
        from kvspec.cli import emit

        emit(document, True)
    else:
        _print(document)
    return 0 if result.passed else 1


def _print(document: dict[str, Any]) -> None:
    from rich.table import Table

    from kvspec.cli import OUT, print_counterexample

    table = Table(title=f"explore {document['component']} vs {document['target']}")
    for column in ("variant", "states", "edges", "depth", "seconds", "states/s", "complete"):
        table.add_column(column, justify="right")
    for r in document["runs"]:
        table.add_row(
            r["variant"] or "-",
            f"{r['distinct_states']:,}",
            f"{r['edges']:,}",
            str(r["max_depth"]),
            f"{r['seconds']:.1f}",
            f"{r['states_per_second']:,}",
            "yes" if r["complete"] else "no",
        )
    OUT.print(table)
    bounds = ", ".join(f"{k}={v}" for k, v in document["bounds"].items())
    OUT.print(f"bounds: {bounds}")
    for r in document["runs"]:
        OUT.print(f"{r['variant'] or document['component']}: {r['message']}")
    for v in document["violations"]:
        cx = {
            "check": v["check"],
            "detail": v["detail"],
            "steps": v["steps"],
            "trace_file": v["trace_file"],
        }
        print_counterexample(cx)
        OUT.print(f"replay with the component checker: {v['replay']}")
    verdict = "[green]holds[/]" if not document["violations"] else "[red]VIOLATION[/]"
    OUT.print(
        f"explore {document['component']} vs {document['target']}: {verdict} — "
        f"{document['distinct_states']:,} states, {document['edges']:,} edges in "
        f"{document['seconds']:.1f}s ({document['states_per_second']:,} states/s)"
        + ("" if document["complete"] or document["violations"] else " — INCOMPLETE")
    )


def verify_stage() -> tuple[str, str]:
    """The explorer stage of ``kvspec verify`` (a few seconds): ``(status, summary)``."""
    from proofs.explorer import verify_stage as stage

    return stage()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvspec.explore COMPONENT …`` (the same as ``kvspec explore``)."""
    from kvspec.cli import UsageError
    from kvspec.targets import TargetError

    parser = argparse.ArgumentParser(prog="kvspec")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["explore", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.func(args)
    except (TargetError, UsageError) as exc:
        sys.stderr.write(f"kvspec: {' '.join(str(exc).split())}\n")
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
