"""The explorer's entry points: bounds from overrides, one search per variant.

What ``kvspec explore``, ``kvspec mutants`` (the explorer column) and ``kvspec verify`` call, with
the component's parts taken from the registry (``kvspec.components``): its model class, its bounds
class and its variants. :func:`make_bounds` turns command-line overrides into a validated bounds
object; :func:`run` explores one component against one target, one breadth-first search per
variant.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

from proofs.explorer.search import ExploreResult, efficiency, explore, floor


def bound_names(bounds_cls: type) -> tuple[str, ...]:
    """The bounds a command line may set (every field but ``variant``)."""
    return tuple(f.name for f in dataclasses.fields(bounds_cls) if f.name != "variant")


Configuration = tuple[str, Mapping[str, Any]]


def scopes(bounds_cls: type) -> dict[str, tuple[Configuration, ...]]:
    """The named scopes of a bounds class: each a tuple of ``(name, bound values)``
    configurations, explored one after the other (``SCOPES``): ``default`` (what ``kvspec explore``
    runs without ``--scope`` or bounds: each option the base leaves off on a small configuration,
    then the base) and ``base`` (the defaults alone); a class without ``SCOPES`` has only the
    base, under both names."""
    found: dict[str, tuple[Configuration, ...]] = dict(getattr(bounds_cls, "SCOPES", {}))
    found.setdefault("default", (("base", {}),))
    found.setdefault("base", (("base", {}),))
    return found


# bounds that say how to explore rather than which configuration: they keep the default scope
_NOT_A_CONFIGURATION = frozenset({"bad_inputs"})


def default_scope(overrides: Mapping[str, Any] | None) -> str:
    """The scope of a run that names none: ``default``, or ``base`` when bounds are given (a
    command line that sets bounds asks for that one configuration)."""
    return "base" if set(overrides or ()) - _NOT_A_CONFIGURATION else "default"


def configurations(bounds_cls: type, scope: str, *, component: str) -> tuple[Configuration, ...]:
    """The configurations of ``scope`` (``ValueError`` naming the scopes there are)."""
    known = scopes(bounds_cls)
    if scope not in known:
        raise ValueError(f"{component} has no scope {scope!r} (scopes: {', '.join(sorted(known))})")
    return known[scope]


def plan(
    bounds_cls: type,
    scope: str,
    variants: Sequence[str],
    overrides: Mapping[str, Any],
    *,
    component: str,
    defaults: Mapping[str, Any] | None = None,
) -> list[tuple[str, str, Any]]:
    """``(configuration, variant, bounds)`` of each search ``scope`` makes over ``variants``, in
    order, validated (``ValueError``): ``overrides`` win over a configuration's values, which win
    over ``defaults`` (``kvspec verify``'s smaller base), a
    configuration pinned to one variant (its ``variant`` value) runs for that one when several
    are explored, configurations whose bounds come out equal run once, and an option
    configuration that only the overrides make invalid is left out."""
    out: list[tuple[str, str, Any]] = []
    seen: set[Any] = set()
    for name, values in configurations(bounds_cls, scope, component=component):
        pinned = values.get("variant")
        rest = {k: x for k, x in values.items() if k != "variant"}
        for v in [pinned] if isinstance(pinned, str) and pinned in variants else variants:
            values = {**(defaults or {}), **rest, **overrides}
            try:
                bounds = make_bounds(bounds_cls, v, values, component=component)
            except ValueError:
                if name == "base" or not overrides:
                    raise
                # an option configuration the overrides rule out (a mutant's PD connector
                # with the Mamba configuration): left out, and reported as not explored
                make_bounds(bounds_cls, v, {**(defaults or {}), **rest}, component=component)
                continue
            if bounds not in seen:
                seen.add(bounds)
                out.append((name, v, bounds))
    return out


def dimensions(bounds_cls: type) -> tuple[str, ...]:
    """The option dimensions a report lists the covered values of (``DIMENSIONS``)."""
    return tuple(getattr(bounds_cls, "DIMENSIONS", ()))


def make_bounds(
    bounds_cls: type, variant: str, overrides: Mapping[str, Any], *, component: str
) -> Any:
    """The default small scope of ``bounds_cls`` with ``overrides`` and ``variant`` (if it has a
    ``variant`` field), validated: ``ValueError`` if a bound is out of range or not one of this
    component's. A bounds class may adjust defaults in a ``create(**values)`` class method."""
    names = {f.name for f in dataclasses.fields(bounds_cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"{', '.join('--' + u.replace('_', '-') for u in unknown)} does not apply to "
            f"{component}"
        )
    values = dict(overrides)
    if "variant" in names:
        values["variant"] = variant
    create = getattr(bounds_cls, "create", bounds_cls)
    bounds = create(**values)
    bounds.validate()
    return bounds


@dataclass
class Exploration:
    """One ``kvspec explore`` run: one search per variant (the CLI's JSON document)."""

    component: str
    target: str
    runs: list[tuple[str, ExploreResult]] = field(default_factory=list)
    scope: str = "base"
    # parallel to ``runs``: the configuration each search ran
    configs: list[str] = field(default_factory=list)
    # the scope's configurations (name, bound values) and the dimensions reported
    planned: tuple[Configuration, ...] = ()
    dimensions: tuple[str, ...] = ()
    operations: tuple[str, ...] = ()  # every operation the model can offer

    def coverage(self) -> dict[str, Any]:
        """What this run explored: the scope, its configurations (and those a stop left out),
        each dimension's values covered, and the operations no expanded state offered."""
        ran = set(self.configs)
        values: dict[str, set[Any]] = {d: set() for d in self.dimensions}
        for _, r in self.runs:
            for d in self.dimensions:
                if d in r.bounds:
                    values[d].add(r.bounds[d])
        reached = {m for _, r in self.runs for m in r.operations}
        return {
            "scope": self.scope,
            "configurations": [
                {"name": n, "bounds": dict(b), "explored": n in ran} for n, b in self.planned
            ],
            "dimensions": {d: sorted(v, key=repr) for d, v in values.items()},
            "unreached_operations": [op for op in self.operations if op not in reached],
        }

    @property
    def passed(self) -> bool:
        return all(r.passed for _, r in self.runs)

    def to_json(self) -> dict[str, Any]:
        results = [r for _, r in self.runs]
        depths = [r.states_per_depth for r in results]  # summed over the variants' searches
        seconds = sum(r.seconds for r in results)
        states = sum(r.distinct_states for r in results)
        # the bounds every search shared (a scope's configurations differ in the others)
        bounds = dict(results[0].bounds) if results else {}
        for r in results[1:]:
            bounds = {k: v for k, v in bounds.items() if r.bounds.get(k) == v}
        bounds.pop("variant", None)
        if results and "variant" in results[0].bounds:
            bounds["variants"] = list(dict.fromkeys(v for v, _ in self.runs))
        violations = [
            {"variant": v or None, **x.to_json()} for v, r in self.runs for x in r.violations
        ]
        return {
            "component": self.component,
            "target": self.target,
            "bounds": bounds,
            "distinct_states": states,
            "distinct_snapshots": sum(r.distinct_snapshots for r in results),
            "edges": sum(r.edges for r in results),
            "max_depth": max((r.max_depth for r in results), default=0),
            "seconds": round(seconds, 3),
            "states_per_second": round(states / seconds) if seconds > 0 else 0,
            "edges_per_second": round(sum(r.edges for r in results) / seconds) if seconds else 0,
            "executed_calls": sum(r.executed_calls for r in results),
            "peak_memory_mb": max((round(r.peak_memory_mb, 1) for r in results), default=0.0),
            "workers": max((r.workers for r in results), default=1),
            "transferred_states": sum(r.transferred_states for r in results),
            "replayed_paths": sum(r.replayed_paths for r in results),
            "states_per_depth": [sum(col) for col in zip_longest(*depths, fillvalue=0)],
            "expanded_per_depth": [
                sum(col)
                for col in zip_longest(*(r.expanded_per_depth for r in results), fillvalue=0)
            ],
            "floor": _floor(results),
            "cpu_seconds": round(sum(r.cpu_seconds for r in results), 3),
            "parallel_efficiency": _efficiency(results),
            "max_memory_mb": results[0].max_memory_mb if results else None,
            "stopped_by": next((r.stopped_by for r in results if r.stopped_by), None),
            "complete": bool(results) and all(r.complete for r in results),
            "violations": violations,
            "coverage": self.coverage(),
            "runs": [
                {"variant": v or None, "configuration": c, **r.to_json()}
                for (v, r), c in zip(self.runs, self.configs, strict=True)
            ],
        }


def _floor(results: Sequence[ExploreResult]) -> dict[str, float]:
    """The floor of several searches together (see :func:`~proofs.explorer.search.floor`)."""
    return floor(sum(r.call_seconds for r in results), sum(r.cpu_seconds for r in results))


def _efficiency(results: Sequence[ExploreResult]) -> float | None:
    """The parallel efficiency of several searches on workers together, ``None`` in one
    process."""
    runs = [r for r in results if r.parallel_efficiency is not None]
    return efficiency(
        sum(sum(r.worker_cpu_seconds) for r in runs), sum(r.workers * r.seconds for r in runs)
    )


def run(
    component: str,
    model_cls: Callable[..., Any],
    bounds_cls: type,
    target_cls: Callable[..., Any],
    target: str,
    *,
    variants: Sequence[str],
    overrides: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    depth: int | None = None,
    max_states: int | None = 1_000_000,
    max_memory_mb: float | None = None,
    deadline: float | None = None,
    progress: Callable[[str, int, int, int], None] | None = None,
    save_dir: Path | None = None,
    inputs: str = "all",
    workers: int = 1,
    memo: bool = True,
    backend: Callable[[], Any] | None = None,
    reference: Any = None,
    scope: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Exploration:
    """Explore ``component`` against ``target_cls``: for each configuration of ``scope`` (see
    :func:`scopes`; ``None``: :func:`default_scope`; ``overrides`` win over its values, its
    values over ``defaults``), once per variant of ``variants``
    (``[""]`` for a component without variants), stopping after the first search that fails or
    at ``deadline``. Configurations that ``overrides`` make equal run once. The models are built
    (and their bounds validated) before the first search starts. ``workers``: processes per
    search, each search on a new ``backend()`` (default: forked local processes);
    ``memo=False``: run every edge (no remembered transitions)."""
    if scope is None:
        scope = default_scope(overrides)
    out = Exploration(
        component,
        target,
        scope=scope,
        planned=configurations(bounds_cls, scope, component=component),
        dimensions=dimensions(bounds_cls),
        operations=tuple(getattr(model_cls, "operations", ())),
    )
    models = [
        (name, v, model_cls(component, target_cls, target, bounds, options))
        for name, v, bounds in plan(
            bounds_cls, scope, variants, overrides or {}, component=component, defaults=defaults
        )
    ]
    for _, _, model in models:
        model.use_reference(reference)
    for name, v, model in models:
        report = None if progress is None else (lambda s, e, d, v=v: progress(v, s, e, d))
        result = explore(
            model,
            depth=depth,
            max_states=max_states,
            max_memory_mb=max_memory_mb,
            deadline=deadline,
            progress=report,
            save_dir=save_dir,
            inputs=inputs,
            workers=workers,
            memo=memo,
            backend=backend,
        )
        out.runs.append((v, result))
        out.configs.append(name)
        if not result.passed or (deadline is not None and time.perf_counter() > deadline):
            break
    return out
