"""``kvspec``: the command line.

Exit status: 0 everything checked holds, 1 a check failed (counterexample printed and saved),
2 could not run (bad arguments, unknown component or target, missing optional dependency), said in
one line. Human tables go to stdout, progress to stderr; ``--json`` prints exactly one JSON
document. Components, their variants and flags, bench suites and planted bugs come from the
registry (:mod:`kvspec.components`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvspec.commands import ORDER
from kvspec.commands.common import add_checker_flags
from kvspec.components import ComponentError
from kvspec.output import UsageError, could_not_run
from kvspec.runs import inputs_options
from kvspec.targets import TargetError
from stateful_tests.lockstep import TargetMisfit


def build_parser() -> argparse.ArgumentParser:
    """Every sub-command: those of :mod:`kvspec.commands`, then the ones that register from their
    own module."""
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Executable specs, production implementations and checkers for KV-cache "
        "bookkeeping.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in ORDER:
        importlib.import_module(module).add_parser(sub)

    from kvspec import audit, exploration, figures, prove, soak

    soak.add_parser(sub, add_checker_flags, inputs_options)

    audit.add_parser(sub)
    prove.add_parser(sub)

    from kvspec import smoke

    smoke.add_parser(sub)

    from kvspec import crosshair

    crosshair.add_parser(sub)

    exploration.add_parser(sub)
    from kvspec import diff

    diff.add_parser(sub)
    figures.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (TargetError, TargetMisfit, UsageError, ComponentError) as exc:
        return could_not_run(exc)
    return code


if __name__ == "__main__":
    sys.exit(main())
