"""``kvspec audit COMPONENT --target T``: every difference between a target and the spec, classified.

``check`` and ``fuzz`` stop at the first divergence; an audit does not. It spends its budget on
seeded fuzzing in two phases and keeps one finding per signature ``(operation, input class,
check)``:

* **conformance** — the well-formed alphabet only: a legal call on which target and spec differ.
  Any such finding makes the audit fail (exit 1).
* **robustness** — the well-formed alphabet plus one bad-input operation at a time, each in turn:
  what the target does on input the spec rejects (another exception kind, accepting it, changing
  state before failing, crashing half-way, hanging). Listed; they fail the audit only with
  ``--strict``.

Every finding is shrunk without changing its signature (the same failing operation, input class
and check), saved as a replayable trace under ``.kvspec/traces/`` and reported with how often it
was met.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from kvspec import components
from kvspec.components import Component
from kvspec.output import OUT, TRACE_DIR, UsageError, emit, progress, trace_path
from stateful_tests.checker import CALL_TIMEOUT, signature
from stateful_tests.lockstep import save_trace

CHUNK = 5_000  # fuzzed calls per seed before the next seed


@dataclass
class Finding:
    kind: str  # conformance | robustness
    operation: str
    input_class: str  # well-formed | bad-input
    check: str
    what: str
    steps: int
    trace: str | None
    count: int = 1
    detail: str = ""

    @property
    def signature(self) -> str:
        return f"{self.operation}/{self.input_class}/{self.check}"

    def to_json(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "kind": self.kind,
            "operation": self.operation,
            "input_class": self.input_class,
            "check": self.check,
            "what": self.what,
            "detail": self.detail,
            "steps": self.steps,
            "trace": self.trace,
            "count": self.count,
        }


def describe(document: dict[str, Any]) -> str:
    """What the target did at the failing call of a trace, in a few words."""
    failure = document.get("failure") or {}
    check = str(failure.get("check"))
    if not document["steps"]:
        return "differs before any call (construction)"
    last = document["steps"][-1]
    spec, target = str(last["spec"]), str(last["target"])
    spec_raised, target_raised = spec.startswith("raise "), target.startswith("raise ")
    if check == "hang":
        return "the call did not return (hang)"
    if check == "atomic_failure":
        return "changed state before failing"
    if check == "exception" and spec_raised and target_raised:
        return f"raised {_name(target)} where the spec raises {_name(spec)}"
    if check == "exception" and spec_raised:
        return f"accepted it (the spec raises {_name(spec)}); returned {target[:60]}"
    if check == "exception":
        return f"raised {_name(target)} on a call the spec accepts"
    if spec_raised and target_raised:
        return f"raised like the spec, but its state after the call differs ({check})"
    return f"{check}: {failure.get('detail', '')}"[:160]


def _name(outcome: str) -> str:
    """``raise KeyError(3)`` -> ``KeyError``."""
    return outcome.removeprefix("raise ").split("(", 1)[0]


@dataclass
class Audit:
    component: str
    target: str
    variant: str | None
    seconds: float = 0.0
    calls: int = 0
    findings: dict[str, Finding] = field(default_factory=dict)
    reference: Any = None  # what the target is compared with (None: the spec)

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings.values() if f.kind == kind]

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "target": self.target,
            "variant": self.variant,
            "oracle": "spec" if self.reference is None else self.reference.kind,
            "baseline": getattr(self.reference, "label", None)
            if getattr(self.reference, "kind", None) == "baseline"
            else None,
            "seconds": round(self.seconds, 2),
            "calls": self.calls,
            "conformance": [f.to_json() for f in self.by_kind("conformance")],
            "robustness": [f.to_json() for f in self.by_kind("robustness")],
        }


def run_audit(
    comp: Component,
    cls: Callable[..., Any],
    label: str,
    *,
    variant: str | None,
    budget: float,
    seed: int = 0,
    timeout: float | None = CALL_TIMEOUT,
    shrink_seconds: float = 5.0,
    report: Callable[[int], None] | None = None,
    save: bool = True,
    reference: Any = None,
) -> Audit:
    """Spend ``budget`` seconds, half on the conformance phase and half on the robustness phase
    (shared among the bad-input operations), one seed per chunk of fuzzed calls."""
    audit = Audit(comp.name, label, variant)
    audit.reference = reference
    table = comp.checker_def.operations
    legal = [op.name for op in table if not op.bad]
    phases: list[tuple[str, list[str]]] = [("conformance", legal)]
    phases += [("robustness", [*legal, op.name]) for op in table if op.bad]
    started = time.perf_counter()
    robust = [p for p in phases if p[0] == "robustness"]
    shares = [budget / 2] + [budget / 2 / len(robust)] * len(robust) if robust else [budget]
    next_seed = seed
    for (kind, rows), share in zip(phases, shares, strict=True):
        phase_end = time.perf_counter() + share
        while time.perf_counter() < phase_end:
            r = comp.fuzz(
                cls,
                label,
                CHUNK,
                next_seed,
                variant=variant,
                rows=rows,
                timeout=timeout,
                reference=reference,
            )
            next_seed += 1
            audit.calls += r.steps
            if report is not None:
                report(audit.calls)
            if r.passed or r.trace is None:
                continue
            _record(audit, comp, cls, label, kind, r.trace, shrink_seconds, save)
    audit.seconds = time.perf_counter() - started
    return audit


def _record(
    audit: Audit,
    comp: Component,
    cls: Callable[..., Any],
    label: str,
    phase: str,
    trace: dict[str, Any],
    shrink_seconds: float,
    save: bool,
) -> None:
    operation, input_class, check = signature(trace)
    key = f"{operation}/{input_class}/{check}"
    if key in audit.findings:
        audit.findings[key].count += 1
        return
    short = comp.shrink(
        trace,
        cls,
        label,
        budget_seconds=shrink_seconds,
        same_operation=True,
        reference=audit.reference,
    )
    path = None
    if save:
        stem = trace_path(TRACE_DIR, f"audit-{comp.name}-{operation}-{check}")
        path = str(save_trace(short, TRACE_DIR, stem))
    kind = "conformance" if input_class == "well-formed" else "robustness"
    audit.findings[key] = Finding(
        kind,
        operation,
        input_class,
        check,
        describe(short),
        len(short["steps"]),
        path,
        detail=str((short.get("failure") or {}).get("detail", ""))[:300],
    )


# ----------------------------------------------------------------------------- the command
def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="every difference between a target and the spec, classified (conformance / "
        "robustness), deduplicated, shrunk and saved",
    )
    p.add_argument("component", help=f"one of {', '.join(components.names())}")
    p.add_argument("--target", required=True, help="spec, mutant:NAME, MOD:CLASS or FILE.py:CLASS")
    p.add_argument("--variant", help=components.describe_variants())
    from kvspec.runs import oracle_options

    oracle_options(p)
    p.add_argument("--budget", type=float, default=60.0, help="seconds of fuzzing (default 60)")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument(
        "--strict", action="store_true", help="robustness findings fail the audit too (exit 1)"
    )
    p.add_argument(
        "--call-timeout",
        type=float,
        default=CALL_TIMEOUT,
        metavar="S",
        help=f"a call that does not return within S seconds is a hang (default {CALL_TIMEOUT:g})",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 1 on a conformance finding (or, with ``--strict``, any finding), else 0."""
    comp = components.get(args.component)
    variant = comp.check_variant(args.variant)
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
    from kvspec.runs import against, setup

    label, cls, reference, variant = setup(args, comp, variant)
    with progress(
        f"audit {comp.name} {label} vs {against(reference)}", None, not args.json
    ) as update:
        audit = run_audit(
            comp,
            cls,
            label,
            variant=variant,
            budget=args.budget,
            seed=args.seed,
            timeout=args.call_timeout,
            report=update,
            reference=reference,
        )
    emit(audit.to_json(), args.json)
    if not args.json:
        _print(audit)
    failed = audit.by_kind("conformance") or (args.strict and audit.findings)
    return 1 if failed else 0


def _print(audit: Audit) -> None:
    table = Table(title=f"audit {audit.component} vs {audit.target}")
    for column in ("kind", "operation", "input", "check", "what the target does", "steps", "seen"):
        table.add_column(column, overflow="fold")
    for f in sorted(audit.findings.values(), key=lambda f: (f.kind, f.operation)):
        table.add_row(
            f.kind, f.operation, f.input_class, f.check, f.what, str(f.steps), str(f.count)
        )
    OUT.print(table)
    for f in audit.findings.values():
        if f.trace:
            OUT.print(f"{f.signature}: kvspec replay {f.trace}")
    conformance, robustness = audit.by_kind("conformance"), audit.by_kind("robustness")
    verdict = "[red]does not conform[/]" if conformance else "[green]conforms[/]"
    OUT.print(
        f"audit {audit.component} vs {audit.target}: {verdict} on well-formed input "
        f"({len(conformance)} conformance, {len(robustness)} robustness findings; "
        f"{audit.calls:,} calls in {audit.seconds:.0f} s)"
    )
