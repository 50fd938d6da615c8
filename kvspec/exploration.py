"""``kvspec explore``: the exhaustive small-scope explorer on the command line.

``kvspec explore COMPONENT [--target …] [--variant V] [--depth N] [--max-states N] [bounds…]
[--json]`` runs :mod:`proofs.explorer` with the component's model and bounds from the registry (one
breadth-first search per variant unless ``--variant`` picks one) and prints a table, or one JSON
document with ``--json``. Exit status: 0 every reached state and every edge holds (``complete``
says whether the bounds were exhausted), 1 a violation (the shortest counterexample is printed and
saved under ``.kvspec/traces/``), 2 could not run.

The bound options are the fields of every registered component's bounds class: an integer field
``pages`` is ``--pages N``; a boolean field that is off by default is ``--NAME``, one that is on by
default is ``--no-NAME``. A bound given for a component whose bounds do not have it is a usage
error.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvspec import components
from kvspec.components import Component, ComponentError, resolve
from kvspec.output import (
    OUT,
    TRACE_DIR,
    UsageError,
    emit,
    print_counterexample,
    status_line,
)
from kvspec.targets import load_target
from stateful_tests.checker import INPUTS

# bounds set by other options: the variant by --variant, the bad-input alphabet by --inputs
_NOT_OPTIONS = ("variant", "bad_inputs")


def _bound_fields() -> dict[str, tuple[dataclasses.Field[Any], list[str], str]]:
    """Every bound of every registered explorer: name -> (field, components, help)."""
    found: dict[str, tuple[dataclasses.Field[Any], list[str], str]] = {}
    for comp in components.all_components():
        if comp.explorer is None:
            continue
        bounds_cls = resolve(comp.explorer.bounds)
        help_texts = getattr(bounds_cls, "HELP", {})
        for f in dataclasses.fields(bounds_cls):
            if f.name in _NOT_OPTIONS:
                continue
            owners = found.setdefault(f.name, (f, [], help_texts.get(f.name, f.name)))[1]
            owners.append(comp.name)
    return found


def _flag(name: str, f: dataclasses.Field[Any]) -> str:
    """The option for a bound: ``--name`` (an int, or a bool off by default), ``--no-name``."""
    option = name.replace("_", "-")
    return f"--no-{option}" if f.type in (bool, "bool") and f.default is True else f"--{option}"


def add_parser(subparsers: Any) -> None:
    """Register ``explore`` on the CLI's subparsers."""
    explorable = [c.name for c in components.all_components() if c.explorer is not None]
    p = subparsers.add_parser(
        "explore",
        help="exhaustive small-scope explorer: BFS over every call sequence, shortest "
        "counterexample",
    )
    p.add_argument("component", help=f"one of {', '.join(explorable)}")
    p.add_argument(
        "--target",
        help="impl (default), spec, mutant:NAME, MOD:CLASS, FILE.py:CLASS, an engine name, "
        "ENGINE@SOURCE or a bare SOURCE (git:REPO[@REV], a wheel, a tree)",
    )
    p.add_argument(
        "--variant",
        help=f"{components.describe_variants()} (default: every variant, one search each)",
    )
    from kvspec.runs import oracle_options

    oracle_options(p)
    p.add_argument(
        "--scope",
        help="a named product of configurations (option values) explored one after the other: "
        "default (without --scope or bound options: each option the base leaves off, on a small "
        "configuration, then the base), base (the component's default bounds alone; without "
        "--scope when a bound option is given)",
    )
    p.add_argument("--depth", type=int, help="stop after N calls (default: until complete)")
    p.add_argument(
        "--max-states",
        type=int,
        help="stop at N distinct states (default: no bound but --max-memory)",
    )
    p.add_argument(
        "--max-memory",
        type=float,
        metavar="MB",
        help=(
            "stop when the search's processes hold more than MB resident, split evenly between "
            "them (default: 75%% of the memory available when the search starts)"
        ),
    )
    p.add_argument("--time-limit", type=float, help="stop after S seconds")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing each breadth-first layer (default 1)",
    )
    p.add_argument(
        "--address",
        help="run the --workers as Ray actors on this cluster (auto, HOST:PORT, "
        "ray://HOST:10001; local: a new local Ray instance); needs kvspec[distributed]",
    )
    p.add_argument(
        "--plot", metavar="FILE.png", help="distinct states per depth (needs kvspec[plot])"
    )
    p.add_argument(
        "--no-memo",
        dest="memo",
        action="store_false",
        help="run every edge instead of judging calls from a pair already explored by their "
        "remembered outcome (a soundness cross-check)",
    )
    p.add_argument(
        "--inputs",
        choices=INPUTS,
        default="all",
        help="well-formed: leave rejected inputs out of the alphabet (default all)",
    )
    group = p.add_argument_group("bounds (each applies to the components named)")
    for name, (f, owners, text) in _bound_fields().items():
        flag = _flag(name, f)
        where = f" ({', '.join(owners)})"
        if f.type in (bool, "bool"):
            text = f"turn off {text}" if f.default is True else text
            group.add_argument(flag, dest=f"bound_{name}", action="store_true", help=text + where)
        else:
            group.add_argument(flag, dest=f"bound_{name}", type=int, metavar="N", help=text + where)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explore)


