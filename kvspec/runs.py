"""What the commands that run a checker share: the oracle (``--oracle`` / ``--baseline``), the
alphabet options (``--inputs``, ``--call-timeout``), and the counterexample of a failed run,
shrunk and saved. (A module of its own: ``cli``, ``exploration``, ``audit`` and ``diff`` all use
it, and none of them imports another.)"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.markup import escape

from kvspec.components import Component
from kvspec.output import ERR, TRACE_DIR, trace_path
from kvspec.targets import load_reference, load_target, resolve_variant


def setup(
    args: argparse.Namespace, comp: Component, variant: str | None
) -> tuple[str, Any, Any, str | None]:
    """(target label, target class, reference, variant) of a check, fuzz, explore or audit run:
    ``--target``, then ``--oracle`` / ``--baseline``, then the variant (an unknown engine version
    is refused against the spec, noted otherwise)."""
    label, cls = load_target(comp.name, args.target)
    reference = load_reference(comp.name, args.oracle, args.baseline, label)
    note = None if args.json else (lambda text: ERR.print(escape(text)))
    return label, cls, reference, resolve_variant(comp, variant, cls, reference, note)


def against(reference: Any) -> str:
    """How a verdict line names what the target was compared with."""
    return {"spec": "spec", "baseline": f"baseline {reference.label}"}.get(
        reference.kind, "its invariants"
    )


def oracle_fields(reference: Any) -> dict[str, Any]:
    """The JSON fields saying what the target was compared with."""
    return {
        "oracle": reference.kind,
        "baseline": reference.label if reference.kind == "baseline" else None,
    }


def save_trace(trace: dict[str, Any], component: str, target: str) -> Path:
    from stateful_tests.lockstep import save_trace

    return save_trace(trace, TRACE_DIR, trace_path(TRACE_DIR, f"{component}-{target[-80:]}"))


def counterexample(
    result: Any,
    comp: Component,
    cls: Any = None,
    shrink_seconds: float = 0.0,
    save: bool = True,
    options: Mapping[str, Any] | None = None,
    reference: Any = None,
) -> dict[str, Any] | None:
    """The failing trace, delta-debugged for ``shrink_seconds`` when a target class is given."""
    if result.failure is None:
        return None
    trace = result.trace
    if trace is not None and cls is not None and shrink_seconds > 0:
        trace = comp.shrink(
            trace,
            cls,
            result.target,
            budget_seconds=shrink_seconds,
            reference=reference,
            **(options or {}),
        )
    path = save_trace(trace, comp.name, result.target) if trace and save else None
    failure = (trace or {}).get("failure") or {}
    return {
        "check": failure.get("check", result.failure.check),
        "detail": failure.get("detail", result.failure.detail),
        "steps": trace["steps"] if trace else [],
        "trace_file": str(path) if path else None,
    }


def oracle_options(p: argparse.ArgumentParser, replay: bool = False) -> None:
    """``--baseline TARGET`` and ``--oracle spec|baseline|invariants``."""
    from stateful_tests.checker import ORACLES

    p.add_argument(
        "--baseline",
        metavar="TARGET",
        help="compare with this target instead of the spec (any --target form: the previous "
        "revision, another release, ENGINE@git:REPO@REV); implies --oracle baseline"
        + ("; default: the trace's own" if replay else ""),
    )
    p.add_argument(
        "--oracle",
        choices=ORACLES,
        help="spec: equal to the spec (default); baseline: equal to --baseline; invariants: only "
        "the component's invariants, for code no variant models"
        + ("; default: the trace's own" if replay else ""),
    )


def inputs_options(p: argparse.ArgumentParser, default: str | None) -> None:
    """``--inputs well-formed|all``: the alphabet (``None``: the trace's own), and the per-call
    watchdog ``--call-timeout``."""
    from stateful_tests.checker import CALL_TIMEOUT, INPUTS

    p.add_argument(
        "--call-timeout",
        type=float,
        default=CALL_TIMEOUT,
        metavar="S",
        help=f"a target call that does not return within S seconds is a hang (default "
        f"{CALL_TIMEOUT:g}; 0: no watchdog)",
    )

    p.add_argument(
        "--inputs",
        choices=INPUTS,
        default=default,
        help="well-formed: leave out the bad-input operations, for a target that does not share "
        "the spec's contract on bad input (kvspec audit reports that contract); default "
        + (default or "the trace's own"),
    )
