"""What the commands share: the component, variant and flags named on a command line, the checker
flags every lockstep command takes, the reports of drawn option values and coverage."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from rich.markup import escape

from kvspec import components
from kvspec.components import Component
from kvspec.output import OUT, emit, print_counterexample, print_coverage

TARGET_HELP = (
    "impl (default), spec, mutant:NAME, MOD:CLASS, FILE.py:CLASS, an engine name (vllm, "
    "sglang, infinilm), ENGINE@SOURCE or a bare SOURCE: git:REPO[@REV], a wheel, a tree"
)


def component_names() -> str:
    return ", ".join(components.names())


def variants_help() -> str:
    return components.describe_variants()


def component_args(args: argparse.Namespace) -> tuple[Component, str | None, Mapping[str, Any]]:
    """The component named on the command line, its ``--variant`` and its flags."""
    comp = components.get(args.component)
    variant = comp.check_variant(getattr(args, "variant", None))
    return comp, variant, components.options_of(comp, vars(args))


def findings(comp: Any, result: Any, cx: dict[str, Any] | None, inputs: str) -> dict[str, Any]:
    """The part of a check or fuzz document that says what was found and covered."""
    return {
        "counterexample": cx,
        "scope": scope_of(comp, result, inputs),
        "coverage": result.coverage,
    }


def report(args: argparse.Namespace, document: dict[str, Any]) -> bool:
    """Emit a check or fuzz document; on the console, also the coverage (if asked), the
    counterexample and the drawn option values. ``True`` when ``--json`` (nothing more to say)."""
    emit(document, args.json)
    if args.json:
        return True
    print_details(args, document["coverage"], document["counterexample"])
    print_scope(document["scope"])
    return False


def print_details(
    args: argparse.Namespace, coverage: dict[str, int], cx: dict[str, Any] | None
) -> None:
    """What check and fuzz print before their verdict: coverage if asked, the counterexample."""
    if args.coverage:
        print_coverage(coverage)
    if cx:
        print_counterexample(cx)


def scope_of(comp: Any, result: Any, inputs: str) -> dict[str, Any]:
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


def add_checker_flags(p: argparse.ArgumentParser, what: str) -> None:
    """The components' checker options on ``p``: boolean flags (``--soundness``, …) and valued
    settings (``--request-module MOD``, …)."""
    for flag, text in components.all_flags().items():
        owners = ", ".join(components.with_flag(flag))
        p.add_argument(f"--{flag}", action="store_true", help=f"{owners}: {what}{text}")
    for name, text in components.all_settings().items():
        owners = ", ".join(c.name for c in components.all_components() if name in c.settings)
        p.add_argument(f"--{name.replace('_', '-')}", metavar="VALUE", help=f"{owners}: {text}")