def _overrides(args: argparse.Namespace, comp: Component) -> dict[str, Any]:
    """The bounds given on the command line (``UsageError`` for one this component lacks)."""
    assert comp.explorer is not None
    mine = {f.name for f in dataclasses.fields(resolve(comp.explorer.bounds))}
    given: dict[str, Any] = {}
    wrong: list[str] = []
    for name, (f, _, _) in _bound_fields().items():
        value = getattr(args, f"bound_{name}", None)
        if value is None or value is False:
            continue
        if name not in mine:
            wrong.append(_flag(name, f))
            continue
        given[name] = (not f.default) if f.type in (bool, "bool") else value
    if wrong:
        raise UsageError(f"{', '.join(wrong)} does not apply to {comp.name}")
    return given


def bound_overrides(comp: Component, options: Mapping[str, Any]) -> dict[str, Any]:
    """Checker options that are also bounds of the component's explorer (a mutant's PD
    connector, say) as bound overrides."""
    if comp.explorer is None:
        return {}
    names = {f.name for f in dataclasses.fields(resolve(comp.explorer.bounds))}
    return {k: v for k, v in options.items() if k in names and v is not None}


def explore_component(
    comp: Component,
    target_cls: Callable[..., Any],
    target: str,
    *,
    variants: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    depth: int | None = None,
    max_states: int | None = 1_000_000,
    max_memory_mb: float | None = None,
    deadline: float | None = None,
    progress: Callable[[str, int, int, int], None] | None = None,
    save_dir: Any = None,
    inputs: str = "all",
    workers: int = 1,
    memo: bool = True,
    backend: Callable[[], Any] | None = None,
    reference: Any = None,
    scope: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """One ``proofs.explorer.run`` of ``comp`` (every variant unless ``variants`` are given) over
    the configurations of ``scope`` (``None``: ``default``, or ``base`` when ``overrides`` set
    bounds), its values over ``defaults``;
    ``backend``: a factory of the workers' backend (default: forked local processes);
    ``reference``: what the target is compared with (default: the spec)."""
    from proofs import explorer

    if comp.explorer is None:
        raise ComponentError(f"{comp.name} has no explorer model")
    return explorer.run(
        comp.name,
        resolve(comp.explorer.model),
        resolve(comp.explorer.bounds),
        target_cls,
        target,
        variants=list(variants or comp.variants or ("",)),
        overrides=overrides,
        options=comp.fixed_options,
        depth=depth,
        max_states=max_states,
        max_memory_mb=max_memory_mb,
        deadline=deadline,
        progress=progress,
        save_dir=save_dir,
        inputs=inputs,
        workers=workers,
        memo=memo,
        backend=backend,
        reference=reference,
        scope=scope,
        defaults=defaults,
    )


def cmd_explore(args: argparse.Namespace) -> int:
    """``kvspec explore``: 0 holds, 1 a violation (counterexample printed and saved), 2 could
    not run (raised as UsageError / TargetError / ComponentError)."""
    from proofs import explorer

    comp = components.get(args.component)
    if comp.explorer is None:
        raise UsageError(f"{comp.name} has no explorer model")
    variant = comp.check_variant(args.variant)
    for option, value in (
        ("--depth", args.depth),
        ("--max-states", args.max_states),
        ("--workers", args.workers),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be at least 1, got {value}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise UsageError(f"--time-limit must be positive, got {args.time_limit}")
    if args.max_memory is not None and args.max_memory <= 0:
        raise UsageError(f"--max-memory must be positive, got {args.max_memory}")
    max_memory = args.max_memory if args.max_memory is not None else default_memory_mb()
    if args.plot:
        from kvspec import plots

        plots.require()
    overrides = _overrides(args, comp)
    bounds_cls = resolve(comp.explorer.bounds)
    if args.inputs == "well-formed" and "bad_inputs" in explorer.bound_names(bounds_cls):
        overrides["bad_inputs"] = False
    chosen = [variant] if variant else list(comp.variants or ("",))
    try:  # bounds first: a bad bound is a usage error even before the target loads
        scope = args.scope or explorer.default_scope(overrides)
        explorer.plan(bounds_cls, scope, chosen, overrides, component=comp.name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from kvspec.runs import setup

    label, cls, reference, own = setup(args, comp, variant)
    if own is not None:
        chosen = [own]  # the variant named, or the one the target implements
    elif not variant:
        chosen = list(comp.target_variants(cls) or chosen)
    deadline = None if args.time_limit is None else time.perf_counter() + args.time_limit
    backend, shutdown = _ray_backend(args.address, args.workers)
    try:
        with status_line(f"explore {comp.name}", not args.json) as line:

            def update(v: str, states: int, edges: int, depth: int) -> None:
                line(
                    f"explore {comp.name}" + (f" [{v}]" if v else ""),
                    f"{states:,} states, {edges:,} edges, depth {depth}",
                )

            result = explore_component(
                comp,
                cls,
                label,
                variants=chosen,
                overrides=overrides,
                depth=args.depth,
                max_states=args.max_states,
                max_memory_mb=max_memory,
                deadline=deadline,
                progress=update,
                save_dir=TRACE_DIR,
                inputs=args.inputs,
                workers=args.workers,
                memo=args.memo,
                backend=backend,
                reference=reference,
                scope=args.scope,
            )
    except explorer.ExplorerUnsupported as exc:
        raise UsageError(str(exc)) from None
    finally:
        shutdown()
    from kvspec.runs import oracle_fields

    document = {
        **result.to_json(),
        **oracle_fields(reference),
        "inputs": args.inputs,
        "address": args.address,
    }
    if args.plot:
        from kvspec import plots

        document["plot"] = str(plots.explore(document, args.plot))
    if args.json:
        emit(document, True)
    else:
        _print(document)
    return 0 if result.passed else 1


def default_memory_mb() -> float | None:
    """75% of the memory available now (``MemAvailable``), ``None`` where the system does not
    say (no bound but the others)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return round(int(line.split()[1]) / 1024 * 0.75)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _ray_backend(
    address: str | None, workers: int
) -> tuple[Callable[[], Any] | None, Callable[[], None]]:
    """With ``--address``: (a factory of Ray backends, the shutdown to call at the end). Ray is
    joined once for every variant's search, not once per search."""
    if address is None:
        return None, lambda: None
    from kvspec import distributed

    ray, owned = distributed.connect(address, workers)
    return (lambda: distributed.RayBackend(address)), (ray.shutdown if owned else lambda: None)


def _print(document: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"explore {document['component']} vs {document['target']}")
    columns = (
        "configuration",
        "variant",
        "states",
        "edges",
        "depth",
        "seconds",
        "states/s",
        "edges/s",
        "peak MB",
    )
    for column in (*columns, "complete"):
        table.add_column(column, justify="right")
    for r in document["runs"]:
        table.add_row(
            r.get("configuration") or "-",
            r["variant"] or "-",
            f"{r['distinct_states']:,}",
            f"{r['edges']:,}",
            str(r["max_depth"]),
            f"{r['seconds']:.1f}",
            f"{r['states_per_second']:,}",
            f"{r['edges_per_second']:,}",
            f"{r['peak_memory_mb']:,.0f}",
            "yes" if r["complete"] else "no",
        )
    OUT.print(table)
    bounds = ", ".join(f"{k}={v}" for k, v in document["bounds"].items())
    OUT.print(f"bounds: {bounds}")
    _print_coverage(document.get("coverage"))
    for r in document["runs"]:
        OUT.print(f"{r['variant'] or document['component']}: {r['message']}")
    OUT.print(cost_line(document))
    if document.get("plot"):
        OUT.print(f"plot: {document['plot']}")
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
        f"{document['seconds']:.1f}s ({document['states_per_second']:,} states/s, "
        f"{document['edges_per_second']:,} edges/s, peak {document['peak_memory_mb']:,.0f} MB, "
        f"{document['workers']} worker{'s' if document['workers'] > 1 else ''})"
        + ("" if document["complete"] or document["violations"] else " — INCOMPLETE")
    )


def cost_line(document: Mapping[str, Any]) -> str:
    """The floor (calls' own seconds against the rest) and, on workers, the parallel
    efficiency, as one console line."""
    f = document["floor"]
    line = (
        f"cost: {f['call_seconds']:,.1f} s inside spec and target calls, {f['rest_seconds']:,.1f} s "
        f"the rest ({f['rest_over_calls']:.2f} per call-second; goal <= 0.50)"
    )
    if document.get("parallel_efficiency") is not None:
        line += f"; parallel efficiency {document['parallel_efficiency']:.0%}"
    return line


def _print_coverage(cov: dict[str, Any] | None) -> None:
    """What the run covered: the scope, its configurations (those a stop left out named), each
    option dimension's values and the operations no state offered."""
    if not cov:
        return
    left = [c["name"] for c in cov["configurations"] if not c["explored"]]
    names = ", ".join(c["name"] for c in cov["configurations"])
    OUT.print(
        f"scope {cov['scope']}: configurations {names}"
        + (f" [yellow](not reached: {', '.join(left)})[/]" if left else "")
    )
    dims = "; ".join(f"{d}={'/'.join(str(v) for v in vs)}" for d, vs in cov["dimensions"].items())
    if dims:
        OUT.print(f"option values covered: {dims}")
    unreached = cov["unreached_operations"]
    OUT.print("operations never reached: " + (", ".join(unreached) if unreached else "none"))


def scope_gaps(coverage: Mapping[str, Any]) -> list[str]:
    """What a default-scope run left out that its scope promises: operations of the alphabet
    never offered, and on/off dimensions explored at one value only."""
    gaps = [f"operation {op} never reached" for op in coverage.get("unreached_operations", ())]
    for name, values in coverage.get("dimensions", {}).items():
        if values and all(isinstance(v, bool) for v in values) and len(set(values)) < 2:
            gaps.append(f"option {name} explored {values[0]} only")
    return gaps


def verify_stage(quick: bool = False) -> tuple[str, str]:
    """``kvspec verify``'s explorer stage: impl against spec, every component's default scope
    explored completely, its base replaced by the smaller verify bounds (the option
    configurations keep their own values); it fails when the scope leaves an operation or an
    on/off option out (:func:`scope_gaps`). Returns ``(status, summary)``."""
    parts: list[str] = []
    for comp in components.all_components():
        if comp.explorer is None:
            continue
        label, cls = load_target(comp.name, "impl")
        result = explore_component(
            comp,
            cls,
            label,
            scope="default",
            defaults=comp.explorer.verify_scope,
            max_states=200_000,
        )
        doc = result.to_json()
        if not result.passed:
            v = doc["violations"][0]
            return "fail", f"{comp.name}: {v['check']} after {v['depth']} calls: {v['detail']}"
        if not doc["complete"]:
            return (
                "fail",
                f"{comp.name}: the small scope did not complete ({doc['runs'][-1]['message']})",
            )
        gaps = scope_gaps(doc["coverage"])
        if gaps:  # "complete" would mean complete for less than the documented scope
            return "fail", f"{comp.name}: the default scope left out: {'; '.join(gaps)}"
        parts.append(f"{comp.name} {doc['distinct_states']:,}")
    return "pass", "complete, no violation; states: " + ", ".join(parts)
