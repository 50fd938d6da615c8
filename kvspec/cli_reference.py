"""docs/cli.md, the command-line reference, generated from the argument parser itself.

``python -m kvspec.cli_reference`` prints it; ``--write`` rewrites docs/cli.md (a test fails when
the page and the parser disagree). Help text is rendered at a fixed width so the page does not
depend on the terminal it was made in.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvspec.cli import build_parser

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = "100"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the sub-commands on one private action
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render() -> str:
    """The page: the top-level help, then one section per command with its full help."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps at $COLUMNS
    try:
        parser = build_parser()
        parts = [
            "# Command-line reference\n\n",
            "Generated from kvspec's argument parser (`python -m kvspec.cli_reference --write`); "
            "`kvspec COMMAND --help` prints the same. The commands at a glance: "
            "[commands.md](commands.md).\n\n",
            "```text\n",
            parser.format_help(),
            "```\n",
        ]
        for name, sub in _subparsers(parser).items():
            parts += [f"\n## `kvspec {name}`\n\n", "```text\n", sub.format_help(), "```\n"]
        return "".join(parts)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--write"]:
        PAGE.write_text(text)
        return 0
    if args:
        print("usage: python -m kvspec.cli_reference [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
