"""Run CrossHair's ``diffbehavior`` and ``check`` through its Python API and report JSON.

``python -m proofs.crosshair_runner diffbehavior|contract --budget N --per-path-timeout S QUALNAME…``

The verdicts of :mod:`proofs.crosshair_checks` come from CrossHair's own result objects — the
list of :class:`~crosshair.diff_behavior.BehaviorDiff` that ``diff_behavior`` returns, with its
path statistics, and the :class:`~crosshair.statespace.MessageType` of every
``AnalysisMessage`` that ``run_checkables`` yields — never from the text the ``crosshair``
command prints, whose wording may change between releases. The run happens in a subprocess of
its own (CrossHair patches the interpreter while it searches) under the same safeguards as the
command line: the audit wall that blocks side effects of the analysed code, and pure-Python
imports where a module has both.

One JSON document on stdout, then exit 0:

* diffbehavior — ``{"kind", "finding": "clean"|"found"|"inconclusive", "iterations",
  "exhausted", "nondeterministic", "diffs": [{"args", "first", "second"}], "error"}``;
* contract — ``{"kind", "messages": [{"state", "message", "file", "line", "function"}], "error"}``
  with ``state`` one of CrossHair's message types (``confirmed``, ``cannot_confirm``,
  ``pre_unsat``, ``post_err``, ``exec_err``, ``post_fail``, ``syntax_err``, ``import_err``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _options(budget: int, per_path_timeout: float, *, contract: bool) -> Any:
    from crosshair.options import DEFAULT_OPTIONS, AnalysisKind, AnalysisOptionSet

    chosen = AnalysisOptionSet(
        max_uninteresting_iterations=budget,
        per_path_timeout=per_path_timeout,
        analysis_kind=[AnalysisKind.PEP316] if contract else None,
    )
    return DEFAULT_OPTIONS.overlay(chosen), chosen


def _load_function(qualname: str) -> Any:
    from crosshair.fnutil import FunctionInfo, load_files_or_qualnames

    (obj,) = list(load_files_or_qualnames([qualname]))
    if not isinstance(obj, FunctionInfo) or obj.get_callable() is None:
        raise TypeError(f"{qualname} is not a function with a signature CrossHair can read")
    return obj


def diffbehavior(targets: Sequence[str], budget: int, per_path_timeout: float) -> dict[str, Any]:
    import crosshair.core_and_libs  # noqa: F401  (loads the opcode patches a search needs)
    from crosshair.diff_behavior import diff_behavior

    first, second = (_load_function(t) for t in targets)
    options, _ = _options(budget, per_path_timeout, contract=False)
    options.stats = collections.Counter()
    seen_nondeterminism: list[bool] = []
    diffs = diff_behavior(
        first, second, options, on_nondeterminism=lambda: seen_nondeterminism.append(True)
    )
    report: dict[str, Any] = {
        "kind": "diffbehavior",
        "iterations": options.stats["num_paths"],
        "exhausted": options.stats["exhaustion"] > 0,
        "nondeterministic": bool(seen_nondeterminism),
        "diffs": [],
        "error": None,
    }
    if isinstance(diffs, str):  # CrossHair's way of saying it could not compare the two
        report.update(finding="inconclusive", error=diffs)
        return report
    for diff in diffs:
        differing = diff.result1.get_differing_arg_mutations(diff.result2)
        report["diffs"].append(
            {
                "args": dict(diff.args),
                "first": diff.result1.describe(differing),
                "second": diff.result2.describe(differing),
            }
        )
    if seen_nondeterminism:
        report["finding"] = "inconclusive"
    else:
        report["finding"] = "found" if diffs else "clean"
    return report


def contract(targets: Sequence[str], budget: int, per_path_timeout: float) -> dict[str, Any]:
    from crosshair.core_and_libs import analyze_any, run_checkables
    from crosshair.fnutil import load_files_or_qualnames

    _, chosen = _options(budget, per_path_timeout, contract=True)
    entities = list(load_files_or_qualnames(list(targets)))
    checkables = [c for entity in entities for c in analyze_any(entity, chosen)]
    messages = [
        {
            "state": message.state.value,
            "message": message.message,
            "file": Path(message.filename).name,
            "line": message.line,
            "function": message.test_fn,
        }
        for message in run_checkables(checkables)
    ]
    return {"kind": "contract", "checkables": len(checkables), "messages": messages, "error": None}


def crosshair_internal() -> type[BaseException]:
    from crosshair.util import CrossHairInternal

    internal: type[BaseException] = CrossHairInternal
    return internal


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proofs.crosshair_runner")
    parser.add_argument("kind", choices=("diffbehavior", "contract"))
    parser.add_argument("--budget", type=int, required=True, help="max uninteresting iterations")
    parser.add_argument("--per-path-timeout", type=float, required=True)
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    if args.kind == "diffbehavior" and len(args.targets) != 2:
        parser.error("diffbehavior compares exactly two functions")

    from crosshair.auditwall import engage_auditwall
    from crosshair.pure_importer import prefer_pure_python_imports
    from crosshair.util import add_to_pypath

    run = diffbehavior if args.kind == "diffbehavior" else contract
    engage_auditwall()
    try:
        with add_to_pypath(""), prefer_pure_python_imports():
            report = run(args.targets, args.budget, args.per_path_timeout)
    # a broken check (import, signature, CrossHair's internal errors, which derive from
    # BaseException) is inconclusive, never a pass
    except (Exception, crosshair_internal()) as exc:
        report = {
            "kind": args.kind,
            "finding": "inconclusive",
            "error": f"{type(exc).__name__}: {exc}",
        }
    sys.stdout.write(json.dumps(report, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
