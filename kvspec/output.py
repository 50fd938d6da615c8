"""What every ``kvspec`` command prints: consoles, usage errors, the JSON document, progress.

Human tables go to stdout (:data:`OUT`), progress and notes to stderr (:data:`ERR`); with
``--json`` stdout carries exactly one JSON document (:func:`emit`). A :class:`UsageError` (bad
arguments) or a ``TargetError`` (a target that cannot be loaded) ends the command with exit
status 2 and one line on stderr.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

OUT = Console(highlight=False)
ERR = Console(stderr=True, highlight=False)
TRACE_DIR = Path(".kvspec/traces")


class UsageError(Exception):
    """Bad arguments: exit 2 with one line."""


def emit(document: dict[str, Any], as_json: bool, *, strict: bool = False) -> None:
    """Write ``document`` as the command's one JSON document (only with ``--json``); ``strict``:
    on one line, and a NaN or infinity is an error rather than invalid JSON."""
    if as_json and strict:
        sys.stdout.write(json.dumps(document, allow_nan=False) + "\n")
    elif as_json:
        sys.stdout.write(json.dumps(document, indent=1, default=str) + "\n")


def one_line(message: object) -> str:
    """``message`` on one line (rich would wrap a long reason onto several)."""
    return " ".join(str(message).split())


def could_not_run(reason: object) -> int:
    """Say why a command could not run, on one line of stderr; the exit status 2."""
    sys.stderr.write(f"kvspec: {one_line(reason)}\n")
    return 2


@contextmanager
def progress(description: str, total: int | None, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (only on a terminal); yields ``update(completed)``."""
    if not enabled or not ERR.is_terminal:
        yield lambda completed: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}"),
        TimeElapsedColumn(),
        console=ERR,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda completed: bar.update(task, completed=completed)


@contextmanager
def status_line(description: str, enabled: bool) -> Iterator[Callable[[str, str], None]]:
    """A live line on stderr for runs of unknown length; yields ``update(description, figures)``."""
    if not enabled or not ERR.is_terminal:
        yield lambda description, figures: None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[figures]}"),
        TimeElapsedColumn(),
        console=ERR,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None, figures="")
        yield lambda text, figures: bar.update(task, description=text, figures=figures)


@contextmanager
def live_bar(
    description: str, total: float | None, enabled: bool
) -> Iterator[Callable[[float, str], None]]:
    """A progress bar with a live figures column on stderr (only on a terminal), for runs whose
    throughput matters (kvspec soak); yields ``update(completed, figures)``."""
    if not enabled or not ERR.is_terminal:
        yield lambda completed, figures: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[figures]}"),
        TimeElapsedColumn(),
        console=ERR,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total, figures="")
        yield lambda completed, figures: bar.update(task, completed=completed, figures=figures)


def trace_path(directory: Path, stem: str) -> str:
    """A file stem under ``directory`` that no earlier trace uses (two failures in the same
    second must not overwrite each other)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in stem)
    stem = f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 0
    while (directory / f"{stem}{'-' + str(n) if n else ''}.json").exists():
        n += 1
    return f"{stem}{'-' + str(n) if n else ''}"


def _short(value: Any) -> str:
    """Compact argument text for step tables: hashes as their first 8 hex digits."""
    if isinstance(value, dict) and "bytes" in value:
        return "h:" + str(value["bytes"])[:8]
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return json.dumps(value)


def print_counterexample(cx: dict[str, Any]) -> None:
    """A counterexample as a numbered step table (step 0 when the target differs before any
    call), its verdict, and where its trace was saved."""
    table = Table(title=f"counterexample — {cx['check']}", show_lines=False)
    if not cx["steps"]:
        table.add_column("#")
        table.add_column("what")
        table.add_row("0", "construction: the new target's state differs from the new spec's")
    else:
        for column in ("#", "call", "spec", "target"):
            table.add_column(column, overflow="fold")
    for i, step in enumerate(cx["steps"], 1):
        args = ", ".join(_short(a) for a in step["args"])
        table.add_row(
            str(i), Text(f"{step['method']}({args})"), Text(step["spec"]), Text(step["target"])
        )
    OUT.print(table)
    OUT.print(Text.assemble((cx["check"], "bold red"), ": ", cx["detail"]))
    if cx.get("trace_file"):
        OUT.print(f"trace saved to {cx['trace_file']} (re-run: kvspec replay {cx['trace_file']})")


def print_coverage(coverage: dict[str, int]) -> None:
    table = Table(title="coverage (rules, calls, paths, exceptions)")
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in sorted(coverage):
        table.add_row(key, f"{coverage[key]:,}")
    OUT.print(table)


def replace_marked(
    text: str, start: str, end: str, block: str, *, where: object = "the text"
) -> str:
    """``text`` with everything from ``start`` to ``end`` (both kept) replaced by ``block``,
    inserted verbatim (a table's backslashes are not escapes). ``ValueError`` naming ``where`` if
    the markers are missing. What ``--update-readme`` uses (kvspec mutants, kvspec figures)."""
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"{where} has no {start} … {end} markers")
    replacement = f"{start}\n{block}\n{end}"
    return pattern.sub(lambda _match: replacement, text)
