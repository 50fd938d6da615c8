"""``kvspec soak``: the seeded fuzzer at volume, its seeds fanned out over workers.

A soak is ``kvspec fuzz`` cut into *seed tasks*: task ``i`` is one fuzzer run
(:meth:`~kvspec.components.Component.fuzz`, every check after every call) of ``--chunk`` calls from
seed ``--seed + i`` (with ``--variant all``: in variant ``i mod k``), on whichever worker is free —
a forked local process (:class:`~kvspec.distributed.ProcessPool`) or a Ray task
(:class:`~kvspec.distributed.RayPool`: a local Ray instance, or the cluster at ``--address``). The
tasks of a run are the same whatever runs them, so the workers, the backend and the order they
finish in change the speed, never the calls made: ``--ops N`` makes the same calls with 1 worker
or 64, and the same coverage.

The driver keeps ``--workers`` tasks in flight and stops submitting when the budget is spent
(``--ops``: every task submitted; ``--duration``: the time is up), at the first divergence, or on
Ctrl-C (in-flight tasks are cancelled; what finished is reported). After a divergence it waits for
the tasks in flight, so the divergence reported is that of the lowest failing task — the same one
on any backend; its trace is shrunk (as ``kvspec fuzz`` does) and saved with the seed that found
it, replayable by ``kvspec replay``.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec import components
from kvspec.output import OUT, UsageError, emit, live_bar, print_counterexample, print_coverage
from kvspec.targets import load_target

# calls per seed task: about a second of one worker, so that progress and Ctrl-C are prompt
CHUNK = 10_000
TIMELINE_POINTS = 400  # at most this many (seconds, calls, coverage keys) samples in the JSON


@dataclass(frozen=True)
class Job:
    """What every seed task of one soak shares (pickled to each worker)."""

    component: str
    target: str  # as --target names it: a worker loads it again
    inputs: str
    timeout: float | None
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Task:
    index: int
    seed: int
    ops: int
    variant: str | None


_LOADED: dict[tuple[str, str], tuple[str, Any]] = {}


def _target(component: str, target: str) -> tuple[str, Any]:
    """The target, loaded once per process (a forked worker inherits the driver's)."""
    key = (component, target)
    if key not in _LOADED:
        _LOADED[key] = load_target(component, target)
    return _LOADED[key]


def run_task(job: Job, task: Task) -> dict[str, Any]:
    """One seed task, in a worker: ``task.ops`` fuzzer calls from ``task.seed``."""
    comp = components.get(job.component)
    label, cls = _target(job.component, job.target)
    cpu, wall = time.process_time(), time.perf_counter()
    result = comp.fuzz(
        cls,
        label,
        task.ops,
        task.seed,
        variant=task.variant,
        inputs=job.inputs,
        timeout=job.timeout,
        **job.options,
    )
    return {
        "index": task.index,
        "seed": task.seed,
        "planned": task.ops,
        "variant": task.variant,
        "ops": result.steps,
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "coverage": result.coverage,
        "passed": result.passed,
        "trace": result.trace,
    }


@dataclass
class Soak:
    """What the driver has gathered: finished tasks, the union of their coverage, a timeline."""

    started: float = field(default_factory=time.perf_counter)
    done: list[dict[str, Any]] = field(default_factory=list)
    coverage: Counter[str] = field(default_factory=Counter)
    ops: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    stopped_by: str | None = None

    def add(self, out: dict[str, Any]) -> None:
        self.done.append(out)
        self.ops += out["ops"]
        self.coverage.update(out["coverage"])
        self.timeline.append((self.elapsed(), self.ops, len(self.coverage)))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def failures(self) -> list[dict[str, Any]]:
        return sorted((d for d in self.done if not d["passed"]), key=lambda d: d["index"])

    def per_worker(self) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for d in sorted(self.done, key=lambda d: d["index"]):
            row = rows.setdefault(
                d["worker"], {"worker": d["worker"], "tasks": 0, "ops": 0, "seconds": 0.0}
            )
            row["tasks"] += 1
            row["ops"] += d["ops"]
            row["seconds"] += d["seconds"]
            row["cpu_seconds"] = row.get("cpu_seconds", 0.0) + d["cpu_seconds"]
        for row in rows.values():
            row["ops_per_second"] = round(row["ops"] / row["seconds"]) if row["seconds"] else None
            row["calls_per_cpu_second"] = (
                round(row["ops"] / row["cpu_seconds"], 1) if row["cpu_seconds"] else None
            )
            row["seconds"] = round(row["seconds"], 3)
            row["cpu_seconds"] = round(row["cpu_seconds"], 3)
        return list(rows.values())


def plan(
    variant: str | None, variants: tuple[str, ...], seed: int, chunk: int, ops: int | None
) -> Iterator[Task]:
    """The seed tasks, in order (endless with ``ops=None``): task ``i`` runs from ``seed + i``,
    in ``variants[i % k]`` for ``--variant all``."""
    index = 0
    while ops is None or index * chunk < ops:
        size = chunk if ops is None else min(chunk, ops - index * chunk)
        chosen = variants[index % len(variants)] if variant == "all" else variant
        yield Task(index, seed + index, size, chosen)
        index += 1


def drive(
    pool: Any,
    job: Job,
    tasks: Iterator[Task],
    *,
    duration: float | None,
    update: Callable[[Soak], None] = lambda soak: None,
) -> Soak:
    """Keep ``pool.workers`` tasks in flight until the budget, a divergence or Ctrl-C."""
    soak = Soak()
    deadline = None if duration is None else soak.started + duration
    flight: set[int] = set()
    try:
        while True:
            while soak.stopped_by is None and len(flight) < pool.workers:
                task = next(tasks, None)
                if task is None:
                    soak.stopped_by = "ops"
                    break
                pool.submit(task.index, run_task, job, task)
                flight.add(task.index)
            if not flight:
                break
            for key, out, exc in pool.wait(0.2):
                flight.discard(key)
                if exc is not None:
                    raise exc  # a target that cannot be loaded or built: exit 2 in main()
                soak.add(out)
                if not out["passed"] and soak.stopped_by in (None, "ops", "duration"):
                    soak.stopped_by = "divergence"  # tasks in flight still finish
            if soak.stopped_by is None and deadline is not None and time.perf_counter() > deadline:
                soak.stopped_by = "duration"
            update(soak)
    except KeyboardInterrupt:
        soak.stopped_by = "interrupt"
        pool.close(cancel=True)
        return soak
    except BaseException:
        pool.close(cancel=True)  # no worker outlives a driver that cannot go on
        raise
    pool.close()
    return soak


# ----------------------------------------------------------------------------- command line
def add_parser(
    subparsers: Any,
    flags: Callable[[argparse.ArgumentParser, str], None],
    inputs: Callable[[argparse.ArgumentParser, str | None], None],
) -> None:
    """Register ``soak`` (``flags``/``inputs``: the CLI's component flags and ``--inputs``)."""
    names = ", ".join(components.names())
    p = subparsers.add_parser(
        "soak", help="the fuzzer at volume: seed tasks fanned out over processes or Ray"
    )
    p.add_argument("component", help=f"one of {names}")
    p.add_argument("--target", help="impl (default), spec, mutant:NAME, MOD:CLASS or FILE.py:CLASS")
    p.add_argument(
        "--variant",
        help=f"{components.describe_variants()}, or all: task i runs variant i mod k "
        "(default: drawn per episode)",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--ops", type=int, help="lockstep calls in all (default 1,000,000)")
    budget.add_argument("--duration", type=float, metavar="S", help="stop submitting after S s")
    p.add_argument(
        "--workers",
        type=int,
        help="tasks in flight (default: this machine's CPUs, or the cluster's with --address)",
    )
    p.add_argument(
        "--address",
        help="join this Ray cluster (auto, HOST:PORT, ray://HOST:10001; local: a new local one)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "ray", "processes"),
        default="auto",
        help="auto (default): Ray if it is installed, else local processes",
    )
    p.add_argument("--seed", type=int, default=0, help="task i runs from seed S + i (default 0)")
    p.add_argument("--chunk", type=int, default=CHUNK, help=f"calls per task (default {CHUNK:,})")
    p.add_argument("--no-shrink", action="store_true", help="keep the raw failing episode")
    inputs(p, "all")
    flags(p, "")
    p.add_argument("--coverage", action="store_true", help="print the union of the coverage")
    p.add_argument(
        "--plot", metavar="FILE.png", help="calls/s and coverage over time (needs [plot])"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_soak)


def _pool(args: argparse.Namespace) -> Any:
    from kvspec import distributed

    backend = args.backend
    if backend == "auto":
        backend = "ray" if args.address or distributed.ray_available() else "processes"
    if backend == "processes":
        if args.address:
            raise UsageError("--address needs the Ray backend (--backend ray or auto)")
        return distributed.ProcessPool(args.workers or os.cpu_count() or 1)
    return distributed.RayPool(args.workers, args.address)


def _variants(comp: Any, given: str | None, cls: Any) -> tuple[str | None, tuple[str, ...]]:
    """(variant of every task, or ``all``; the variants ``all`` cycles through)."""
    if given == "all":
        if not comp.variants:
            raise UsageError(f"--variant all: {comp.name} has no variants")
        own = comp.target_variant(None, cls)  # a target that implements one variant only
        return ("all", comp.variants) if own is None else (own, (own,))
    return comp.target_variant(comp.check_variant(given), cls), tuple(comp.variants)


def cmd_soak(args: argparse.Namespace) -> int:
    from kvspec import plots

    comp = components.get(args.component)
    options = components.options_of(comp, vars(args))
    for option, value in (
        ("--workers", args.workers),
        ("--chunk", args.chunk),
        ("--ops", args.ops),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be at least 1, got {value}")
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be positive, got {args.duration}")
    if args.plot:
        plots.require()
    ops = None if args.duration is not None else (args.ops or 1_000_000)
    label, cls = _target(comp.name, args.target or "impl")  # before the fork: workers inherit it
    variant, variants = _variants(comp, args.variant, cls)
    job = Job(comp.name, args.target or "impl", args.inputs, args.call_timeout or None, options)
    pool = _pool(args)
    cpu = time.process_time()
    total = ops if ops is not None else args.duration
    with live_bar(f"soak {comp.name} vs {label}", total, not args.json) as bar:

        def update(soak: Soak) -> None:
            seconds = soak.elapsed()
            bar(
                soak.ops if ops is not None else min(seconds, args.duration),
                f"{soak.ops:,} calls, {soak.ops / seconds:,.0f}/s, "
                f"{len(soak.coverage)} coverage keys, {pool.workers} workers",
            )

        soak = drive(
            pool, job, plan(variant, variants, args.seed, args.chunk, ops),
            duration=args.duration, update=update,
        )  # fmt: skip
    seconds = soak.elapsed()
    document = report(soak, comp, label, args, pool, seconds, time.process_time() - cpu)
    document["counterexample"] = _counterexample(soak, comp, cls, label, args, options)
    if args.plot:
        document["plot"] = str(plots.soak(document, args.plot))
    emit(document, args.json)
    if not args.json:
        _print(document, args)
    return 1 if soak.failures else 0


def report(
    soak: Soak,
    comp: Any,
    label: str,
    args: argparse.Namespace,
    pool: Any,
    seconds: float,
    driver_cpu: float,
) -> dict[str, Any]:
    """The JSON document (docs/design.md, CLI contract), without the counterexample."""
    cpu = sum(d["cpu_seconds"] for d in soak.done)
    per_worker = soak.per_worker()
    busiest = max((w["cpu_seconds"] for w in per_worker), default=0.0)
    seeds = [d["seed"] for d in soak.done]
    step = max(1, -(-len(soak.timeline) // TIMELINE_POINTS))
    timeline = soak.timeline[::step]
    if soak.timeline and timeline[-1] is not soak.timeline[-1]:
        timeline.append(soak.timeline[-1])  # the last sample always: the run's totals
    return {
        "component": comp.name,
        "target": label,
        "variant": args.variant,
        "variants": sorted({d["variant"] for d in soak.done if d["variant"]}),
        "inputs": args.inputs,
        "backend": pool.kind,
        "address": args.address,
        "workers": pool.workers,
        "ops": soak.ops,
        "seconds": round(seconds, 3),
        "ops_per_second": round(soak.ops / seconds) if seconds else None,
        # every op is one lockstep call with every check; per CPU second of the workers too,
        # the steadier figure on a shared machine
        "cpu_seconds": round(cpu, 3),
        "calls_per_cpu_second": round(soak.ops / cpu, 1) if cpu else None,
        "driver_cpu_seconds": round(driver_cpu, 3),
        # the rate with a free core per worker: calls / the busiest worker's CPU seconds (the wall
        # rate falls below it when the workers share their cores with other work)
        "cpu_bound_ops_per_second": round(soak.ops / busiest) if busiest else None,
        "tasks": len(soak.done),
        "chunk": args.chunk,
        "seeds": [min(seeds), max(seeds)] if seeds else [],
        "stopped_by": soak.stopped_by,
        "per_worker": per_worker,
        "coverage": dict(sorted(soak.coverage.items())),
        "coverage_keys": len(soak.coverage),
        "divergences": len(soak.failures),
        "timeline": [
            {"seconds": round(t, 3), "ops": n, "coverage_keys": k} for t, n, k in timeline
        ],
        "plot": None,
    }


def _counterexample(
    soak: Soak,
    comp: Any,
    cls: Any,
    label: str,
    args: argparse.Namespace,
    options: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The lowest failing task's trace, shrunk and saved with the seed that found it."""
    from kvspec.output import TRACE_DIR, trace_path
    from stateful_tests.lockstep import save_trace

    if not soak.failures:
        return None
    first = soak.failures[0]
    trace = first["trace"]
    if not args.no_shrink:
        trace = comp.shrink(trace, cls, label, budget_seconds=10.0, **options)
    again = f"kvspec fuzz {comp.name} --seed {first['seed']} --ops {first['planned']}"
    if args.target:
        again += f" --target {args.target}"
    if first["variant"]:
        again += f" --variant {first['variant']}"
    found = {"seed": first["seed"], "variant": first["variant"], "task": first["index"]}
    trace = {**trace, "soak": {**found, "fuzz": again}}
    path = save_trace(trace, TRACE_DIR, trace_path(TRACE_DIR, f"soak-{comp.name}-{label[-60:]}"))
    failure = trace.get("failure") or {}
    return {
        "check": failure.get("check"),
        "detail": failure.get("detail"),
        "steps": trace["steps"],
        "trace_file": str(path),
        **found,
        "fuzz": again,
    }


def _print(document: Mapping[str, Any], args: argparse.Namespace) -> None:
    from rich.table import Table

    if args.coverage:
        print_coverage(document["coverage"])
    table = Table(title=f"soak {document['component']} vs {document['target']} — per worker")
    for column in ("worker", "tasks", "calls", "busy s", "calls/s", "calls/CPU s"):
        table.add_column(column, justify="right")
    for w in document["per_worker"]:
        table.add_row(
            w["worker"],
            str(w["tasks"]),
            f"{w['ops']:,}",
            f"{w['seconds']:.1f}",
            f"{w['ops_per_second'] or 0:,}",
            f"{w['calls_per_cpu_second'] or 0:,.0f}",
        )
    OUT.print(table)
    cx = document["counterexample"]
    if cx:
        print_counterexample(cx)
        OUT.print(f"found by seed {cx['seed']} (variant {cx['variant'] or 'drawn'}): {cx['fuzz']}")
    verdict = "[green]no divergence[/]" if not document["divergences"] else "[red]DIVERGENCE[/]"
    OUT.print(
        f"soak {document['component']} vs {document['target']}: {document['ops']:,} calls in "
        f"{document['seconds']:.1f}s ({document['ops_per_second'] or 0:,} calls/s, "
        f"{document['calls_per_cpu_second'] or 0:,.0f} per CPU second) on {document['workers']} "
        f"workers ({document['backend']}), {document['coverage_keys']} coverage keys, stopped by "
        f"{document['stopped_by']}: {verdict}"
        + (f"; plot {document['plot']}" if document["plot"] else "")
    )
