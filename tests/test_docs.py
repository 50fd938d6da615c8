"""The documentation (issue 27): a README a newcomer can read, whose commands are real; a docs
site that builds strictly (no broken link or anchor, every page in the navigation); the
command-line reference generated from the parser, never stale."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec import cli_reference
from kvspec.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    """The ``kvspec …`` lines of the README's code blocks (a trailing ``# comment`` dropped)."""
    commands, fenced = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.startswith("kvspec "):
            commands.append(line.split("  #")[0].strip())
    return commands


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_every_readme_command_is_one_the_cli_takes() -> None:
    commands = readme_commands()
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:  # argparse's way of rejecting a command line
            pytest.fail(f"the README's {command!r} does not parse (exit {exc.code})")


def test_the_readme_links_to_pages_that_exist() -> None:
    targets = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert targets and [t for t in targets if not (ROOT / t).is_file()] == []


def test_the_cli_reference_is_the_parsers() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference.render(), (
        "docs/cli.md is stale: python -m kvspec.cli_reference --write"
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    pytest.importorskip("material")
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "docs", tree / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tree)
    page = tree / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tree, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr
